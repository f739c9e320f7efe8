"""Numerics of a sharded call against fp64 attention on the gathered sequence.

The ranks' output (and gradient) shards are gathered and put back in global order
(:meth:`attnbench.parallel.sharding.Sharding.unshard`); the reference is
:func:`attnbench.bench.numerics.reference` (fp64 eager attention over blocks of query rows) run
document by document on the same inputs in fp64, since documents do not see each other. The
same block kernel's single-device call on the whole sequence, in the case dtype, is the
yardstick of the ratio: ``err_ratio_vs_unsharded`` says how much the sharding and the
log-sum-exp merge add to the kernel's own rounding error (1: nothing).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from attnbench.bench.numerics import Errors, reference
from attnbench.case import Case, Tensors
from attnbench.parallel.documents import Documents
from attnbench.parallel.sharding import Sharding


def gather_shards(x: torch.Tensor, layout: Sharding, seq_dim: int = 2) -> torch.Tensor:
    """Every rank's shard of ``x`` (same shape on every rank), in global order, on every rank."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(layout.world)]
    dist.all_gather(parts, x)
    return layout.unshard(parts, seq_dim)


def document_reference(full64: Tensors, case: Case, documents: Documents | None):
    """fp64 output and (fwd_bwd) gradients of the whole sequence, each document on its own."""
    if documents is None:
        return reference(full64, case)
    outs, grads = [], []
    for start, end in zip(documents.cu_seqlens[:-1], documents.cu_seqlens[1:]):
        def piece(x):
            return None if x is None else x[:, :, start:end]

        part = Tensors(piece(full64.q), piece(full64.k), piece(full64.v), piece(full64.dout))
        out, g = reference(part, replace(case, seq_q=end - start, seq_kv=end - start))
        outs.append(out)
        grads.append(g)
    if not case.has_backward:
        return torch.cat(outs, dim=2), None
    return torch.cat(outs, dim=2), tuple(torch.cat([g[i] for g in grads], dim=2) for i in range(3))


def errors(out: torch.Tensor, grads: tuple | None, ref_out: torch.Tensor, ref_grads: tuple | None):
    """Errors of the output, and of dq, dk, dv when given."""
    return Errors.of(out, ref_out), (tuple(Errors.of(g, r) for g, r in zip(grads, ref_grads)) if grads else None)
