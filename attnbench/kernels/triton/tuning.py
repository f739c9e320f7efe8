"""Autotuning spaces for the Triton attention kernels, and the interpreter switch.

Each space is a short list of ``triton.Config`` per head dim: tile sizes,
warps, pipeline stages and, in the forward, the load path (plain pointers,
which Triton pipelines with ``cp.async``, or TMA descriptors). The autotuner
times every config that survives :func:`prune` on the first call of each key
and keeps the fastest, so TMA is used only where it pays.

The lists were chosen from the compiler's resource report for sm_90 with
Triton 3.6 (``docs/triton.md``, "Choosing the configs"): configs whose
register allocation spilled heavily were dropped; 8 warps (two warpgroups
sharing a 128-row Q tile) is the wgmma shape FA3 uses on Hopper. Warp
specialisation (``tl.range(..., warp_specialize=True)``) is not offered: it
failed to compile for this kernel on sm_90 with Triton 3.6, whose
documentation lists it as Blackwell-only.

The backward has two paths for dQ (``DQ_MODES``): ``"atomic"``, one kernel
per key tile adding dQ into an fp32 buffer with atomics (``BWD``), and
``"separate"``, a dK/dV kernel without dQ (``BWD_DKDV``) followed by a dQ
kernel per query tile (``BWD_DQ``). Each kernel is autotuned on its own; which
path runs is decided per shape by the launcher (:func:`.launch.backward`),
which times both whole paths once, since a kernel autotuner would only see the
dK/dV kernel's share of the separate path.

Under ``TRITON_INTERPRET=1`` (kernels run on CPU tensors in numpy) each space
is a single small portable config: the interpreter cannot time configs, and
small tiles keep the CPU tests fast while still leaving partial tiles.
"""
from __future__ import annotations

import os

import triton

# Fixed when the kernels are decorated (import time); Triton < 3.4 has no knobs and reads the variable itself.
INTERPRET = (bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")
             else os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on"))


def _fwd(block_m: int, block_n: int, warps: int, stages: int, tma: bool = False,
         pipeline_qk: bool = False) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "USE_TMA": tma, "PIPELINE_QK": pipeline_qk},
                         num_warps=warps, num_stages=stages)


def _bwd(block_m: int, block_n: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages)


DQ_MODES = ("atomic", "separate")  # the backward's dQ path; the first is the default where none is timed

if INTERPRET:
    FWD = {d: [_fwd(32, 16, 4, 1)] for d in (32, 64, 128)}
    BWD = {d: [_bwd(16, 32, 4, 1)] for d in (32, 64, 128)}
    BWD_DKDV = BWD
    BWD_DQ = {d: [_bwd(32, 16, 4, 1)] for d in (32, 64, 128)}
    FP8 = FWD
