"""The one map from a backend call's exception to the harness's status words."""
import warnings

import torch

from attnbench.failures import OOM_REASON_CHARS, classify, first_line


def test_sdpa_refusal_is_unsupported_with_its_reasons():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("Flash attention kernel not used because:\nfp32 inputs")
        status, reason = classify(RuntimeError("No available kernel. Aborting execution."), caught)
    assert status == "unsupported"
    assert reason == "RuntimeError: No available kernel. Aborting execution. | Flash attention kernel not used because: fp32 inputs"


def test_other_failures():
    assert classify(NotImplementedError("no paged KV")) == ("unsupported", "NotImplementedError: no paged KV")
    status, reason = classify(torch.OutOfMemoryError("CUDA out of memory. " + "x" * 1000))
    assert status == "oom" and len(reason) == OOM_REASON_CHARS
    assert classify(ValueError("bad\nshape")) == ("error", "ValueError: bad shape")


def test_first_line_keeps_the_type_and_the_first_line_only():
    assert first_line(RuntimeError("torchao 0.18 needs a nightly\n  traceback ...")) == "RuntimeError: torchao 0.18 needs a nightly"
    assert first_line(KeyError()) == "KeyError: "
