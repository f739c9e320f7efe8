"""The Triton FlashAttention kernels (backends ``triton``, ``triton-fp8``) against the fp64 reference.

Without CUDA the kernels run on CPU tensors in Triton's interpreter. Triton
decides at decoration time whether a ``@triton.jit`` function (its own
``tl.zeros``, ``tl.sum``, ... included) is interpreted, so ``TRITON_INTERPRET=1``
must be set before the first ``import triton`` of the process: tests/conftest.py
sets it for the session on a CPU-only host, and the fixture checks that it
took effect. The interpreter computes ``tl.dot`` on
bfloat16 bit patterns (a documented limitation, triton-lang/triton#11584), so
on CPU the small cases run in fp16 and the bf16 ones are left to the GPU.
Shapes are small and off the tile grid (67 rows against 32/16-row tiles,
seq_q < seq_kv with a bottom-right mask). The ``gpu`` tests run the same
checks at full size on CUDA.
"""
import copy
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from attnbench.case import Case
from attnbench.bench.numerics import check_numerics
from attnbench.kernels import get_backend

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
SMALL_DTYPE = "bf16" if ON_GPU else "fp16"
FP8_ROWS = 128 if ON_GPU else 32  # rows per fp8 scale: GPU tiles are 64-128 rows, the interpreter's 16-32


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """The launchers; on a CPU-only host, with Triton and the kernels in interpreter mode."""
    import triton.language as tl

    from attnbench.kernels.triton import launch, tuning

    interpreted = type(tl.zeros).__name__ == "InterpretedFunction"
    assert tuning.INTERPRET == interpreted != ON_GPU, (
        "Triton was imported before TRITON_INTERPRET=1 was set; run TRITON_INTERPRET=1 pytest tests/test_triton.py")
    return launch


def small(**kw):
    base = dict(mode="fwd", layout="gqa", batch=2, heads_q=4, heads_kv=2, head_dim_qk=32, head_dim_v=32,
                seq_q=67, seq_kv=67, causal=True, dtype=SMALL_DTYPE)
    base.update(kw)
    return Case(**base)


def numerics(case, name="triton", seed=0, dq_mode=None):
    backend = get_backend(name)
    if dq_mode is not None:  # the backward's dQ path pinned ("atomic", "separate") instead of timed per shape
        backend = copy.copy(backend)
        backend.dq_mode = dq_mode
    ok, reason = backend.supports(case)
    assert ok, reason
    return check_numerics(case, lambda q, k, v: backend.attention(q, k, v, causal=case.causal, scale=case.scale),
                          DEVICE, seed)


@pytest.mark.parametrize("case", [
    small(causal=False),
    small(causal=True),
    small(mode="decode", seq_q=1, seq_kv=40),  # one query row sees every key
    small(layout="mqa", heads_kv=1, head_dim_qk=64, head_dim_v=64, seq_q=40, seq_kv=50),
], ids=["full", "causal", "decode", "mqa-d64"])
def test_forward_matches_fp64(case):
    result = numerics(case)
    assert 0 < result.out.rel_err < 3e-3
    assert result.worst_ratio_vs_eager() <= 2.0


@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("case", [
    small(mode="fwd_bwd", seq_q=33, seq_kv=50),  # causal, bottom-right, GQA groups of 2
    small(mode="fwd_bwd", layout="mqa", heads_kv=1, causal=False),
    small(mode="fwd_bwd", batch=1, head_dim_qk=64, head_dim_v=64, seq_q=45, seq_kv=45),  # causal, square
], ids=["gqa-causal", "mqa", "gqa-causal-d64"])
def test_backward_matches_fp64(case, dq_mode):
    result = numerics(case, seed=1, dq_mode=dq_mode)
    assert all(0 < e.rel_err < 3e-3 for e in (result.out, *result.grads))
    assert result.worst_ratio_vs_eager() <= 2.0


