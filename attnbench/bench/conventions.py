"""The counting conventions every report cites: FLOPs, bytes, intensity, bound.

FLOPs (an exact matmul count: QK^T and PV, one multiply-add = 2 FLOPs; flash-attention's
``hopper/benchmark_attn.py`` and FlashInfer's ``testing/utils.py::attention_flops`` use the same
formula with a rounded causal count)::

    fwd      = 2 * B * Hq * Sq * avg_kv * (D_qk + D_v)
    avg_kv   = Skv                        (no mask)
             = Skv - Sq/2 + 1/2           (causal, bottom-right aligned; a causal case has Sq <= Skv)
    bwd      = 2.5 * fwd      ("2 for bwd, 0.5 for recompute")
    fwd_bwd  = 3.5 * fwd

Causal, bottom-right aligned: query row i (0-based) sees the keys j <= i + Skv - Sq, that is
Skv - Sq + i + 1 keys, the diagonal included; summed over the rows, Sq (Skv - Sq) + Sq (Sq + 1) / 2
(:func:`causal_keys`). flash-attention's benchmarks count
``avg_kv = (max(0, Skv - Sq) + Skv) / 2``, half a key per row less (the diagonal counted as half):
for a square causal case the exact count is larger by a factor (S + 1) / S, 0.1% at S = 1024 and
0.02% at 4096, so TFLOP/s here are that much higher than flash-attention's for the same time.

Query heads count; K/V heads do not (GQA/MQA save bytes, not FLOPs). Softmax
exponentials are not counted. Decode and MLA use the same formula with their dims.

Bytes (each tensor at its element size; K and V are sized by K/V heads):

* ``bytes_min``: every input read once and every output written once: the floor
  no kernel can beat. fwd: Q, K, V read, O written. fwd_bwd adds the forward's
  LSE write (fp32, kept for the backward) and the backward's reads of Q, K, V,
  O, dO, LSE and writes of dQ, dK, dV.
* ``bytes_model``: what the backend's algorithm moves by family. ``fused``
  kernels (FlashAttention-style tiling, Dao et al. 2022) move ``bytes_min``
  (plus the LSE they always write). ``eager`` and ``math`` materialise the
  Sq x Skv score matrix: see :func:`score_bytes`. A paged KV cache adds its
  page table (:func:`page_table_bytes`) in every family. Inputs a backend
  reads in e4m3 (its ``fp8_inputs``: K and V for ``flashinfer-fp8kv``; Q, K
  and V for ``fa3-fp8`` and ``triton-fp8``) count one byte per element; its
  output stays in the case dtype. ``bytes_min`` stays the case-dtype floor, so
  an fp8 row's ``bytes_model`` can be below it.
* ``bytes_min_read_write``: ``bytes_min`` split into bytes read and bytes
  written, to set against Nsight Compute's separate DRAM read and write counts.
"""
from __future__ import annotations

from attnbench.case import Case

ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
FP8_INPUTS = ("q", "k", "v")  # the inputs a backend may read in e4m3 (Backend.fp8_inputs)
LSE_BYTES = 4  # the log-sum-exp is kept in fp32 by every fused kernel
BACKWARD_FLOP_FACTOR = 2.5
LATENCY_FRACTION = 0.2  # under 20% of both ceilings: latency-bound (DESIGN.md)


def causal_keys(seq_q: int, seq_kv: int) -> int:
    """Query-key pairs a bottom-right aligned causal mask keeps (Sq <= Skv): the sum over rows i of Skv - Sq + i + 1."""
    return seq_q * (seq_kv - seq_q) + seq_q * (seq_q + 1) // 2


def avg_kv(case: Case) -> float:
    """Mean number of keys a query attends to (the diagonal counted exactly); causal is bottom-right aligned."""
    if not case.causal:
        return float(case.seq_kv)
    return causal_keys(case.seq_q, case.seq_kv) / case.seq_q


def forward_flops(case: Case) -> float:
    """2·B·Hq·Sq·avg_kv·(D_qk + D_v): QK^T and PV, one multiply-add = 2 FLOPs."""
    return 2.0 * case.batch * case.heads_q * case.seq_q * avg_kv(case) * (case.head_dim_qk + case.head_dim_v)


def flops(case: Case) -> float:
    """FLOPs of one call in the case's mode; fwd_bwd = 3.5 x forward."""
    fwd = forward_flops(case)
    return fwd * (1 + BACKWARD_FLOP_FACTOR) if case.has_backward else fwd


