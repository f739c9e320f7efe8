"""FLOP and byte formulas against values computed by hand."""
import math

import pytest

from attnbench.bench import conventions as cv
from attnbench.case import Case


def case(**kw):
    base = dict(mode="fwd", layout="mha", batch=4, heads_q=16, heads_kv=16, head_dim_qk=128, head_dim_v=128,
                seq_q=4096, seq_kv=4096, causal=False, dtype="bf16")
    base.update(kw)
    return Case(**base)


def test_forward_flops_dense_by_hand():
    # 2 * 4 * 16 * 4096 * 4096 * (128 + 128) = 2 * 64 * 2**24 * 256
    assert cv.flops(case()) == 2 * 4 * 16 * 4096 * 4096 * 256 == 549_755_813_888


def test_causal_square_counts_the_diagonal_exactly():
    # S=4096: rows see 1, 2, ..., 4096 keys: S(S+1)/2 pairs, avg_kv = (S+1)/2 = 2048.5
    assert cv.avg_kv(case(causal=True)) == 2048.5
    assert cv.flops(case(causal=True)) == cv.flops(case()) * 4097 / (2 * 4096)


def test_causal_counts_every_kept_pair_of_a_small_mask():
    # the mask eager applies (keys j <= i + Skv - Sq kept), counted element by element
    for sq, skv in ((3, 5), (5, 5), (1, 7), (7, 7), (2, 9)):
        kept = sum(1 for i in range(sq) for j in range(skv) if j <= i + skv - sq)
        assert cv.causal_keys(sq, skv) == kept
        assert cv.avg_kv(case(seq_q=sq, seq_kv=skv, causal=True)) == kept / sq


def test_causal_is_bottom_right_aligned():
    # Sq=1024, Skv=4096: row i sees 3072 + i + 1 keys; avg_kv = 3072 + 1025/2 = 3584.5
    c = case(seq_q=1024, causal=True)
    assert cv.avg_kv(c) == 3584.5
    assert cv.flops(c) == 2 * 4 * 16 * 1024 * 3584.5 * 256
    # flash-attention's benchmarks count (max(0, Skv - Sq) + Skv) / 2 = 3584: half a key per row less
    assert cv.avg_kv(c) - (3072 + 4096) / 2 == 0.5


def test_backward_is_two_and_a_half_forward():
    assert cv.flops(case(mode="fwd_bwd")) == 3.5 * cv.flops(case())


def test_gqa_saves_bytes_not_flops():
    gqa = case(layout="gqa", heads_kv=4)
    assert cv.flops(gqa) == cv.flops(case())
    assert cv.bytes_min(gqa) < cv.bytes_min(case())


def test_bytes_min_forward_by_hand():
    # Q, K, V, O each 4*16*4096*128*2 bytes = 67,108,864
    assert cv.bytes_min(case()) == 4 * 67_108_864


def test_bytes_min_gqa_by_hand():
    # Q, O: 67,108,864 each; K, V with 4 kv heads: 16,777,216 each
    assert cv.bytes_min(case(layout="gqa", heads_kv=4)) == 2 * 67_108_864 + 2 * 16_777_216


def test_bytes_min_fwd_bwd_by_hand():
    t = 67_108_864
    lse = 4 * 16 * 4096 * 4
    forward = 4 * t + lse
    backward = (3 * t + 2 * t + lse) + 3 * t  # read q,k,v,o,dO,lse; write dq,dk,dv
    assert cv.bytes_min(case(mode="fwd_bwd")) == forward + backward


def test_decode_bytes_are_dominated_by_the_kv_cache():
    d = case(mode="decode", layout="gqa", batch=64, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096)
    kv = 2 * 64 * 8 * 4096 * 128 * 2
    assert cv.kv_cache_bytes(d) == kv
    assert cv.bytes_min(d) == kv + 2 * 64 * 32 * 1 * 128 * 2


def test_mla_caches_one_latent_tensor():
    d = Case(mode="decode", layout="mla", batch=1, heads_q=16, heads_kv=1, head_dim_qk=576, head_dim_v=512,
             seq_q=1, seq_kv=1000, causal=False, dtype="bf16")
    assert cv.kv_cache_bytes(d) == 1000 * 576 * 2  # DeepSeek-V2 Table 1: d_c + d_h^R elements per token


def test_fused_model_adds_only_the_lse():
    c = case()
    assert cv.bytes_model(c, "fused") == cv.bytes_min(c) + 4 * 16 * 4096 * 4


def test_fp8_kv_decode_counts_the_cache_at_one_byte_by_hand():
    # flashinfer-fp8kv, GQA decode B64 Hq32 Hkv8 Skv4096 D128 bf16: K and V in e4m3, q and o in bf16
    d = case(mode="decode", layout="gqa", batch=64, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096)
    kv8 = 2 * 64 * 8 * 4096 * 128 * 1  # 536,870,912: half of the bf16 cache
    q = o = 64 * 32 * 1 * 128 * 2  # 524,288 each
    lse = 64 * 32 * 1 * 4
    assert cv.kv_cache_bytes(d, ("k", "v")) == kv8 == 536_870_912
    assert cv.bytes_model(d, "fused", ("k", "v")) == kv8 + q + o + lse == 537_927_680
    assert cv.bytes_model(d, "fused") == 2 * kv8 + q + o + lse  # the same kernel reading a bf16 cache
    assert cv.bytes_min(d) == 2 * kv8 + q + o  # the case-dtype floor does not depend on the backend


