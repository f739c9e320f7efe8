"""Ragged batches, chunks against cached prefixes, fragmented paged decode and variants on each installed GPU
backend, against the fp64 reference on the timed path (CUDA only).

Each (backend, case) either runs within the 2x gate or is refused cleanly (``supports()`` or an
``unsupported`` error), and what a backend is documented to run natively must run. FlashInfer compiles
each kernel variant for about a minute on first use: its variant cases are opt-in (ATTNBENCH_SLOW_JIT=1).
"""
import os

import pytest

from attnbench.bench.numerics import check_built
from attnbench.failures import classify
from attnbench.kernels import get_backend, safe_available
from attnbench.workloads.grid import expand_grid

pytestmark = pytest.mark.gpu

SHAPE = {"layout": "gqa", "heads_q": 16, "gqa_group": 4, "head_dim": 128, "dtype": "bf16"}
CASES = {
    "ragged": {**SHAPE, "mode": "fwd", "causal": True,
               "workload": {"trace": "azure-conv", "token_budget": 8192, "max_len": 4096, "batches": 1}},
    "chunked": {**SHAPE, "mode": "fwd", "causal": True,
                "workload": {"trace": "azure-code", "token_budget": 4096, "chunk": 1024, "batches": 2}},
    "mha-ragged": {**SHAPE, "layout": "mha", "mode": "fwd", "causal": True,  # what nested SDPA takes
                   "workload": {"trace": "azure-conv", "token_budget": 8192, "max_len": 4096, "batches": 1}},
    "decode": {**SHAPE, "mode": "decode", "workload": {"trace": "azure-conv", "requests": 16, "batches": 1}},
    "decode-paged": {**SHAPE, "mode": "decode", "page_size": 16,
                     "workload": {"trace": "azure-conv", "requests": 16, "batches": 1}},
    "decode-mla-paged": {"layout": "mla", "heads_q": 16, "dtype": "bf16", "mode": "decode", "page_size": 16,
                         "workload": {"trace": "azure-conv", "requests": 16, "batches": 1}},
}
for variant, extra in (("sliding_window", {"window": 256}), ("softcap", {"softcap": 30}), ("alibi", {}),
                       ("document", {"doc_len": 300}), ("prefix_lm", {"prefix_len": 300})):
    CASES[variant] = {**SHAPE, "mode": "fwd", "batch": 2, "seq": 1000, "causal": True, "variant": variant, **extra}

# what each backend must run (docs/workloads.md); everything else may be refused with a reason
NATIVE = {
    "fa4": {"ragged", "chunked", "mha-ragged", "decode", "decode-paged", "sliding_window", "softcap", "document"},
    "flashinfer": {"ragged", "chunked", "mha-ragged", "decode", "decode-paged"},
    "flashinfer-mla": {"decode-mla-paged"},
    "flex": {"ragged", "chunked", "mha-ragged", "decode", "sliding_window", "softcap", "alibi", "document",
             "prefix_lm"},
    "sdpa-flash": {"mha-ragged"},
    "sdpa-padded": {"ragged", "chunked", "mha-ragged", "decode", "sliding_window", "alibi", "document",
                    "prefix_lm"},
    "triton": {"ragged", "chunked", "mha-ragged", "decode", "document"},
}
if os.environ.get("ATTNBENCH_SLOW_JIT"):
    NATIVE["flashinfer"] |= {"sliding_window", "softcap", "alibi", "document", "prefix_lm"}
MATRIX = [(b, c) for b in NATIVE for c in CASES if c in NATIVE[b] or b not in ("flashinfer", "flashinfer-mla")]


@pytest.mark.parametrize("name, kind", MATRIX)
def test_workload_case_on_the_gpu(name, kind):
    backend = get_backend(name)
    ok, reason = safe_available(backend)
    if not ok:
        pytest.skip(f"{name}: {reason}")
    case = expand_grid(CASES[kind])[-1]
    ok, reason = backend.supports(case)
    if ok:
        try:
            result = check_built(case, backend, "cuda", seed=1)
        except Exception as err:
            status, reason = classify(err)
            assert status == "unsupported", f"{name} {kind}: {reason}"
            ok = False
    if kind in NATIVE[name]:
        assert ok, f"{name} {kind}: {reason}"
    if ok:
        assert result.worst_ratio_vs_eager() <= 2.0 and result.out.rel_err < 2e-2
