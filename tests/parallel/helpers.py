"""Run a function on N gloo ranks (forked processes: spawning re-imports torch, 20 s a rank on a loaded CI
machine), and the masked fp64 reference the ring tests use."""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attnbench.parallel.documents import Documents


def _entry(rank: int, world: int, init_file: str, fn, args, backend: str = "gloo") -> None:
    torch.set_num_threads(1)  # two cores shared by every rank
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60 if backend == "gloo" else 300))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, tmp_path, fn, *args, backend: str = "gloo") -> None:
    """``fn(rank, world, *args)`` on ``world`` processes of one process group (gloo: forked; nccl: spawned,
    one GPU a rank, since CUDA cannot be used in a forked child); a failing rank fails the test."""
    init_file = os.path.join(str(tmp_path), f"init-{world}-{fn.__name__}")
    method = "spawn" if backend == "nccl" else "fork"
    mp.start_processes(_entry, args=(world, init_file, fn, args, backend), nprocs=world, join=True,
                       start_method=method)


def masked_reference(q, k, v, do, causal: bool, scale: float, documents: Documents | None):
    """fp64 softmax attention under the (document-)causal mask, BHSD; returns (out, (dq, dk, dv))."""
    q, k, v = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s, device = q.shape[2], q.device
    i, j = torch.arange(s, device=device)[:, None], torch.arange(s, device=device)[None, :]
    visible = (j <= i) if causal else torch.ones(s, s, dtype=torch.bool, device=device)
    if documents is not None:
        doc = torch.repeat_interleave(torch.arange(len(documents.lengths), device=device),
                                      torch.tensor(documents.lengths, device=device))
        visible = visible & (doc[:, None] == doc[None, :])
    scores = (q @ kr.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    out = scores.softmax(-1) @ vr
    grads = torch.autograd.grad(out, (q, k, v), do.double())
    return out.detach(), grads