def test_separate_dq_is_deterministic_and_matches_atomic(kernels):
    """The separate path writes dQ once per row (bitwise repeatable); both paths give the same gradients."""
    gen = torch.Generator().manual_seed(8)
    q, do = (torch.randn(1, 4, 37, 32, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    k, v = (torch.randn(1, 2, 45, 32, generator=gen).to(DEVICE, torch.float16) for _ in range(2))
    out, lse = kernels.forward(q, k, v, causal=True, scale=0.2)
    grads = {mode: kernels.backward(do, q, k, v, out, lse, causal=True, scale=0.2, dq_mode=mode)
             for mode in ("atomic", "separate")}
    again = kernels.backward(do, q, k, v, out, lse, causal=True, scale=0.2, dq_mode="separate")
    assert all(torch.equal(a, b) for a, b in zip(grads["separate"], again))
    for a, b in zip(grads["separate"], grads["atomic"]):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match=r"dq_mode='fused' is not allowed; allowed: atomic, separate"):
        kernels.backward(do, q, k, v, out, lse, causal=True, scale=0.2, dq_mode="fused")


def test_gqa_equals_mha_with_repeated_heads(kernels):
    gen = torch.Generator().manual_seed(3)
    dtype = torch.float16
    q = torch.randn(1, 4, 37, 32, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(1, 2, 45, 32, generator=gen).to(DEVICE, dtype) for _ in range(2))
    out, lse = kernels.forward(q, k, v, causal=True, scale=0.2)
    rep, rep_lse = kernels.forward(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal=True, scale=0.2)
    torch.testing.assert_close(out, rep)
    torch.testing.assert_close(lse, rep_lse)
    scores = (q.double() @ k.repeat_interleave(2, 1).double().transpose(-1, -2)) * 0.2
    hidden = torch.ones(37, 45, dtype=torch.bool, device=DEVICE).triu(45 - 37 + 1)
    ref_lse = torch.logsumexp(scores.masked_fill(hidden, float("-inf")), -1)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


def test_tma_load_path_matches_pointer_path(kernels):
    """The descriptor (TMA) path runs in the interpreter too; on sm_90 the autotuner picks between the two."""
    import triton

    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 67, 32, generator=gen).to(DEVICE, torch.float16) for _ in range(3))
    for tma in (False, True):
        cfg = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "USE_TMA": tma}, num_warps=4, num_stages=1)
        out, lse = kernels.forward(q, k, v, causal=True, scale=0.17, config=cfg)
        if not tma:
            ref, ref_lse = out, lse
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s_q, s_kv, causal", [(67, 67, True), (150, 131, False), (20, 70, True)],
                         ids=["causal", "full", "causal-prefix"])
def test_wide_query_tiles_match_fp64(kernels, s_q, s_kv, causal):
    """A query tile eight key tiles tall (its causal diagonal spans eight masked key tiles), GQA, against fp64."""
    import triton

    gen = torch.Generator().manual_seed(11)
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    q = torch.randn(1, 4, s_q, 32, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(1, 2, s_kv, 32, generator=gen).to(DEVICE, dtype) for _ in range(2))
    cfg = triton.Config({"BLOCK_M": 128, "BLOCK_N": 16, "USE_TMA": False, "PIPELINE_QK": False}, num_warps=4,
                        num_stages=1)
    out, lse = kernels.forward(q, k, v, causal=causal, scale=0.2, config=cfg)
    ref, ref_lse = _reference(q, k, v, causal, 0.2)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 3e-3
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