else:
    # deeper TMA pipelines (spill-free for sm_90, D128 128x128 x3: 225 of 227 KB shared), then Q K^T issued one tile
    # ahead of the softmax (PIPELINE_QK; TMA only: with pointer loads it sits at 255 registers at D128; ptxas
    # serialises its wgmma, docs/triton.md, so it is offered for the GPU to time, not expected to win); last, one
    # warpgroup per program on a 64-row query tile, small enough in registers and shared memory (D128: 139-182
    # registers, 80-112 KB) that two programs share an SM and, not synchronised with each other, can overlap one's
    # softmax with the other's matmuls (the overlap one program's two lockstep warpgroups do not get). 256-row query
    # tiles (128 rows per warpgroup) were timed on the H200 and never kept: not offered
    _FWD_SMALL = [_fwd(128, 64, 4, 3), _fwd(128, 128, 8, 2), _fwd(128, 64, 8, 3, tma=True),
                  _fwd(128, 128, 8, 2, tma=True), _fwd(128, 128, 8, 3, tma=True), _fwd(128, 64, 8, 4, tma=True),
                  _fwd(128, 64, 8, 3, tma=True, pipeline_qk=True), _fwd(64, 64, 4, 3), _fwd(64, 128, 4, 3, tma=True)]
    _BWD_SMALL = [_bwd(64, 128, 8, 2), _bwd(64, 128, 8, 3), _bwd(64, 64, 4, 3)]
    FWD = {32: _FWD_SMALL, 64: _FWD_SMALL,
           128: [_fwd(128, 64, 8, 3), _fwd(128, 128, 8, 2), _fwd(128, 64, 8, 3, tma=True),
                 _fwd(128, 128, 8, 2, tma=True), _fwd(128, 128, 8, 3, tma=True), _fwd(128, 64, 8, 4, tma=True),
                 _fwd(128, 64, 8, 3, tma=True, pipeline_qk=True), _fwd(64, 64, 4, 2), _fwd(64, 64, 4, 3),
                 _fwd(64, 64, 4, 2, tma=True)]}
    BWD = {32: _BWD_SMALL, 64: _BWD_SMALL, 128: [_bwd(64, 64, 8, 2), _bwd(64, 64, 8, 3), _bwd(64, 128, 8, 2)]}
    # the separate dQ path: every config here compiles without spills for sm_90 (docs/triton.md); a 32-row
    # query tile in the dK/dV kernel is fine (its wgmma rows are keys), in _attn_bwd it falls back to HMMA for dQ
    _DKDV_SMALL = [_bwd(64, 128, 8, 2), _bwd(64, 128, 8, 3), _bwd(128, 128, 8, 2), _bwd(32, 128, 8, 3)]
    _DQ_SMALL = [_bwd(128, 64, 8, 3), _bwd(128, 128, 8, 2), _bwd(128, 32, 8, 4), _bwd(64, 64, 4, 3)]
    BWD_DKDV = {32: _DKDV_SMALL, 64: _DKDV_SMALL,
                128: [_bwd(64, 64, 8, 2), _bwd(64, 64, 8, 3), _bwd(64, 128, 8, 2), _bwd(32, 128, 8, 3)]}
    BWD_DQ = {32: _DQ_SMALL, 64: _DQ_SMALL,
              128: [_bwd(128, 64, 8, 2), _bwd(128, 64, 8, 3), _bwd(128, 32, 8, 4), _bwd(64, 64, 4, 3)]}
    # the 64-row tiles: two programs per SM (D128: 205-226 registers, 58-108 KB), inside one 128-row scale block
    _FP8 = [_fwd(128, 128, 8, 2), _fwd(128, 128, 8, 3, tma=True), _fwd(128, 64, 8, 3, tma=True),
            _fwd(64, 128, 4, 3, tma=True), _fwd(64, 64, 4, 3, tma=True)]
    FP8 = {32: _FP8, 64: _FP8, 128: _FP8}


def quick_bench(kernel_call, quantiles):
    """The autotuner's timer: ``do_bench`` with short warm-up and repetition (each new key times every config)."""
    from triton.testing import do_bench

    return do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def union(table: dict) -> list:
    """Every config of a per-head-dim table once, in order (the autotuner's full list)."""
    seen: list = []
    for configs in table.values():
        seen += [c for c in configs if all(c is not s for s in seen)]
    return seen


def _tma_ok(named_args: dict) -> bool:
    """TMA needs sm_90+, Triton's in-kernel descriptors, 16-byte aligned bases and row strides."""
    import torch
    import triton.language as tl

    tensors = [named_args[name] for name in ("Q", "K", "V", "O")]
    if not hasattr(tl, "make_tensor_descriptor") or not tensors[0].is_cuda:
        return False
    if named_args.get("CU_Q") is not None:  # the varlen path loads through pointers
        return False
    if torch.cuda.get_device_capability(tensors[0].device)[0] < 9:
        return False
    return all(t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0 for s in t.stride() if s != 1)
               for t in tensors)


def pruner(table: dict):
    """An ``early_config_prune`` keeping the table's configs for this head dim that this call can use."""
    def prune(configs: list, named_args: dict, **kwargs) -> list:
        head_dim, scale_rows = kwargs["HEAD_DIM"], kwargs.get("SCALE_ROWS", 0)
        mine = [c for c in configs if any(c is t for t in table[head_dim])]
        if any(c.kwargs.get("USE_TMA") for c in mine) and not _tma_ok(named_args):
            mine = [c for c in mine if not c.kwargs.get("USE_TMA")]
        if scale_rows:  # an fp8 tile must lie inside one scale block
            mine = [c for c in mine if scale_rows % c.kwargs["BLOCK_M"] == 0 and scale_rows % c.kwargs["BLOCK_N"] == 0]
        if not mine:
            raise ValueError(f"no kernel config fits HEAD_DIM={head_dim}, SCALE_ROWS={scale_rows}")
        return mine
    return prune


# Each kernel variant's autotuning table by kind (bwd: the atomic dQ path's kernel; dkdv, dq: the separate path's
# two kernels), for the tools that walk every config (the sm_90 compiler report, the GPU script's precompilation)
TABLES = {"fwd": FWD, "bwd": BWD, "dkdv": BWD_DKDV, "dq": BWD_DQ, "fp8": FP8}
