"""Forward attention kernel: tiled, online softmax, log-sum-exp kept for the backward.

The algorithm is FlashAttention-2's forward (Dao 2023, Algorithm 1): one
program owns a tile of ``BLOCK_M`` query rows of one (batch, query head),
streams the key/value tiles of that head's K/V head, and keeps the running
row maximum ``m``, the running sum ``l`` of exponentials and the unnormalised
output accumulator in fp32. After each tile::

    m_new = max(m, rowmax(S_j))          S_j = Q K_j^T * scale (log2 units)
    P_j   = exp2(S_j - m_new)
    l     = l * exp2(m - m_new) + rowsum(P_j)
    acc   = acc * exp2(m - m_new) + P_j V_j

and at the end ``O = acc / l`` and ``LSE = (m + log2 l) * ln 2`` (natural log,
as flash-attn's ``softmax_lse``). Scores are kept in log2 units (the scale is
multiplied by log2(e)) so the exponential is one ``exp2``.

GQA/MQA: query head ``h`` reads K/V head ``h // group``; K and V are never
repeated in memory. Causal masks are bottom-right aligned: query ``i`` sees
key ``j`` iff ``j <= i + seq_kv - seq_q``. The key loop is split in two:
tiles every row of the query tile sees in full (no mask), then the few tiles
on the diagonal or past ``seq_kv`` (masked).

Varlen (``VARLEN=True``, :func:`attnbench.kernels.triton.launch.varlen_forward`): the sequences lie end
to end in one packed batch row, ``CU_Q``/``CU_KV`` (int32, B + 1) hold where each starts, and the
grid's batch index is the sequence's. A program reads its sequence's offsets and lengths, so the
causal mask is bottom-right per sequence (chunked prefill: a chunk of ``seq_q`` queries after a cached
prefix of ``seq_kv - seq_q`` keys); a program whose query tile starts past its sequence's end runs no
key tile and stores nothing. ``seq_q``/``seq_kv`` are then the longest sequence's (the grid's size and
the autotuning key). The varlen path uses pointer loads (TMA descriptors are per tensor).

FP8 (``FP8=True``): Q, K, V are e4m3 with one fp32 scale per tile of rows
(:mod:`attnbench.kernels.triton.fp8`). The descales of Q and K fold into the
score scale (a scalar per tile pair). ``P`` is quantised to e4m3 after a shift
of ``2**P_SHIFT`` (so probabilities span e4m3's range instead of underflowing)
which cancels in ``acc / l``. V's scale changes from tile to tile: the
accumulator is kept in units of the current V scale and rescaled with the
softmax correction, ``acc *= alpha * vs_prev / vs_j``, so no extra pass over
the accumulator is needed. V is stored transposed (sequence contiguous), the
operand layout Hopper's fp8 wgmma needs. ``P V`` is promoted into the fp32
accumulator once per tile (``max_num_imprecise_acc``): Hopper's fp8 MMA adds in
reduced precision, and Triton's sm_90 default never promotes.
"""
from __future__ import annotations

import triton
import triton.language as tl

from attnbench.kernels.triton.tuning import FP8, FWD, pruner, quick_bench, union

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E), scores in log2 units
P_SHIFT = tl.constexpr(8.0)  # fp8: P = exp2(s - m + 8), probabilities in [0, 256] inside e4m3's 448


@triton.jit
def load_rows(base, offs_rows, offs_d, stride_row, stride_d, n_rows, desc, start, USE_TMA: tl.constexpr,
              TRANSPOSED: tl.constexpr, IN_RANGE: tl.constexpr):
    """A (rows, D) tile by TMA or pointer loads; zero past ``n_rows`` unless the caller knows it ``IN_RANGE``."""
    if USE_TMA:
        if TRANSPOSED:  # stored (D, rows): the descriptor's tile is (D, BLOCK); hand back (BLOCK, D)
            tile = desc.load([0, start]).T
        else:
            tile = desc.load([start, 0])
    else:
        ptrs = base + offs_rows[:, None] * stride_row + offs_d[None, :] * stride_d
        if IN_RANGE:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=offs_rows[:, None] < n_rows, other=0.0)
    return tile