def _tensor_bytes(case: Case, fp8_inputs: tuple[str, ...] = ()) -> dict[str, float]:
    """Bytes of each tensor at the case dtype; the inputs named in ``fp8_inputs`` at one byte an element."""
    unknown = sorted(set(fp8_inputs) - set(FP8_INPUTS))
    if unknown:
        raise ValueError(f"fp8_inputs: {unknown[0]!r} is not allowed; allowed: {', '.join(FP8_INPUTS)}")
    e = {name: ELEMENT_BYTES["fp8" if name in fp8_inputs else case.dtype] for name in FP8_INPUTS}
    e["o"] = ELEMENT_BYTES[case.dtype]
    b = case.batch
    return {
        "q": b * case.heads_q * case.seq_q * case.head_dim_qk * e["q"],
        "k": b * case.heads_kv * case.seq_kv * case.head_dim_qk * e["k"],
        "v": b * case.heads_kv * case.seq_kv * case.head_dim_v * e["v"],
        "o": b * case.heads_q * case.seq_q * case.head_dim_v * e["o"],
        "lse": b * case.heads_q * case.seq_q * LSE_BYTES,
    }


def kv_cache_bytes(case: Case, fp8_inputs: tuple[str, ...] = ()) -> float:
    """Bytes of K and V (the decode working set): 2·B·Hkv·Skv·D·elt, per DeepSeek-V2 Table 1.

    ``elt`` is the case dtype's size, or 1 for K or V named in ``fp8_inputs`` (an e4m3 cache).
    """
    t = _tensor_bytes(case, fp8_inputs)
    if case.layout == "mla":  # the value is the first d_c dims of the cached key: one tensor
        return t["k"]
    return t["k"] + t["v"]


def bytes_min(case: Case) -> float:
    """Each input read once, each output written once."""
    t = _tensor_bytes(case)
    forward = t["q"] + kv_cache_bytes(case) + t["o"]
    if not case.has_backward:
        return forward
    # forward also writes the LSE; backward reads q,k,v,o,dO,lse and writes dq,dk,dv
    backward = (t["q"] + kv_cache_bytes(case) + 2 * t["o"] + t["lse"]) + (t["q"] + kv_cache_bytes(case))
    return forward + t["lse"] + backward


def bytes_min_read_write(case: Case) -> tuple[float, float]:
    """(read, written) parts of :func:`bytes_min`; they sum to it.

    fwd/decode: Q, K, V read, O written. fwd_bwd adds the forward's LSE write,
    the backward's reads of Q, K, V, O, dO, LSE and its writes of dQ, dK, dV.
    """
    t = _tensor_bytes(case)
    kv = kv_cache_bytes(case)
    read, written = t["q"] + kv, t["o"]
    if case.has_backward:
        read += t["q"] + kv + 2 * t["o"] + t["lse"]
        written += t["lse"] + t["q"] + kv
    return read, written


PAGE_INDEX_BYTES = 4  # int32 page indices and offsets