def _reference(q, k, v, causal, scale):
    """fp64 attention with K/V heads repeated over their query-head group and a bottom-right causal mask."""
    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, 1) for x in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        s_q, s_kv = scores.shape[-2:]
        hidden = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).triu(s_kv - s_q + 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


@pytest.mark.parametrize("s_q, s_kv, d, causal, tma", [
    (67, 67, 32, True, False),  # 5 key tiles: prologue, loop, epilogue; the diagonal tiles masked
    (67, 67, 32, False, True),  # a partial last tile (the masked range has one tile: no loop)
    (33, 50, 64, True, False),  # bottom-right causal, seq_q < seq_kv
    (5, 16, 32, True, True),  # one key tile in all: prologue and epilogue only
    (40, 100, 128, False, False),
], ids=["causal", "full-tma", "causal-prefix-d64", "one-tile-tma", "full-d128"])
def test_pipelined_qk_matches_fp64(kernels, s_q, s_kv, d, causal, tma):
    """The forward with Q K^T one tile ahead of the softmax (PIPELINE_QK), GQA groups of 2, against fp64."""
    import triton

    if tma and ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    gen = torch.Generator().manual_seed(9)
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    q = torch.randn(2, 4, s_q, d, generator=gen).to(DEVICE, dtype)
    k, v = (torch.randn(2, 2, s_kv, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
    scale = d ** -0.5
    cfg = triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "USE_TMA": tma, "PIPELINE_QK": True}, num_warps=4,
                        num_stages=1)
    out, lse = kernels.forward(q, k, v, causal=causal, scale=scale, config=cfg)
    ref, ref_lse = _reference(q, k, v, causal, scale)
    plain, _ = kernels.forward(q, k, v, causal=causal, scale=scale, config=triton.Config(
        dict(cfg.kwargs, PIPELINE_QK=False), num_warps=4, num_stages=1))
    err, plain_err = (((x.double() - ref).norm() / ref.norm()).item() for x in (out, plain))
    assert 0 < err < 3e-3 and err <= 1.05 * plain_err  # the same arithmetic in another order of issue
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


def test_bad_inputs_name_the_field(kernels):
    q = torch.zeros(1, 2, 8, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"dtype=torch.float32.* is not allowed; allowed: one of torch.float16"):
        kernels.forward(q, q, q, causal=False, scale=1.0)
    h = torch.zeros(1, 2, 8, 48, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"head_dim=48/48/48 is not allowed; allowed: .*32, 64, 128"):
        kernels.forward(h, h, h, causal=False, scale=1.0)


# --- FP8 ---------------------------------------------------------------------------------------------------------

def test_block_quantisation_scales_and_shares():
    from attnbench.kernels.triton.fp8 import E4M3_MAX, quantize_blockwise

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 70, 32, generator=gen)
    x[0, 0, 40, 0] = 1e4  # an outlier: its 32-row block's scale grows, its small values underflow
    q8, stats = quantize_blockwise(x, 32)
    amax = torch.stack([x[:, :, i:i + 32].abs().amax(dim=(-2, -1)) for i in (0, 32, 64)], dim=-1)
    torch.testing.assert_close(q8.scale, amax / E4M3_MAX)
    assert stats.overflow == 0 and stats.elements == x.numel()
    assert 0 < stats.underflow_share < 0.01  # only inside the outlier's block
    err = (q8.dequantize() - x).abs() / x.abs().clamp_min(1e-30)
    normal = x.abs() >= 2.0 ** -6 * q8.scale[:, :, torch.arange(70) // 32, None]  # above e4m3's subnormals
    assert err[normal].max() <= 2.0 ** -4 + 1e-6  # round to nearest: half of the 3-bit mantissa step
    v8, _ = quantize_blockwise(x, 32, transpose=True)
    assert v8.data.stride()[2:] == (1, 80)  # sequence contiguous, padded to 16 positions
    assert torch.equal(v8.data.float(), q8.data.float())


def _fp8_inputs(seed, s_q=67, s_kv=67, heads_kv=2, d=32, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, s_q, d, generator=gen)
    k = torch.randn(2, heads_kv, s_kv, d, generator=gen)
    v = torch.randn(2, heads_kv, s_kv, d, generator=gen)
    v *= 1 + 7 * (torch.arange(s_kv) // FP8_ROWS % 2)[:, None]  # V scales alternate: the accumulator rescales
    return (t.to(device, torch.float16) for t in (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_error_is_that_of_e4m3(kernels, causal):
    from attnbench.kernels.eager import eager_attention
    from attnbench.kernels.triton.fp8 import quantize_qkv

    q, k, v = _fp8_inputs(6)
    (q8, k8, v8), stats = quantize_qkv(q, k, v, FP8_ROWS)
    scale = 32 ** -0.5
    out, lse = kernels.fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=torch.float16)
    ref = eager_attention(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    emulated = eager_attention(q8.dequantize().double(), k8.dequantize().double(), v8.dequantize().double(),
                               causal=causal, scale=scale)  # e4m3 inputs, exact arithmetic

    def rel(x):
        return ((x.double() - ref).norm() / ref.norm()).item()

    # quantising P as well costs a little more; the interpreter's fp8 cast truncates instead of rounding
    assert rel(emulated) < rel(out) < 2.0 * rel(emulated) < 0.15
    assert stats.overflow_share == 0
    ref_lse = torch.logsumexp(q8.dequantize().double() @ k8.dequantize().double().repeat_interleave(2, 1)
                              .transpose(-1, -2) * scale + (torch.ones(67, 67, device=DEVICE).triu(1) * -1e30
                                                            if causal else 0), -1)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-3, atol=1e-3)


def test_fp8_tma_path_matches_pointer_path(kernels):
    import triton

    from attnbench.kernels.triton.fp8 import quantize_qkv

    if ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("fp8 and TMA need sm_90")
    (q8, k8, v8), _ = quantize_qkv(*_fp8_inputs(7), 32)
    outs = []
    for tma in (False, True):  # fp8 wgmma needs a reduction of 32: 32-key tiles
        cfg = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "USE_TMA": tma}, num_warps=4, num_stages=1)
        outs.append(kernels.fp8_forward(q8, k8, v8, causal=True, scale=0.2, out_dtype=torch.float16, config=cfg)[0])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-3, atol=1e-3)