def test_fp8_qkv_forward_counts_inputs_at_one_byte_and_output_at_the_case_dtype():
    # fa3-fp8 / triton-fp8: Q, K, V in e4m3 (4*16*4096*128 = 33,554,432 bytes each), O bf16, LSE fp32
    c = case()
    assert cv.bytes_model(c, "fused", ("q", "k", "v")) == 3 * 33_554_432 + 67_108_864 + 4 * 16 * 4096 * 4


def test_fp8_inputs_are_named_among_q_k_v():
    with pytest.raises(ValueError, match="fp8_inputs: 'o' is not allowed; allowed: q, k, v"):
        cv.bytes_model(case(), "fused", ("o",))


def test_eager_model_counts_score_passes_by_hand():
    c = case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4)
    # bf16 forward, bytes per score element: S written (2); ATen's upcast of S to fp32 (read 2,
    # write 4); softmax reads fp32 and writes fp32 P (4 + 4); P cast to bf16 (read 4, write 2);
    # PV reads P (2): 2 + 2 + 4 + 4 + 4 + 4 + 2 + 2 = 24
    assert cv.bytes_model(c, "eager") == cv.bytes_min(c) + 64 * 24
    # causal adds a read and a write of S in bf16
    causal = case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4, causal=True)
    assert cv.bytes_model(causal, "eager") == cv.bytes_min(c) + 64 * 28


def test_fp16_on_cuda_softmax_has_no_upcast_pass():
    # ATen fuses the half-to-float conversion into softmax for fp16 on CUDA only: no upcast pass
    # (2 read + 4 write) and softmax reads fp16 (2, not 4): 24 - 8 = 16 B/elem
    c = case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4, dtype="fp16")
    assert cv.bytes_model(c, "eager", device="cuda") == cv.bytes_min(c) + 64 * 16
    assert cv.bytes_model(c, "eager", device="cpu") == cv.bytes_min(c) + 64 * 24
    fp32 = case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4, dtype="fp32")
    assert cv.score_passes(fp32, "eager") == ["fp32"] * 4  # S write, softmax read and write, PV read


def test_eager_backward_passes_by_hand():
    c = case(mode="fwd_bwd", batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4)
    # backward, bf16: dP written (2); the cast's backward (2 read, 4 write); softmax backward reads
    # P and dP (4 + 4) and writes dS in fp32 (4); the upcast's backward (4 read, 2 write); dS read
    # by the dQ and dK matmuls (2 + 2); P read by the dV matmul (2): 32 B/elem over the forward's 24
    assert sum(cv.ELEMENT_BYTES[d] for d in cv.score_passes(c, "eager")) == 24 + 32


def test_math_model_keeps_scores_in_fp32():
    c = case(batch=1, heads_q=1, heads_kv=1, seq_q=8, seq_kv=8, head_dim_qk=4, head_dim_v=4)
    assert cv.bytes_model(c, "math") == cv.bytes_min(c) + 64 * 4 * 4


def test_unknown_family_is_rejected_by_name():
    with pytest.raises(ValueError, match="allowed: fused, eager, math"):
        cv.bytes_model(case(), "paged")


def test_roofline_labels():
    peak_flops, peak_bw = 800e12, 4e12  # ridge at 200 FLOP/byte
    # intensity 1000 at 500 TFLOP/s: compute-bound, 62.5% of the roof
    label, frac = cv.roofline_bound(1000e9, 1e9, 1e9 / 500e12 * 1000, peak_flops, peak_bw)
    assert label == "compute" and math.isclose(frac, 500 / 800)
    # intensity 10 at 2 TB/s: memory-bound, roof 40 TFLOP/s, achieved 20
    label, frac = cv.roofline_bound(10e9, 1e9, 1e9 / 2e12, peak_flops, peak_bw)
    assert label == "memory" and math.isclose(frac, 0.5)
    # far under both ceilings: latency-bound
    label, _ = cv.roofline_bound(10e6, 1e6, 1e-3, peak_flops, peak_bw)
    assert label == "latency"


def _softmax_ops(dtype, device):
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(4, 32, 32, device=device).to(dtype)
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # the ATen ops, on either device
        torch.softmax(x, -1, dtype=torch.float32)
    return [e.name for e in prof.events()]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_upcast_pass_is_what_aten_runs_on_cpu(dtype):
    import torch

    ops = _softmax_ops({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype], "cpu")
    assert "aten::_to_copy" in ops and cv.softmax_upcasts(case(dtype=dtype), "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_upcast_pass_is_what_aten_runs_on_cuda(dtype):
    import torch

    ops = _softmax_ops({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype], "cuda")
    assert ("aten::_to_copy" in ops) == cv.softmax_upcasts(case(dtype=dtype), "cuda")