def page_table_bytes(case: Case) -> float:
    """Page-table bytes a paged decode step reads; 0 for a contiguous cache.

    FlashInfer's paged KV layout (``kv_indptr`` of B+1 offsets, ``kv_indices``
    with one entry per page, ``kv_last_page_len`` of B entries, all int32;
    FlashInfer docs, "KV-Cache Layout in FlashInfer"): pages per sequence =
    ceil(Skv / page_size).
    """
    if not case.page_size:
        return 0.0
    pages = -(-case.seq_kv // case.page_size)
    return float(PAGE_INDEX_BYTES * ((case.batch + 1) + case.batch * pages + case.batch))


def softmax_upcasts(case: Case, device: str) -> bool:
    """Whether eager's ``softmax(scores, dtype=float32)`` first copies the scores to fp32.

    ATen's ``softmax`` (``aten/src/ATen/native/SoftMax.cpp``) runs a fused half-to-float kernel only
    for fp16 input on CUDA; any other input is converted with ``toType(float)`` first: a read of
    the scores in their dtype and a write in fp32 (bf16 on every device, fp16 on CPU).
    """
    return case.dtype != "fp32" and not (case.dtype == "fp16" and device == "cuda")


def score_passes(case: Case, family: str, device: str = "cuda") -> list[str]:
    """The passes over the Sq x Skv score matrix an unfused backend makes, as element dtypes.

    ``eager`` (``attnbench.kernels.eager``, the Hugging Face eager recipe), forward: S = QK^T
    written; a causal mask reads and writes S; the fp32 upcast of S where ATen makes one
    (:func:`softmax_upcasts`: read S, write fp32); softmax reads its input and writes fp32
    probabilities; they are cast back to the input dtype (an fp32 read and a write, skipped in
    fp32) and read by PV. Backward: dP written; the cast's backward (read, fp32 write); softmax
    backward reads P and dP and writes dS (in fp32 after an upcast, then the upcast's backward reads
    it and writes the input dtype); the mask's backward (read, write); dS read by the dQ and dK
    matmuls; P read by the dV matmul. With the upcast pass, the model matches Nsight Compute's
    DRAM bytes of eager's bf16 forward on the H200 (B4 H16 D128, S 1k-16k) to 0.1% without a mask
    and within 3% with the causal mask (docs/hbm.md); without it, eager moved 1.36-1.50x its model.

    ``math`` (SDPA's math path, which upcasts fp16/bf16 to fp32 first): the same passes with every
    score-sized tensor in fp32 and no cast.
    """
    dt = case.dtype if family == "eager" else "fp32"
    cast = dt != "fp32"
    upcast = family == "eager" and softmax_upcasts(case, device)
    mask = ["fp32" if family == "math" else dt] * 2 if case.causal else []
    softmax_in = "fp32" if upcast else dt
    fwd = [dt] + mask + ([dt, "fp32"] if upcast else []) + [softmax_in, "fp32"] + (["fp32", dt] if cast else []) + [dt]
    if not case.has_backward:
        return fwd
    ds = "fp32" if upcast else dt
    bwd = ([dt] + ([dt, "fp32"] if cast else []) + ["fp32", "fp32" if cast else dt, ds]
           + (["fp32", dt] if upcast else []) + mask + [dt, dt, dt])
    return fwd + bwd


def score_bytes(case: Case, family: str, device: str = "cuda") -> float:
    """HBM bytes spent on the score matrix: B·Hq·Sq·Skv elements per pass of :func:`score_passes`."""
    elements = case.batch * case.heads_q * case.seq_q * case.seq_kv
    return elements * sum(ELEMENT_BYTES[d] for d in score_passes(case, family, device))


def bytes_model(case: Case, family: str, fp8_inputs: tuple[str, ...] = (), device: str = "cuda") -> float:
    """Bytes the backend's algorithm moves. Families: fused, eager, math.

    ``fp8_inputs`` (the backend's ``fp8_inputs``) names the inputs among q, k, v
    that the timed call reads in e4m3, quantised outside it: their forward read
    counts one byte per element instead of the case dtype's size. For
    ``flashinfer-fp8kv`` that is the K/V cache (q is read in the case dtype);
    for ``fa3-fp8`` and ``triton-fp8`` it is Q, K and V. The output (and the LSE)
    is written at its own size whatever the inputs; the per-tensor or per-block
    descales are left out with the other small terms. Every fp8 backend here is
    forward or decode only; a backward would be counted at the case dtype.
    ``device`` matters for eager only (:func:`softmax_upcasts`).

    Terms of order B·H·S·D beyond ``bytes_min`` (scaling Q, math's fp32 copies of
    the inputs, GQA head repeats) are left out: the score matrix dominates them
    by a factor of Skv/D.
    """
    # the forward reads Q, K and V once: what reading some of them in fp8 saves (0 without fp8_inputs)
    fp8_saved = (_tensor_bytes(case)["q"] + kv_cache_bytes(case)
                 - _tensor_bytes(case, fp8_inputs)["q"] - kv_cache_bytes(case, fp8_inputs))
    if family == "fused":
        extra = 0 if case.has_backward else _tensor_bytes(case)["lse"]
    elif family in ("eager", "math"):
        extra = score_bytes(case, family, device)
    else:
        raise ValueError(f"family={family!r} is not allowed; allowed: fused, eager, math")
    return bytes_min(case) + extra + page_table_bytes(case) - fp8_saved


def intensity(flop_count: float, byte_count: float) -> float:
    """Arithmetic intensity in FLOP/byte (Williams et al. 2009, roofline)."""
    return flop_count / byte_count if byte_count else float("nan")


def roofline_bound(flop_count: float, byte_count: float, seconds: float, peak_flops: float, peak_bytes_per_s: float) -> tuple[str, float]:
    """Label a measured run memory-, compute- or latency-bound; return (label, fraction of roofline).

    The roofline at intensity I is min(peak_flops, I * peak_bw) (Williams et al.
    2009). A run that reaches under 20% of both the compute and the bandwidth
    ceiling is latency-bound (launch, occupancy or synchronisation dominate);
    otherwise its side of the ridge point decides. The fraction is the achieved
    FLOP rate over the roofline at its intensity.
    """
    if not (seconds > 0 and peak_flops > 0 and peak_bytes_per_s > 0):
        return "unknown", float("nan")
    achieved_flops = flop_count / seconds
    achieved_bw = byte_count / seconds
    ai = intensity(flop_count, byte_count)
    roof = min(peak_flops, ai * peak_bytes_per_s)
    fraction = achieved_flops / roof if roof else float("nan")
    if achieved_flops < LATENCY_FRACTION * peak_flops and achieved_bw < LATENCY_FRACTION * peak_bytes_per_s:
        return "latency", fraction
    return ("memory" if ai < peak_flops / peak_bytes_per_s else "compute"), fraction


# ----------------------------------------------------------------------------------------------- real workloads
# Ragged batches and attention variants: FLOPs and bytes over the real tokens and the exact unmasked
# work, each built from the per-sequence formulas above (so a change to them reaches these too).
# For a dense case without a variant every function below equals its dense counterpart.

def sequence_cases(case: Case) -> list[Case]:
    """One dense case per segment (a sequence of a ragged batch, or a document), batch 1, no variant:
    the problems the per-sequence formulas count. (A causal variant is causal, or a one-query decode
    step, whose single row sees every key either way: ``attnbench.case``.)"""
    import dataclasses

    return [dataclasses.replace(case, batch=1, seq_q=nq, seq_kv=nkv, seq_lens_q=(), seq_lens_kv=(), variant="none",
                                window=0, softcap=0.0, doc_len=0, prefix_len=0)
            for nq, nkv in case.segments()]


def _pairs_hidden_by_window(sq: int, skv: int, window: int) -> int:
    """Causal (query, key) pairs a left window of ``window`` keys hides: the query at position
    p = i + skv - sq does not see keys j < p - window, i.e. max(0, p - window) of them."""
    a = skv - sq - window  # row i hides max(0, i + a) keys
    first = max(0, -a)  # the first row that hides any
    count = sq - first
    return count * (first + a + sq - 1 + a) // 2 if count > 0 else 0


def workload_flops(case: Case) -> float:
    """FLOPs of one call over the real tokens and the variant's exact unmasked work.

    A ragged batch (or the ``document`` variant) is the sum of :func:`flops` over its segments. Variants
    change which pairs are computed: ``sliding_window`` removes the causal pairs outside the window
    (:func:`_pairs_hidden_by_window`), each costing ``2·Hq·(D_qk + D_v)``; ``prefix_lm`` adds the upper
    triangle of the prefix block, the dense prefix (non-causal) less its causal count; ``softcap`` and
    ``alibi`` compute every pair of the causal or dense problem (their score change is not counted, as
    softmax exponentials are not).
    """
    total = 0.0
    per_pair = 2.0 * case.heads_q * (case.head_dim_qk + case.head_dim_v)
    for seq in sequence_cases(case):
        fwd = forward_flops(seq)
        if case.variant == "sliding_window":
            fwd -= per_pair * _pairs_hidden_by_window(seq.seq_q, seq.seq_kv, case.window)
        elif case.variant == "prefix_lm":
            import dataclasses

            prefix = dataclasses.replace(seq, seq_q=case.prefix_len, seq_kv=case.prefix_len)
            fwd += forward_flops(dataclasses.replace(prefix, causal=False)) - forward_flops(prefix)
        total += fwd
    return total * (1 + BACKWARD_FLOP_FACTOR) if case.has_backward else total


def workload_bytes_min(case: Case) -> float:
    """:func:`bytes_min` over the real tokens: the sum over the sequences (a variant moves the same tensors)."""
    if case.dense:
        return bytes_min(case)
    return float(sum(bytes_min(seq) for seq in sequence_cases(case)))


def workload_page_table_bytes(case: Case) -> float:
    """:func:`page_table_bytes` of the real lengths: ``ceil(Skv_b / page_size)`` pages for sequence b."""
    if not case.page_size:
        return 0.0
    pages = sum(-(-n // case.page_size) for n in case.lens_kv)
    return float(PAGE_INDEX_BYTES * ((case.batch + 1) + pages + case.batch))


def workload_bytes_model(case: Case, family: str, fp8_inputs: tuple[str, ...] = (), device: str = "cuda") -> float:
    """:func:`bytes_model` over the real tokens: the per-sequence model summed, the page table of the real
    lengths once. A variant's mask or bias, where a backend reads one, is not counted (the score passes
    of eager and math are those of the causal problem)."""
    if case.dense:
        return bytes_model(case, family, fp8_inputs, device=device)
    import dataclasses

    unpaged = [dataclasses.replace(seq, page_size=0) for seq in sequence_cases(case)]
    return (float(sum(bytes_model(seq, family, fp8_inputs, device=device) for seq in unpaged))
            + workload_page_table_bytes(case))