def test_fp8_backend_runs_through_the_harness():
    case = small(dtype="fp16")
    result = numerics(case, "triton-fp8", seed=2)
    assert 0 < result.out.rel_err < 0.15


# --- registry ------------------------------------------------------------------------------------------------------

def test_backends_say_what_they_do_not_support():
    fp8, tri = get_backend("triton-fp8"), get_backend("triton")
    assert tri.family == "fused" and fp8.compute_dtype == "fp8"
    ok, reason = fp8.supports(small(mode="fwd_bwd"))
    assert not ok and "forward" in reason
    ok, reason = tri.supports(small(dtype="fp32"))
    assert not ok and "fp32" in reason
    ok, reason = tri.supports(Case(mode="decode", layout="mla", batch=1, heads_q=8, heads_kv=1, head_dim_qk=576,
                                   head_dim_v=512, seq_q=1, seq_kv=64, causal=False, dtype="fp16"))
    assert not ok and "576/512" in reason
    ok, reason = tri.supports(small(dtype="bf16"))
    assert ok == ON_GPU and (ok or "interpreter" in reason)
    assert tri.kernels_match(["_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd"])
    assert not tri.kernels_match(["flash_fwd_kernel"])


def test_registry_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"
            "from attnbench.kernels import get_backend, safe_available\n"
            "for name in ('triton', 'triton-fp8'):\n"
            "    ok, reason = safe_available(get_backend(name))\n"
            "    assert not ok and 'pip install triton' in reason, reason\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_sass_opcode_counts():
    from attnbench.kernels.triton.sass import opcode_counts

    sass = ("--:-:-:-:1\tHGMMA.64x64x16.F32.BF16 R88, gdesc[UR56], RZ, !UPT;\n"
            "--:-:-:-:4\t@!P1 HGMMA.64x64x16.F32.BF16 R88, gdesc[UR28], R88;\n"
            "--:-:-:-:2\tMUFU.EX2 R3, R4;\n"
            ".L_x_12:\n")
    assert opcode_counts(sass) == {"HGMMA": 2, "MUFU": 1}


# --- full size on a GPU ---------------------------------------------------------------------------------------------

def full(**kw):
    base = dict(mode="fwd", layout="gqa", batch=2, heads_q=16, heads_kv=4, head_dim_qk=128, head_dim_v=128,
                seq_q=2000, seq_kv=2000, causal=True, dtype="bf16")  # 2000: not a multiple of any tile
    base.update(kw)
    return Case(**base)


