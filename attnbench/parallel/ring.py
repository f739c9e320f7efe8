"""Ring attention over any block kernel: a ``torch.autograd.Function`` with a ring forward and a ring backward.

Liu et al. 2023 ("Ring Attention with Blockwise Transformers for Near-Infinite Context"): each of
``world`` ranks holds a shard of the queries, keys and values; the key/value shards travel
around the ring, one hop per step, while every rank attends its queries to the shard it holds.

Forward, on rank r: for s = 0 .. world - 1, while the held K/V shard is being sent on to rank
r + 1 and rank r - 1's received (:func:`attnbench.parallel.comm.post_exchange`), compute the
blocks of :func:`attnbench.parallel.blocks.plan_ring` for the shard of rank r - s and fold them
into fp32 accumulators by their log-sum-exp (:mod:`attnbench.parallel.merge`). The output is
cast to the input dtype; the merged log-sum-exp is kept for the backward.

Backward (a true ring backward, not recomputation of the forward): the K/V shards travel the same
way again. At step s rank r computes each block's dQ, dK, dV with the block kernel's backward,
given the *merged* output and log-sum-exp of its rows (exact, see :mod:`attnbench.parallel.kernels`).
dQ accumulates locally. dK and dV belong to the shard's owner: an fp32 accumulator travels with
the shard, one step behind it (rank r receives from r - 1 the accumulator of the shard it holds,
adds its share and sends it on), and after the last step one more hop brings each accumulator
home. The two exchanges of a step (K/V ahead, dK/dV behind) overlap the step's computation.
Per rank and call this sends ``(world - 1)`` K/V shards forward and ``2 (world - 1)`` K/V shards
plus ``world`` fp32 dK/dV shards in forward + backward (:func:`comm_bytes`).

``serialize=True`` waits for each exchange before computing: the form in which
:class:`attnbench.parallel.comm.PhaseTimer` separates communication from computation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.parallel.blocks import Block, plan_ring
from attnbench.parallel.comm import PhaseTimer, post_exchange, span, wait
from attnbench.parallel.documents import Documents
from attnbench.parallel.kernels import BlockKernel
from attnbench.parallel.merge import empty_accumulators, merge_block
from attnbench.parallel.sharding import Sharding


@dataclass
class Ring:
    """What a ring attention call needs besides its tensors (in the kernel's layout, this rank's shard)."""

    sharding: Sharding
    rank: int
    kernel: BlockKernel
    causal: bool
    scale: float
    documents: Documents | None = None
    serialize: bool = False  # wait for every exchange before computing (for PhaseTimer)
    timer: PhaseTimer | None = None
    steps: tuple[tuple[Block, ...], ...] = field(init=False)

    def __post_init__(self):
        self.steps = plan_ring(self.sharding, self.rank, self.causal, self.documents)

    @property
    def world(self) -> int:
        return self.sharding.world

    def start(self, send: torch.Tensor, recv: torch.Tensor):
        """Post one exchange; serialised, wait for it here (timed as communication)."""
        if not self.serialize:
            return post_exchange(send, recv, self.rank, self.world)
        with span(self.timer, "comm"):
            wait(post_exchange(send, recv, self.rank, self.world))
        return None

    def rows(self, x: torch.Tensor, r: tuple[int, int]) -> torch.Tensor:
        return x.narrow(self.kernel.seq_dim, r[0], r[1] - r[0])


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V in one flat buffer, so that a step is one exchange."""
    buf = torch.empty(k.numel() + v.numel(), dtype=k.dtype, device=k.device)
    buf[:k.numel()].copy_(k.reshape(-1))
    buf[k.numel():].copy_(v.reshape(-1))
    return buf


