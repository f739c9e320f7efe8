"""Backward attention kernels: preprocessing, dK/dV per key tile, and dQ by atomics or by its own kernel.

FlashAttention-2's backward (Dao 2023, Algorithm 2). With ``P = exp(S - LSE)``
recomputed from the forward's log-sum-exp, and ``dO`` the output gradient::

    delta = rowsum(dO * O)                 (preprocessing kernel, fp32)
    dV    = P^T dO
    dP    = dO V^T
    dS    = P * (dP - delta)               (softmax backward; delta = rowsum(P * dP))
    dQ    = scale * dS K        dK = scale * dS^T Q

``_attn_bwd``: one program owns a tile of ``BLOCK_N`` keys of one (batch, K/V
head): K and V stay in registers, dK and dV accumulate in fp32, and the
program walks every query tile of every query head of its group (GQA/MQA: the
group's gradients are summed in the program, no atomics and no repeated K/V).
The causal diagonal and a partial last key tile take the masked path; padded
query rows carry ``LSE = +inf`` so their probabilities are exactly zero.

dQ takes one of two paths (``tuning.DQ_MODES``):

* ``"atomic"`` (``DQ_ATOMIC=True``): each step's dQ contribution ``dS K`` is
  added to an fp32 buffer with relaxed atomics, as FlashAttention-2's CUDA
  kernel does, so the backward runs the five matmuls the FLOP convention
  counts (``2.5 x`` forward) and no second pass over K and V; the price is a
  dQ summed in a nondeterministic order, the atomics' traffic, and registers
  for ``dS K`` in the program that already holds K, V, dK and dV.
* ``"separate"`` (``DQ_ATOMIC=False``, then ``_attn_bwd_dq``): ``_attn_bwd``
  computes dK and dV only; ``_attn_bwd_dq`` gives one program ``BLOCK_M``
  query rows of one (batch, query head), keeps Q, dO and dQ on chip, and walks
  the key tiles as the forward does, recomputing ``P`` from the LSE and
  ``dP = dO V^T`` (two matmuls the atomic path shares with dK/dV: seven in
  all), then ``dQ += dS K``, written once in the input dtype. No atomics, and
  dQ is deterministic. This is how FlashAttention-2's Triton implementations
  (the Triton tutorial's fused attention) split the work.
"""
from __future__ import annotations

import triton
import triton.language as tl

from attnbench.kernels.triton.forward import LOG2E, key_range, load_rows, query_tile, visible
from attnbench.kernels.triton.tuning import BWD, BWD_DKDV, BWD_DQ, pruner, quick_bench, union