@pytest.mark.gpu
@pytest.mark.parametrize("dq_mode", ["atomic", "separate"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_full_size_matches_fp64(dtype, head_dim, causal, dq_mode):
    case = full(dtype=dtype, head_dim_qk=head_dim, head_dim_v=head_dim, causal=causal, mode="fwd_bwd")
    result = numerics(case, seed=10, dq_mode=dq_mode)
    assert result.worst_ratio_vs_eager() <= 2.0
    assert all(0 < e.rel_err < 2e-2 for e in (result.out, *result.grads))


@pytest.mark.gpu
def test_full_size_decode_and_prefix():
    for case in (full(mode="decode", seq_q=1, seq_kv=4099), full(seq_q=1000, seq_kv=4099)):
        assert numerics(case, seed=11).worst_ratio_vs_eager() <= 2.0


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_full_size_fp8_error_is_that_of_e4m3(kernels, causal):
    from attnbench.kernels.eager import eager_attention
    from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv

    q, k, v = _fp8_inputs(12, s_q=1500, s_kv=1500, d=128, device="cuda")
    (q8, k8, v8), stats = quantize_qkv(q, k, v, BLOCK_ROWS)
    scale = 128 ** -0.5
    out, _ = kernels.fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=torch.bfloat16)
    ref = eager_attention(q.double(), k.double(), v.double(), causal=causal, scale=scale)
    emulated = eager_attention(q8.dequantize().double(), k8.dequantize().double(), v8.dequantize().double(),
                               causal=causal, scale=scale)

    def rel(x):
        return ((x.double() - ref).norm() / ref.norm()).item()

    assert rel(emulated) < rel(out) < 1.5 * rel(emulated)
    assert stats.overflow_share == 0


@pytest.mark.gpu
def test_profiled_kernels_are_the_triton_ones():
    from attnbench.bench.inputs import make_tensors
    from attnbench.bench.provenance import kernel_names

    case = full(mode="fwd_bwd", seq_q=1024, seq_kv=1024)
    backend = get_backend("triton")
    names = kernel_names(backend.build(case, make_tensors(case, "cuda", seed=0)), "cuda")
    assert backend.kernels_match(names) and any("_attn_bwd" in n for n in names), names


def test_kernels_compile_for_hopper_with_wgmma():
    """The GPU code path, which the interpreter does not compile: sm_90 SASS from Triton's own ptxas, no GPU needed."""
    code = ("import json, triton\n"
            "from attnbench.kernels.triton import aot\n"
            "cfg = triton.Config\n"
            "rows = [aot.compile_row('fwd', 64, cfg({'BLOCK_M': 128, 'BLOCK_N': 64, 'USE_TMA': True}, num_warps=8,"
            " num_stages=2)),\n"
            "        aot.compile_row('bwd', 64, cfg({'BLOCK_M': 64, 'BLOCK_N': 64}, num_warps=4, num_stages=2)),\n"
            "        aot.compile_row('dkdv', 64, cfg({'BLOCK_M': 64, 'BLOCK_N': 64}, num_warps=4, num_stages=2)),\n"
            "        aot.compile_row('dq', 64, cfg({'BLOCK_M': 64, 'BLOCK_N': 64}, num_warps=4, num_stages=2)),\n"
            "        aot.compile_row('fwd', 64, cfg({'BLOCK_M': 128, 'BLOCK_N': 64, 'USE_TMA': True,"
            " 'PIPELINE_QK': True}, num_warps=8, num_stages=3)),\n"
            "        aot.compile_row('fp8', 64, cfg({'BLOCK_M': 128, 'BLOCK_N': 64, 'USE_TMA': False}, num_warps=8,"
            " num_stages=2))]\n"
            "for row in rows: print(json.dumps(row))\n")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    fwd, bwd, dkdv, dq, pipelined, fp8 = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert fwd["HGMMA"] > 0 and fwd["UTMALDG"] > 0 and fwd["stack_bytes"] == 0 and fwd["wgmma_serialized"] is not True
    # Q K^T one tile ahead: compiles spill-free to wgmma; whether ptxas serialises it is reported, not required
    assert pipelined["HGMMA"] > fwd["HGMMA"] and pipelined["stack_bytes"] == 0 and "HMMA" not in pipelined
    assert pipelined["wgmma_serialized"] in (True, False, None)  # None: no ptxas of this Triton took the PTX
    assert bwd["HGMMA"] > 0 and bwd["REDG"] > 0  # wgmma, and dQ's relaxed atomics as reductions
    for row in (dkdv, dq):  # the separate dQ path: wgmma, no atomics, no spills
        assert row["HGMMA"] > 0 and "REDG" not in row and "HMMA" not in row and row["stack_bytes"] == 0
    assert fp8["QGMMA"] > 0 and "HMMA" not in fp8


def test_varlen_forward_matches_each_sequence_alone(kernels):
    """cu_seqlens: sequences end to end, chunks after cached prefixes (bottom-right per sequence), GQA; the
    output and LSE of each sequence equal the dense kernel's on that sequence alone."""
    from attnbench.case import cu_seqlens

    lens_q, lens_kv = (5, 40, 17, 1), (30, 40, 50, 9)
    dtype = torch.float16 if not ON_GPU else torch.bfloat16
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q = torch.randn(1, 4, sum(lens_q), 32, generator=gen, device=DEVICE).to(dtype)
    k = torch.randn(1, 2, sum(lens_kv), 32, generator=gen, device=DEVICE).to(dtype)
    v = torch.randn(1, 2, sum(lens_kv), 32, generator=gen, device=DEVICE).to(dtype)
    cq, ck = cu_seqlens(lens_q, DEVICE), cu_seqlens(lens_kv, DEVICE)
    for causal in (False, True):
        out, lse = kernels.varlen_forward(q, k, v, cq, ck, max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv),
                                          causal=causal, scale=0.2)
        for b in range(len(lens_q)):
            rows, keys = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
            alone, alone_lse = kernels.forward(q[:, :, rows].contiguous(), k[:, :, keys].contiguous(),
                                               v[:, :, keys].contiguous(), causal=causal, scale=0.2)
            torch.testing.assert_close(out[:, :, rows], alone, rtol=2e-3, atol=2e-3)
            torch.testing.assert_close(lse[:, :, rows], alone_lse, rtol=1e-4, atol=1e-4)


def test_varlen_forward_refuses_a_batch_that_is_not_packed(kernels):
    q = torch.zeros(2, 4, 8, 32, dtype=torch.float16, device=DEVICE)
    offsets = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="allowed: one packed batch row"):
        kernels.varlen_forward(q, q, q, offsets, offsets, max_seqlen_q=8, max_seqlen_kv=8, causal=False, scale=1.0)
