"""Each installed GPU adapter against the fp64 reference, and the kernels it runs named for it (CUDA only)."""
import os
import re

import pytest
import torch

from attnbench.case import Case
from attnbench.bench.inputs import make_tensors
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.bench.numerics import check_numerics
from attnbench.bench.provenance import kernel_names
from attnbench.kernels import get_backend, safe_available

pytestmark = pytest.mark.gpu

# Patterns of the other fused backends, which an adapter's kernels must not match (a mislabel).
OTHERS = {"sdpa-flash": r"pytorch_flash", "sdpa-cudnn": r"cudnn", "sdpa-efficient": r"fmha_cutlass|PyTorchMemEffAttention"}


def need(name):
    ok, reason = safe_available(get_backend(name))
    if not ok:
        pytest.skip(f"{name}: {reason}")
    return get_backend(name)


def case(**kw):
    base = dict(mode="fwd", layout="gqa", batch=2, heads_q=16, heads_kv=4, head_dim_qk=128, head_dim_v=128,
                seq_q=1000, seq_kv=1000, causal=True, dtype="bf16")  # 1000: not a multiple of any tile
    base.update(kw)
    return Case(**base)


CASES = {
    "fwd": case(),
    "fwd-b1-mqa": case(batch=1, layout="mqa", heads_kv=1, seq_q=700, seq_kv=1500),
    "fwd-fp16-d64": case(dtype="fp16", head_dim_qk=64, head_dim_v=64, causal=False),
    "fwd_bwd": case(mode="fwd_bwd", seq_q=512, seq_kv=512),
    "decode": case(mode="decode", batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=3001, causal=False),
    "decode-paged-32": case(mode="decode", batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=3001, causal=False,
                            page_size=32),
    "decode-mqa-tensor-cores": case(mode="decode", batch=4, heads_q=32, heads_kv=1, layout="mqa", seq_q=1,
                                    seq_kv=2048, causal=False, page_size=16),
    # absorbed MLA decode, DeepSeek-V2 dims (d_c 512 + d_h^R 64), 16 heads; page 1 as in FlashInfer's MLA example
    "decode-mla": case(mode="decode", layout="mla", batch=8, heads_q=16, heads_kv=1, head_dim_qk=576, head_dim_v=512,
                       seq_q=1, seq_kv=3001, causal=False),
    "decode-mla-paged-1": case(mode="decode", layout="mla", batch=8, heads_q=16, heads_kv=1, head_dim_qk=576,
                               head_dim_v=512, seq_q=1, seq_kv=3001, causal=False, page_size=1),
}
MATRIX = [(b, c) for b in ("fa2", "fa3", "fa4") for c in ("fwd", "fwd-b1-mqa", "fwd-fp16-d64", "fwd_bwd", "decode")]
# FlashInfer JIT-compiles each variant for about a minute: the variants scripts/h200_backends.py uses (bf16,
# head dim 128; single and ragged prefill; CUDA-core decode) plus one tensor-core decode, opt-in by env.
MATRIX += [("flashinfer", c) for c in ("fwd", "fwd-b1-mqa", "decode", "decode-paged-32")]
# one MLA JIT variant for both: the page size is a plan() argument, not part of the compiled module
MATRIX += [("flashinfer-mla", c) for c in ("decode-mla", "decode-mla-paged-1")]
if os.environ.get("ATTNBENCH_SLOW_JIT"):
    MATRIX += [("flashinfer", "decode-mqa-tensor-cores"), ("flashinfer", "fwd-fp16-d64")]
FP8 = [("fa3-fp8", "fwd"), ("flashinfer-fp8kv", "decode"), ("flashinfer-fp8kv", "decode-paged-32")]


def _attend(backend, c):
    paged = {"page_size": c.page_size} if c.page_size else {}
    return lambda q, k, v: backend.attention(q, k, v, causal=c.causal, scale=c.scale, **paged)


@pytest.mark.parametrize("name, key", MATRIX)
def test_adapter_matches_fp64_within_twice_eager_error(name, key):
    backend, c = need(name), CASES[key]
    ok, reason = backend.supports(c)
    if not ok:
        pytest.skip(reason)
    result = check_numerics(c, _attend(backend, c), "cuda", seed=3)
    assert 0 < result.out.rel_err < 2e-2
    assert result.worst_ratio_vs_eager() <= 2.0


@pytest.mark.parametrize("name, key", FP8)
def test_fp8_adapter_error_is_finite_and_fp8_sized(name, key):
    backend, c = need(name), CASES[key]
    result = check_numerics(c, _attend(backend, c), "cuda", seed=4)
    assert 1e-3 < result.out.rel_err < 0.1  # e4m3 carries 3 mantissa bits: errors well above bf16's


@pytest.mark.parametrize("name, key", [("fa4", "fwd"), ("fa4", "fwd_bwd"), ("flashinfer", "fwd"),
                                       ("flashinfer", "fwd-b1-mqa"), ("flashinfer", "decode"),
                                       ("flashinfer-fp8kv", "decode"), ("flashinfer-mla", "decode-mla"),
                                       ("fa3", "fwd"), ("fa2", "fwd")])
def test_kernels_that_ran_are_the_backends_own(name, key):
    backend, c = need(name), CASES[key]
    fn = backend.build(c, make_tensors(c, "cuda", seed=0))
    names = kernel_names(fn, "cuda")
    assert backend.kernels_match(names), names
    for other, pattern in OTHERS.items():
        assert not any(re.search(pattern, n) for n in names), f"{name} ran {other}'s kernels: {names}"


@pytest.mark.parametrize("name, key", [("flashinfer", "fwd"), ("flashinfer", "decode"), ("fa4", "fwd")])
def test_microbench_row_separates_compile_time_from_kernel_time(name, key):
    need(name)
    c = CASES[key]
    row = run_group([c], [name], RunOptions(device="cuda", warmup_ms=10, rep_ms=20), log=lambda s: None)[0]
    assert row["status"] == "ok", row["reason"]
    assert row["setup_s"] > row["ms_median"] / 1e3  # build + first call (JIT) is not in the kernel time
    assert row["kernels"] and row["n_reps"] >= 10
    torch.cuda.empty_cache()