@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA,
                         stride_ob, stride_oh, stride_om, stride_od,
                         stride_db, stride_dh, stride_dm, stride_dd,
                         heads_q, seq_q,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b, h, i] = sum_d O[b, h, i, d] * dO[b, h, i, d] in fp32. Grid: (cdiv(seq_q, BLOCK_M), B * Hq)."""
    pid_bh = tl.program_id(1)
    off_b = pid_bh // heads_q
    off_h = pid_bh % heads_q
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < seq_q
    o = tl.load(O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
                + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=rows, other=0.0)
    do = tl.load(DO + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh
                 + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * seq_q + offs_m, delta, mask=offs_m < seq_q)


@triton.jit
def _bwd_query_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, sm_scale, off_b, off_hkv, heads_q, group,
                     stride_qb, stride_qh, stride_qm, stride_qd, stride_db, stride_dh, stride_dm, stride_dd,
                     lo, hi, offs_n, offs_d, seq_q, seq_kv,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     DQ_ATOMIC: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi) of every query head of its group;
    with ``DQ_ATOMIC``, add each step's dQ to ``DQ_ACC``.

    The (query head, query tile) pairs run as one flat loop: a head loop around
    the tile loop kept more values live and made ptxas spill (sm_90, Triton 3.6).
    """
    qk_scale = sm_scale * LOG2E
    offs_m0 = tl.arange(0, BLOCK_M)
    steps = tl.cdiv(hi - lo, BLOCK_M)
    for t in range(0, group * steps):
        g = t // steps
        start_m = tl.multiple_of(lo + (t - g * steps) * BLOCK_M, BLOCK_M)
        off_h = off_hkv * group + g
        bh = (off_b * heads_q + off_h).to(tl.int64)
        offs_m = start_m + offs_m0
        rows = offs_m < seq_q
        q = tl.load(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
                    + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=rows[:, None], other=0.0)
        lse2 = tl.load(LSE + bh * seq_q + offs_m, mask=rows, other=float("inf")) * LOG2E
        s_t = tl.dot(k, tl.trans(q))  # (BLOCK_N, BLOCK_M): S^T
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(visible(offs_m[None, :], offs_n[:, None], seq_q, seq_kv, CAUSAL), p_t, 0.0)
        do = tl.load(DO + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh
                     + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=rows[:, None], other=0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        delta = tl.load(DELTA + bh * seq_q + offs_m, mask=rows, other=0.0)
        dp_t = tl.dot(v, tl.trans(do))  # (BLOCK_N, BLOCK_M): dP^T
        ds_t = (p_t * (dp_t - delta[None, :]) * sm_scale).to(q.dtype)  # scale * dS^T
        dk = tl.dot(ds_t, q, dk)
        if DQ_ATOMIC:
            dq = tl.dot(tl.trans(ds_t), k)  # (BLOCK_M, HEAD_DIM)
            tl.atomic_add(DQ_ACC + (bh * seq_q + offs_m[:, None]) * HEAD_DIM + offs_d[None, :], dq,
                          mask=rows[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd(Q, K, V, DO, LSE, DELTA, DQ_ACC, DK, DV, sm_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_db, stride_dh, stride_dm, stride_dd,
              stride_dkb, stride_dkh, stride_dkn, stride_dkd,
              stride_dvb, stride_dvh, stride_dvn, stride_dvd,
              heads_kv, group, seq_q, seq_kv,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DQ_ATOMIC: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """One program: BLOCK_N keys of one (batch, K/V head). Grid: (cdiv(seq_kv, BLOCK_N), B * Hkv).

    With ``DQ_ATOMIC``, ``DQ_ACC`` is a zeroed contiguous fp32 (B, Hq, seq_q, HEAD_DIM) buffer that
    receives dQ; without, it is None and dQ is left to :func:`_attn_bwd_dq`.
    """
    pid_bh = tl.program_id(1)
    off_b = pid_bh // heads_kv
    off_hkv = pid_bh % heads_kv
    start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < seq_kv
    k = tl.load(K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
                + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=keys, other=0.0)
    v = tl.load(V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
                + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    # query tiles [lo, full) need the mask (causal diagonal), [full, end) see every key of this tile
    end = tl.cdiv(seq_q, BLOCK_M) * BLOCK_M
    lo = 0
    full = 0
    if CAUSAL:
        offset = seq_kv - seq_q
        lo = (tl.maximum(start_n - offset, 0) // BLOCK_M) * BLOCK_M
        full = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M
        full = tl.minimum(tl.maximum(full, lo), end)
    if start_n + BLOCK_N > seq_kv:  # a partial key tile: every step masks the padded keys
        full = end
    heads_q = heads_kv * group
    dk, dv = _bwd_query_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, sm_scale, off_b, off_hkv, heads_q, group,
                              stride_qb, stride_qh, stride_qm, stride_qd, stride_db, stride_dh, stride_dm, stride_dd,
                              lo, full, offs_n, offs_d, seq_q, seq_kv, True, CAUSAL, HEAD_DIM, BLOCK_M, DQ_ATOMIC)
    dk, dv = _bwd_query_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, sm_scale, off_b, off_hkv, heads_q, group,
                              stride_qb, stride_qh, stride_qm, stride_qd, stride_db, stride_dh, stride_dm, stride_dd,
                              full, end, offs_n, offs_d, seq_q, seq_kv, False, CAUSAL, HEAD_DIM, BLOCK_M, DQ_ATOMIC)

    tl.store(DK + off_b.to(tl.int64) * stride_dkb + off_hkv.to(tl.int64) * stride_dkh
             + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + off_b.to(tl.int64) * stride_dvb + off_hkv.to(tl.int64) * stride_dvh
             + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd, dv.to(DV.dtype.element_ty), mask=keys)


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, qk_scale, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  lo, hi, offs_m, offs_d, seq_q, seq_kv,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Accumulate dQ / scale of one query tile over key tiles [lo, hi); MASKED applies the causal and length masks."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = load_rows(k_base, offs_n, offs_d, stride_kn, stride_kd, seq_kv, None, start_n, False, False, not MASKED)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])  # (BLOCK_M, BLOCK_N)
        if MASKED:
            p = tl.where(visible(offs_m[:, None], offs_n[None, :], seq_q, seq_kv, CAUSAL), p, 0.0)
        v = load_rows(v_base, offs_n, offs_d, stride_vn, stride_vd, seq_kv, None, start_n, False, False, not MASKED)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                 stride_qb, stride_qh, stride_qm, stride_qd,
                 stride_kb, stride_kh, stride_kn, stride_kd,
                 stride_vb, stride_vh, stride_vn, stride_vd,
                 stride_db, stride_dh, stride_dm, stride_dd,
                 stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                 heads_q, group, seq_q, seq_kv,
                 HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: BLOCK_M query rows of one (batch, query head); dQ written once, in DQ's dtype.

    Grid: (cdiv(seq_q, BLOCK_M), B * Hq).
    """
    pid_bh, off_b, off_h, off_hkv, start_m = query_tile(heads_q, group, CAUSAL, BLOCK_M)  # causal: longest first
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < seq_q
    q = load_rows(Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh, offs_m, offs_d,
                  stride_qm, stride_qd, seq_q, None, start_m, False, False, False)
    do = load_rows(DO + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh, offs_m, offs_d,
                   stride_dm, stride_dd, seq_q, None, start_m, False, False, False)
    lse2 = tl.load(LSE + pid_bh.to(tl.int64) * seq_q + offs_m, mask=rows, other=float("inf")) * LOG2E
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * seq_q + offs_m, mask=rows, other=0.0)
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    qk_scale = sm_scale * LOG2E

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    full, hi = key_range(start_m, seq_q, seq_kv, CAUSAL, BLOCK_M, BLOCK_N)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, qk_scale, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       0, full, offs_m, offs_d, seq_q, seq_kv, False, CAUSAL, BLOCK_N)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, qk_scale, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                       full, hi, offs_m, offs_d, seq_q, seq_kv, True, CAUSAL, BLOCK_N)
    tl.store(DQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh
             + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd, (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=rows[:, None])


_KEY = ["seq_q", "seq_kv", "group", "HEAD_DIM", "CAUSAL"]
attn_bwd = triton.autotune(union(BWD), key=_KEY, prune_configs_by={"early_config_prune": pruner(BWD)},
                           reset_to_zero=["DQ_ACC"], do_bench=quick_bench)(_attn_bwd)
attn_bwd_dkdv = triton.autotune(union(BWD_DKDV), key=_KEY, prune_configs_by={"early_config_prune": pruner(BWD_DKDV)},
                                do_bench=quick_bench)(_attn_bwd)  # launched with DQ_ATOMIC=False
attn_bwd_dq = triton.autotune(union(BWD_DQ), key=_KEY, prune_configs_by={"early_config_prune": pruner(BWD_DQ)},
                              do_bench=quick_bench)(_attn_bwd_dq)
