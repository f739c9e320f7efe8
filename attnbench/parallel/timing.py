"""Timing a call that every rank makes together: fixed repetitions, each the slowest rank's time.

``triton.testing.do_bench`` and ``torch.utils.benchmark`` size their repetitions from a first
estimate, which differs between ranks; a rank that calls once more than the others would wait
forever on a collective. So every rank runs ``warmup`` untimed calls, then ``reps`` calls, each
after a barrier (the ranks start together) and timed with CUDA events around the call on CUDA,
``time.perf_counter`` on CPU (CPU kernels are synchronous; gloo waits block). A repetition of
the sharded call lasts as long as its slowest rank, so the sample is the maximum over ranks; the
statistics are :class:`attnbench.bench.timing.Timing`'s. No L2 flush: each call moves
megabytes to gigabytes per rank, far past the 50 MB L2 of an H200.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from attnbench.bench.timing import Timing


def comm_device() -> str:
    """Where collectives of the default group take their tensors: CUDA for NCCL, CPU for gloo."""
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def gather_floats(values: list[float]) -> list[list[float]]:
    """Every rank's list of floats (all of one length), in rank order, on every rank."""
    mine = torch.tensor(values, dtype=torch.float64, device=comm_device())
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return [p.tolist() for p in parts]


def agree(ok: bool) -> bool:
    """True when every rank says ok (one all-reduce): the ranks leave a failing case together."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0


def time_ranks(fn: Callable[[], object], device: str, warmup: int, reps: int) -> tuple[Timing, list[float]]:
    """(Timing of the slowest rank per repetition, this rank's own seconds per repetition)."""
    cuda = device == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    mine = []
    for _ in range(reps):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            mine.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            mine.append(time.perf_counter() - t0)
    per_rank = gather_floats(mine)
    slowest = tuple(max(rank[i] for rank in per_rank) for i in range(reps))
    method = "cuda-events, slowest rank" if cuda else "wall-clock, slowest rank"
    return Timing(method, slowest), mine