@triton.jit
def query_tile(heads_q, group, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's (batch * Hq + head, batch, query head, K/V head, first row) on a (query tiles, B * Hq) grid."""
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows (last tiles) first, so the short ones fill the tail of the wave
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_h = pid_bh % heads_q
    return pid_bh, pid_bh // heads_q, off_h, off_h // group, pid_m * BLOCK_M


@triton.jit
def key_range(start_m, seq_q, seq_kv, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full, hi) for the query tile at ``start_m``: keys [0, full) are in range and visible to every row
    of the tile (no mask); keys [full, hi) lie on the causal diagonal or past ``seq_kv`` (masked)."""
    hi = seq_kv
    full = (seq_kv // BLOCK_N) * BLOCK_N
    if CAUSAL:
        offset = seq_kv - seq_q
        hi = tl.minimum(seq_kv, start_m + BLOCK_M + offset)
        full = tl.minimum(full, ((start_m + offset + 1) // BLOCK_N) * BLOCK_N)
    return full, hi


@triton.jit
def visible(query_pos, key_pos, seq_q, seq_kv, CAUSAL: tl.constexpr):
    """Which (query, key) pairs attend: the key inside ``seq_kv`` and, causal, at most the query's position
    aligned bottom-right (``j <= i + seq_kv - seq_q``). Positions broadcast in either orientation:
    ``offs_m[:, None], offs_n[None, :]`` for a score tile, the transpose for an S^T tile."""
    keep = key_pos < seq_kv
    if CAUSAL:
        keep = keep & (key_pos <= query_pos + (seq_kv - seq_q))
    return keep


@triton.jit
def shifted_scores(s, m_i, scale, offs_m, offs_n, seq_q, seq_kv, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """(S * scale - m_new, m_new, alpha = exp2(m_i - m_new)) of one raw score tile; MASKED: hidden keys -> -inf."""
    if MASKED:
        keep = visible(offs_m[:, None], offs_n[None, :], seq_q, seq_kv, CAUSAL)
        s = tl.where(keep, s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        s = s - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
        s = s * scale - m_new[:, None]
    return s, m_new, tl.math.exp2(m_i - m_new)


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, qk_scale, vs_prev, k_base, v_base, k_desc, v_desc, KS, VS,
               stride_kn, stride_kd, stride_vn, stride_vd, lo, hi, offs_m, offs_d, seq_q, seq_kv,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, FP8: tl.constexpr, SCALE_ROWS: tl.constexpr,
               BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr):
    """Online-softmax update over key tiles [lo, hi); MASKED applies the causal and length masks."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = load_rows(k_base, offs_n, offs_d, stride_kn, stride_kd, seq_kv, k_desc, start_n, USE_TMA, False,
                      not MASKED)
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32
        scale = qk_scale
        if FP8:  # this tile's scales: scalar loads issued before the matmul's result is needed
            vs = tl.load(VS + start_n // SCALE_ROWS)
            scale = qk_scale * tl.load(KS + start_n // SCALE_ROWS)
        s, m_new, alpha = shifted_scores(s, m_i, scale, offs_m, offs_n, seq_q, seq_kv, MASKED, CAUSAL)
        if FP8:
            p = tl.math.exp2(s + P_SHIFT)
            acc = acc * (alpha * (vs_prev / vs))[:, None]
            vs_prev = vs
        else:
            p = tl.math.exp2(s)
            acc = acc * alpha[:, None]
        v = load_rows(v_base, offs_n, offs_d, stride_vn, stride_vd, seq_kv, v_desc, start_n, USE_TMA, FP8,
                      not MASKED)
        if FP8:  # sm_90 fp8 MMAs add in reduced precision (DeepSeek-V3): promote to the fp32 accumulator per tile
            acc = tl.dot(p.to(v.dtype), v, acc, max_num_imprecise_acc=BLOCK_N)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i, vs_prev


@triton.jit
def _probabilities(acc, l_i, m_i, s, qk_scale, offs_m, offs_n, seq_q, seq_kv, MASKED: tl.constexpr,
                   CAUSAL: tl.constexpr):
    """One key tile's softmax from its raw scores: (P, acc and l rescaled to the new maximum, m_new)."""
    s, m_new, alpha = shifted_scores(s, m_i, qk_scale, offs_m, offs_n, seq_q, seq_kv, MASKED, CAUSAL)
    p = tl.math.exp2(s)
    return p, acc * alpha[:, None], l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _fwd_tiles_pipelined(acc, l_i, m_i, q, qk_scale, k_base, v_base, k_desc, v_desc, stride_kn, stride_kd,
                         stride_vn, stride_vd, lo, hi, offs_m, offs_d, seq_q, seq_kv, MASKED: tl.constexpr,
                         CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr):
    """:func:`_fwd_tiles` (bf16/fp16) over key tiles [lo, hi) with ``Q K^T`` one tile ahead of the softmax
    (FlashAttention-3, section 3.2). Iteration j runs ``acc += P_{j-1} V_{j-1}``, issues ``S_{j+1} = Q K_{j+1}^T``,
    then the softmax of ``S_j``. The order is chosen for Triton's wgmma pipeliner (``asyncLaunchDots``): the
    ``P V`` product's result is used in its own iteration, so it is followed by a wait for all wgmma; ``S_{j+1}``
    is issued after that wait and its result is read only in the next iteration, after the next such wait, so the
    compiler may leave it in flight across the softmax. Tile ``lo`` (prologue) and the last tile (epilogue) are
    peeled; with one tile this is the plain update."""
    offs_n0 = tl.arange(0, BLOCK_N)
    if lo < hi:
        k = load_rows(k_base, lo + offs_n0, offs_d, stride_kn, stride_kd, seq_kv, k_desc, lo, USE_TMA, False,
                      not MASKED)
        p, acc, l_i, m_i = _probabilities(acc, l_i, m_i, tl.dot(q, tl.trans(k)), qk_scale, offs_m, lo + offs_n0,
                                          seq_q, seq_kv, MASKED, CAUSAL)
        last = lo + (hi - lo - 1) // BLOCK_N * BLOCK_N
        if last > lo:
            k = load_rows(k_base, lo + BLOCK_N + offs_n0, offs_d, stride_kn, stride_kd, seq_kv, k_desc, lo + BLOCK_N,
                          USE_TMA, False, not MASKED)
            s = tl.dot(q, tl.trans(k))
            for start_n in range(lo + BLOCK_N, last, BLOCK_N):  # the tiles between the first and the last
                start_n = tl.multiple_of(start_n, BLOCK_N)
                prev_n = start_n - BLOCK_N
                next_n = start_n + BLOCK_N
                v = load_rows(v_base, prev_n + offs_n0, offs_d, stride_vn, stride_vd, seq_kv, v_desc, prev_n, USE_TMA,
                              False, not MASKED)
                acc = tl.dot(p.to(q.dtype), v, acc)  # P_{j-1} V_{j-1}; the wait after it also completes S_j
                k = load_rows(k_base, next_n + offs_n0, offs_d, stride_kn, stride_kd, seq_kv, k_desc, next_n, USE_TMA,
                              False, not MASKED)
                s_next = tl.dot(q, tl.trans(k))  # S_{j+1}: may stay in flight while S_j's softmax runs
                p, acc, l_i, m_i = _probabilities(acc, l_i, m_i, s, qk_scale, offs_m, start_n + offs_n0, seq_q,
                                                  seq_kv, MASKED, CAUSAL)
                s = s_next
            v = load_rows(v_base, last - BLOCK_N + offs_n0, offs_d, stride_vn, stride_vd, seq_kv, v_desc,
                          last - BLOCK_N, USE_TMA, False, not MASKED)
            acc = tl.dot(p.to(q.dtype), v, acc)
            p, acc, l_i, m_i = _probabilities(acc, l_i, m_i, s, qk_scale, offs_m, last + offs_n0, seq_q, seq_kv,
                                              MASKED, CAUSAL)
        v = load_rows(v_base, last + offs_n0, offs_d, stride_vn, stride_vd, seq_kv, v_desc, last, USE_TMA, False,
                      not MASKED)
        acc = tl.dot(p.to(q.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["n_scale_q", "n_scale_kv"])  # one compiled variant for every sequence length
def _attn_fwd(Q, K, V, O, LSE, QS, KS, VS, CU_Q, CU_KV, sm_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              heads_q, group, seq_q, seq_kv, n_scale_q, n_scale_kv,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, FP8: tl.constexpr, SCALE_ROWS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr, PIPELINE_QK: tl.constexpr = False,
              VARLEN: tl.constexpr = False):
    """One program: BLOCK_M query rows of one (batch or sequence, query head). Grid: (cdiv(seq_q, BLOCK_M), B * Hq)."""
    pid_bh, off_b, off_h, off_hkv, start_m = query_tile(heads_q, group, CAUSAL, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    tl.static_assert(not (VARLEN and (FP8 or USE_TMA)), "the varlen path is bf16/fp16 with pointer loads")
    if VARLEN:  # this sequence's rows of the packed tensors; LSE is (1, Hq, total query tokens)
        q_start = tl.load(CU_Q + off_b)
        kv_start = tl.load(CU_KV + off_b)
        seq_q = tl.load(CU_Q + off_b + 1) - q_start
        seq_kv = tl.load(CU_KV + off_b + 1) - kv_start
        total_q = tl.load(CU_Q + tl.num_programs(1) // heads_q)
        q_base = Q + off_h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_qm
        k_base = K + off_hkv.to(tl.int64) * stride_kh + kv_start.to(tl.int64) * stride_kn
        v_base = V + off_hkv.to(tl.int64) * stride_vh + kv_start.to(tl.int64) * stride_vn
        o_base = O + off_h.to(tl.int64) * stride_oh + q_start.to(tl.int64) * stride_om
        lse_base = LSE + off_h.to(tl.int64) * total_q + q_start
    else:
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
        v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
        o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
        lse_base = LSE + pid_bh.to(tl.int64) * seq_q
    q_desc = None
    k_desc = None
    v_desc = None
    o_desc = None
    if USE_TMA:
        q_desc = tl.make_tensor_descriptor(q_base, [seq_q, HEAD_DIM], [stride_qm, 1], [BLOCK_M, HEAD_DIM])
        k_desc = tl.make_tensor_descriptor(k_base, [seq_kv, HEAD_DIM], [stride_kn, 1], [BLOCK_N, HEAD_DIM])
        if FP8:
            v_desc = tl.make_tensor_descriptor(v_base, [HEAD_DIM, seq_kv], [stride_vd, 1], [HEAD_DIM, BLOCK_N])
        else:
            v_desc = tl.make_tensor_descriptor(v_base, [seq_kv, HEAD_DIM], [stride_vn, 1], [BLOCK_N, HEAD_DIM])
        o_desc = tl.make_tensor_descriptor(o_base, [seq_q, HEAD_DIM], [stride_om, 1], [BLOCK_M, HEAD_DIM])
    q = load_rows(q_base, offs_m, offs_d, stride_qm, stride_qd, seq_q, q_desc, start_m, USE_TMA, False, False)

    qk_scale = sm_scale * LOG2E
    vs_prev = 1.0
    if FP8:
        qk_scale = qk_scale * tl.load(QS + pid_bh * n_scale_q + start_m // SCALE_ROWS)
        KS += (off_b * (heads_q // group) + off_hkv) * n_scale_kv
        VS += (off_b * (heads_q // group) + off_hkv) * n_scale_kv
        vs_prev = tl.load(VS)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    full, hi = key_range(start_m, seq_q, seq_kv, CAUSAL, BLOCK_M, BLOCK_N)
    if VARLEN:  # a tile past this sequence's end runs no key tile (and stores nothing: every row is masked)
        full = tl.where(start_m < seq_q, full, 0)
        hi = tl.where(start_m < seq_q, hi, 0)
    tl.static_assert(not (PIPELINE_QK and FP8), "PIPELINE_QK is a bf16/fp16 variant")
    if PIPELINE_QK:
        acc, l_i, m_i = _fwd_tiles_pipelined(acc, l_i, m_i, q, qk_scale, k_base, v_base, k_desc, v_desc, stride_kn,
                                             stride_kd, stride_vn, stride_vd, 0, full, offs_m, offs_d, seq_q, seq_kv,
                                             False, CAUSAL, BLOCK_N, USE_TMA)
        acc, l_i, m_i = _fwd_tiles_pipelined(acc, l_i, m_i, q, qk_scale, k_base, v_base, k_desc, v_desc, stride_kn,
                                             stride_kd, stride_vn, stride_vd, full, hi, offs_m, offs_d, seq_q, seq_kv,
                                             True, CAUSAL, BLOCK_N, USE_TMA)
    else:
        acc, l_i, m_i, vs_prev = _fwd_tiles(acc, l_i, m_i, q, qk_scale, vs_prev, k_base, v_base, k_desc, v_desc,
                                            KS, VS, stride_kn, stride_kd, stride_vn, stride_vd, 0, full, offs_m,
                                            offs_d, seq_q, seq_kv, False, CAUSAL, FP8, SCALE_ROWS, BLOCK_N, USE_TMA)
        acc, l_i, m_i, vs_prev = _fwd_tiles(acc, l_i, m_i, q, qk_scale, vs_prev, k_base, v_base, k_desc, v_desc,
                                            KS, VS, stride_kn, stride_kd, stride_vn, stride_vd, full, hi, offs_m,
                                            offs_d, seq_q, seq_kv, True, CAUSAL, FP8, SCALE_ROWS, BLOCK_N, USE_TMA)

    if FP8:
        acc = acc * vs_prev
        m_i = m_i - P_SHIFT
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # natural log
    out = (acc / l_i[:, None]).to(O.dtype.element_ty)
    tl.store(lse_base + offs_m, lse, mask=offs_m < seq_q)
    if USE_TMA:
        o_desc.store([start_m, 0], out)
    else:
        o_ptrs = o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out, mask=offs_m[:, None] < seq_q)


_KEY = ["seq_q", "seq_kv", "HEAD_DIM", "CAUSAL", "FP8", "VARLEN"]
attn_fwd = triton.autotune(union(FWD), key=_KEY, prune_configs_by={"early_config_prune": pruner(FWD)},
                           do_bench=quick_bench)(_attn_fwd)
attn_fwd_fp8 = triton.autotune(union(FP8), key=_KEY, prune_configs_by={"early_config_prune": pruner(FP8)},
                               do_bench=quick_bench)(_attn_fwd)
