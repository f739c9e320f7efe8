"""Host-side launchers: shape checks, output allocation, grids, and the TMA scratch allocator.

Tensors are BHSD (q: B, Hq, Sq, D; k, v: B, Hkv, Skv, D) with any strides
whose last one is 1 (a (B, S, H, D) tensor transposed to BHSD qualifies).
Outputs are contiguous BHSD; the log-sum-exp is fp32 (B, Hq, Sq), natural log.

Every launcher takes ``config``: ``None`` runs the autotuned kernel; a
``triton.Config`` runs exactly that config (tests use it to cover each load
path), and with ``compile_only=True`` only compiles it into Triton's cache
(the benchmark script compiles all configs in parallel processes that way).
"""
from __future__ import annotations

import torch
import triton

from attnbench.kernels.triton import backward as bwd_kernels
from attnbench.kernels.triton import forward as fwd_kernels
from attnbench.kernels.triton.fp8 import Quantized
from attnbench.kernels.triton.tuning import DQ_MODES, INTERPRET, quick_bench

HEAD_DIMS = (32, 64, 128)
DTYPES = (torch.float16, torch.bfloat16)
PREPROCESS_ROWS = 32 if INTERPRET else 128

# The compiled kernel of the latest launch of each kernel, for the compiler report (registers, SASS);
# the dK/dV-only launch of ``_attn_bwd`` (the separate dQ path) is kept as "_attn_bwd_dkdv".
last_compiled: dict[str, object] = {}
# The backward's dQ path chosen per shape (Sq, Skv, group, D, dtype, causal) by timing both paths once.
dq_modes: dict[tuple, str] = {}


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtypes=DTYPES) -> None:
    """Raise ValueError naming the offending field when the kernels cannot take these tensors."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be BHSD (4-d); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtype={q.dtype}/{k.dtype}/{v.dtype} is not allowed; allowed: one of "
                         f"{', '.join(map(str, dtypes))} for all three")
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"head_dim={d}/{k.shape[-1]}/{v.shape[-1]} is not allowed; allowed: equal q/k/v head dims "
                         f"in {', '.join(map(str, HEAD_DIMS))}")
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3] or q.shape[1] % k.shape[1]:
        raise ValueError(f"heads: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; allowed: same batch, "
                         "k and v alike, heads_q a multiple of heads_kv")


def _unit_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _set_allocator(device: torch.device) -> None:
    """TMA descriptors built in the kernel need a scratch buffer; Triton asks for it per launch (per thread)."""
    if device.type == "cuda" and hasattr(triton, "set_allocator"):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))


def _run(tuned, raw, name: str, grid, args: tuple, meta: dict, config, compile_only: bool):
    """Launch ``tuned`` (autotuned) or ``raw`` with one config; keep the compiled kernel for the report."""
    if config is None:
        last_compiled[name] = tuned[grid](*args, **meta)
        return
    meta = dict(meta, **config.all_kwargs())
    if compile_only:
        raw.warmup(*args, grid=grid(meta) if callable(grid) else grid, **meta)
    else:
        last_compiled[name] = raw[grid](*args, **meta)


def _fwd_launch(fp8: bool, q, k, v, qs, ks, vs, *, causal: bool, scale: float, scale_rows: int,
                out_dtype: torch.dtype, config, compile_only: bool):
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    o = torch.empty((b, hq, sq, d), dtype=out_dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    _set_allocator(q.device)
    n_scale_q = qs.shape[-1] if fp8 else 0
    n_scale_kv = ks.shape[-1] if fp8 else 0

    def grid(meta):
        return triton.cdiv(sq, meta["BLOCK_M"]), b * hq

    args = (q, k, v, o, lse, qs, ks, vs, None, None, scale, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            hq, hq // hkv, sq, skv, n_scale_q, n_scale_kv)
    meta = dict(HEAD_DIM=d, CAUSAL=causal, FP8=fp8, SCALE_ROWS=scale_rows, VARLEN=False)
    tuned = fwd_kernels.attn_fwd_fp8 if fp8 else fwd_kernels.attn_fwd
    _run(tuned, fwd_kernels._attn_fwd, "_attn_fwd_fp8" if fp8 else "_attn_fwd", grid, args, meta, config, compile_only)
    return o, lse


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float, config=None,
            compile_only: bool = False):
    """(O, LSE) of softmax(q k^T * scale) v; bottom-right causal mask when ``causal``."""
    check_inputs(q, k, v)
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    return _fwd_launch(False, q, k, v, None, None, None, causal=causal, scale=scale, scale_rows=0, out_dtype=q.dtype,
                       config=config, compile_only=compile_only)


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_kv: torch.Tensor, *, max_seqlen_q: int, max_seqlen_kv: int, causal: bool, scale: float,
                   config=None):
    """(O, LSE) of a packed ragged batch: q (1, Hq, total_q, D), k and v (1, Hkv, total_kv, D), sequence
    ``b`` at rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (int32); causal bottom-right per sequence. O is
    (1, Hq, total_q, D), LSE (1, Hq, total_q)."""
    check_inputs(q, k, v)
    if q.shape[0] != 1 or cu_seqlens_q.dtype != torch.int32 or cu_seqlens_kv.shape != cu_seqlens_q.shape:
        raise ValueError(f"varlen inputs: q {tuple(q.shape)} with cu_seqlens {tuple(cu_seqlens_q.shape)} "
                         f"{cu_seqlens_q.dtype} / {tuple(cu_seqlens_kv.shape)}; allowed: one packed batch row, "
                         "int32 offsets of equal length")
    q, k, v = _unit_stride(q), _unit_stride(k), _unit_stride(v)
    _, hq, total_q, d = q.shape
    hkv, batch = k.shape[1], cu_seqlens_q.numel() - 1
    o = torch.empty((1, hq, total_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((1, hq, total_q), dtype=torch.float32, device=q.device)

    def grid(meta):
        return triton.cdiv(max_seqlen_q, meta["BLOCK_M"]), batch * hq

    args = (q, k, v, o, lse, None, None, None, cu_seqlens_q, cu_seqlens_kv, scale, *q.stride(), *k.stride(),
            *v.stride(), *o.stride(), hq, hq // hkv, max_seqlen_q, max_seqlen_kv, 0, 0)
    meta = dict(HEAD_DIM=d, CAUSAL=causal, FP8=False, SCALE_ROWS=0, VARLEN=True)
    _run(fwd_kernels.attn_fwd, fwd_kernels._attn_fwd, "_attn_fwd", grid, args, meta, config, False)
    return o, lse


def fp8_forward(q: Quantized, k: Quantized, v: Quantized, *, causal: bool, scale: float, out_dtype: torch.dtype,
                config=None, compile_only: bool = False):
    """(O, LSE) from block-quantised e4m3 inputs (:func:`attnbench.kernels.triton.fp8.quantize_qkv`)."""
    check_inputs(q.data, k.data, v.data, dtypes=(torch.float8_e4m3fn,))
    if not q.block_rows == k.block_rows == v.block_rows:
        raise ValueError(f"block_rows={q.block_rows}/{k.block_rows}/{v.block_rows} is not allowed; allowed: equal")
    return _fwd_launch(True, q.data, k.data, v.data, q.scale, k.scale, v.scale, causal=causal, scale=scale,
                       scale_rows=q.block_rows, out_dtype=out_dtype, config=config, compile_only=compile_only)


def _pick_dq_mode(run_path, key: tuple) -> str:
    """The faster dQ path for this shape, timed once per key on the GPU (the first of DQ_MODES elsewhere)."""
    if key not in dq_modes:
        if INTERPRET or not torch.cuda.is_available():
            return DQ_MODES[0]
        times = {}
        for mode in DQ_MODES:
            run_path(mode)  # autotunes the path's kernels first
            times[mode] = quick_bench(lambda: run_path(mode), quantiles=None)
        dq_modes[key] = min(times, key=times.get)
    return dq_modes[key]


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse: torch.Tensor, *, causal: bool, scale: float, dq_mode: str | None = None, config=None,
             dq_config=None, compile_only: bool = False):
    """(dQ, dK, dV) given the forward's inputs, output and log-sum-exp.

    ``dq_mode`` picks the dQ path (``tuning.DQ_MODES``): ``"atomic"`` (one kernel, dQ added with atomics) or
    ``"separate"`` (a dK/dV kernel, then a dQ kernel); ``None`` times both once per shape on a GPU and keeps the
    faster (``dq_modes``). ``config`` is the config of ``_attn_bwd`` (either path), ``dq_config`` that of
    ``_attn_bwd_dq``; with ``compile_only`` only the kernels given a config are compiled.
    """
    q, k, v, do = _unit_stride(q), _unit_stride(k), _unit_stride(v), _unit_stride(do)
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    if dq_mode is None and compile_only:
        raise ValueError("compile_only needs dq_mode ('atomic' or 'separate'): it compiles one path's kernels")
    if dq_mode is None:
        dq_mode = _pick_dq_mode(lambda mode: backward(do, q, k, v, o, lse, causal=causal, scale=scale, dq_mode=mode,
                                                      config=config, dq_config=dq_config),
                                (sq, skv, hq // hkv, d, q.dtype, causal))
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode={dq_mode!r} is not allowed; allowed: {', '.join(DQ_MODES)} or None")
    atomic = dq_mode == "atomic"
    for name in ("_attn_bwd", "_attn_bwd_dkdv", "_attn_bwd_dq"):  # keep only this call's backward kernels
        last_compiled.pop(name, None)
    delta = torch.empty_like(lse)
    pre_grid = (triton.cdiv(sq, PREPROCESS_ROWS), b * hq)
    last_compiled["_attn_bwd_preprocess"] = bwd_kernels._attn_bwd_preprocess[pre_grid](
        o, do, delta, *o.stride(), *do.stride(), hq, sq, HEAD_DIM=d, BLOCK_M=PREPROCESS_ROWS)
    dq_acc = torch.zeros((b, hq, sq, d), dtype=torch.float32, device=q.device) if atomic else None
    dk = torch.empty((b, hkv, skv, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((b, hkv, skv, d), dtype=v.dtype, device=v.device)

    def grid(meta):
        return triton.cdiv(skv, meta["BLOCK_N"]), b * hkv

    args = (q, k, v, do, lse, delta, dq_acc, dk, dv, scale,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(), hkv, hq // hkv, sq, skv)
    meta = dict(HEAD_DIM=d, CAUSAL=causal, DQ_ATOMIC=atomic)
    if config is not None or not compile_only:
        _run(bwd_kernels.attn_bwd if atomic else bwd_kernels.attn_bwd_dkdv, bwd_kernels._attn_bwd,
             "_attn_bwd" if atomic else "_attn_bwd_dkdv", grid, args, meta, config, compile_only)
    if atomic:
        return dq_acc.to(q.dtype), dk, dv

    dq = torch.empty_like(q)

    def dq_grid(meta):
        return triton.cdiv(sq, meta["BLOCK_M"]), b * hq

    dq_args = (q, k, v, do, lse, delta, dq, scale, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
               hq, hq // hkv, sq, skv)
    if dq_config is not None or not compile_only:
        _run(bwd_kernels.attn_bwd_dq, bwd_kernels._attn_bwd_dq, "_attn_bwd_dq", dq_grid, dq_args,
             dict(HEAD_DIM=d, CAUSAL=causal), dq_config, compile_only)
    return dq, dk, dv