def _unpack(buf: torch.Tensor, k_shape, v_shape) -> tuple[torch.Tensor, torch.Tensor]:
    nk = k_shape.numel()
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def ring_forward(ring: Ring, q, k, v):
    """(output in q's dtype, merged fp32 log-sum-exp (B, Hq, S), the blocks' aux for the backward)."""
    seq_dim = ring.kernel.seq_dim
    out, lse = empty_accumulators(q, v.shape[-1], seq_dim)
    held = _pack(k, v)
    spare = torch.empty_like(held) if ring.world > 1 else None
    auxes = []
    for step, blocks in enumerate(ring.steps):
        works = ring.start(held, spare) if step < ring.world - 1 else None
        k_s, v_s = _unpack(held, k.shape, v.shape)
        for b in blocks:
            with span(ring.timer, "compute"):
                out_b, lse_b, aux = ring.kernel.forward(ring.rows(q, b.q), ring.rows(k_s, b.kv), ring.rows(v_s, b.kv),
                                                        causal=b.causal, scale=ring.scale)
                merge_block(out, lse, b.q, out_b, lse_b, seq_dim)
            auxes.append(aux)
        if step < ring.world - 1:
            wait(works)
            held, spare = spare, held
    return out.to(q.dtype), lse, auxes


def ring_backward(ring: Ring, do, q, k, v, out, lse, auxes):
    """(dQ, dK, dV) of this rank's shards; see the module docstring for the two exchanges per step."""
    dq = torch.zeros_like(q, dtype=torch.float32)
    held = _pack(k, v)
    spare = torch.empty_like(held) if ring.world > 1 else None
    n = held.numel()
    accs = [torch.zeros(n, dtype=torch.float32, device=q.device)]  # dK/dV of the shard held, and the one arriving
    if ring.world > 1:
        accs.append(torch.empty_like(accs[0]))
        part = torch.empty_like(accs[0])
    aux = iter(auxes)
    grad_works = None
    for step, blocks in enumerate(ring.steps):
        kv_works = ring.start(held, spare) if step < ring.world - 1 else None
        k_s, v_s = _unpack(held, k.shape, v.shape)
        into = accs[0] if step == 0 else part.zero_()
        dk_s, dv_s = _unpack(into, k.shape, v.shape)
        for b in blocks:
            with span(ring.timer, "compute"):
                dq_b, dk_b, dv_b = ring.kernel.backward(
                    ring.rows(do, b.q), ring.rows(q, b.q), ring.rows(k_s, b.kv), ring.rows(v_s, b.kv),
                    ring.rows(out, b.q), lse[:, :, b.q[0]:b.q[1]], next(aux), causal=b.causal, scale=ring.scale)
                ring.rows(dq, b.q).add_(dq_b)
                ring.rows(dk_s, b.kv).add_(dk_b)
                ring.rows(dv_s, b.kv).add_(dv_b)
        if ring.world > 1:
            acc = accs[step % 2]
            if step > 0:
                wait(grad_works)  # the accumulator of the held shard, from rank - 1
                acc.add_(part)
            grad_works = ring.start(acc, accs[(step + 1) % 2])
        if step < ring.world - 1:
            wait(kv_works)
            held, spare = spare, held
    wait(grad_works)
    dk, dv = _unpack(accs[ring.world % 2 if ring.world > 1 else 0], k.shape, v.shape)  # home after the last hop
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring):
        out, lse, auxes = ring_forward(ring, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.auxes = ring, auxes
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        return (*ring_backward(ctx.ring, do, q, k, v, out, lse, ctx.auxes), None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring) -> torch.Tensor:
    """This rank's output shard of attention over the whole sharded sequence; differentiable in q, k, v."""
    return _RingAttention.apply(q, k, v, ring)


def comm_bytes(k: torch.Tensor, v: torch.Tensor, world: int, backward: bool) -> float:
    """Bytes one rank sends per call: the K/V shard ``world - 1`` times (twice with the backward), plus
    ``world`` fp32 dK/dV accumulators in the backward."""
    if world == 1:
        return 0.0
    kv = (k.numel() + v.numel()) * k.element_size()
    sent = (world - 1) * kv
    if backward:
        sent += (world - 1) * kv + world * (k.numel() + v.numel()) * 4
    return float(sent)
