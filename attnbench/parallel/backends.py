"""The stage's backends: ring attention over each block kernel, and PyTorch's context_parallel per rotation.

* ``ring-<kernel>`` (``ring-math``, ``ring-sdpa-flash``, ``ring-sdpa-cudnn``, ``ring-fa4``,
  ``ring-triton``): :mod:`attnbench.parallel.ring` with that block kernel; every sharding, dense or
  packed documents (striped: dense only).
* ``torch-cp-allgather``, ``torch-cp-alltoall``: :mod:`attnbench.parallel.torch_cp`.

:meth:`CPBackend.prepare` turns the whole sequence's inputs (every rank draws the same) into this
rank's shards and returns a :class:`Prepared`: the timed call, the serialised call the phase timer
measures (ring only), and a call that hands back the output and gradient shards for the numerics.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

import torch

from attnbench.case import Case, Tensors
from attnbench.parallel import torch_cp
from attnbench.parallel.comm import PhaseTimer
from attnbench.parallel.documents import Documents
from attnbench.parallel.kernels import KERNELS, BlockKernel, get_kernel
from attnbench.parallel.ring import Ring, comm_bytes, ring_attention
from attnbench.parallel.sharding import Sharding


@dataclass
class Prepared:
    """One (case, sharding, backend) on this rank, ready to run."""

    run: Callable[[], object]  # one call as timed: forward, or forward + backward
    result: Callable[[], tuple[torch.Tensor, tuple | None]]  # output shard (+ dq, dk, dv shards), BHSD, local order
    layout: Sharding  # how the shards map to global positions (for unsharding)
    serialised: Callable[[PhaseTimer], None] | None = None  # the call with every exchange waited for, timed
    comm_bytes: float = float("nan")  # bytes this rank sends per call
    n_blocks: float = float("nan")  # kernel calls of this rank per forward (ring)
    close: Callable[[], None] = field(default=lambda: None)


def _differentiate(out: torch.Tensor, inputs: tuple, dout: torch.Tensor | None):
    return torch.autograd.grad(out, inputs, dout) if dout is not None else None


class CPBackend:
    name: str = ""
    kernel_name: str = ""  # the per-block kernel

    def kernel(self) -> BlockKernel:
        return get_kernel(self.kernel_name)

    def version(self) -> str:
        return self.kernel().version()

    def available(self, device: str) -> tuple[bool, str]:
        return self.kernel().available()

    def supports(self, case: Case, sharding: str, documents: Documents | None) -> tuple[bool, str]:
        return self.kernel().supports(case)

    def prepare(self, case: Case, full: Tensors, sharding: Sharding, documents: Documents | None,
                rank: int) -> Prepared:
        raise NotImplementedError


class RingBackend(CPBackend):
    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.name = f"ring-{kernel_name}"

    def supports(self, case, sharding, documents):
        if sharding == "striped" and documents is not None:
            return False, ("striped sharding of packed documents is not planned (striping interleaves every "
                           "document across every rank); allowed: contiguous or zigzag")
        return self.kernel().supports(case)

    def prepare(self, case, full, sharding, documents, rank):
        kernel = self.kernel()
        sd = kernel.seq_dim

        def local(x):  # BHSD whole sequence -> this rank's shard in the kernel's layout
            x = x if kernel.layout == "bhsd" else x.transpose(1, 2)
            return sharding.shard(x.detach(), rank, sd)

        grad = case.has_backward
        q, k, v = (local(x).requires_grad_(grad) for x in (full.q, full.k, full.v))
        dout = local(full.dout) if grad else None
        ring = Ring(sharding, rank, kernel, case.causal, case.scale, documents)

        def call(with_ring: Ring):
            out = ring_attention(q, k, v, with_ring)
            return out, _differentiate(out, (q, k, v), dout)

        def serialised(timer: PhaseTimer) -> None:
            call(Ring(sharding, rank, kernel, case.causal, case.scale, documents, serialize=True, timer=timer))

        def result():
            out, grads = call(ring)

            def bhsd(x):
                return x.detach() if kernel.layout == "bhsd" else x.detach().transpose(1, 2)

            return bhsd(out), (tuple(bhsd(g) for g in grads) if grads else None)

        return Prepared(run=lambda: call(ring), result=result, layout=sharding, serialised=serialised,
                        comm_bytes=comm_bytes(k, v, sharding.world, grad),
                        n_blocks=sum(len(step) for step in ring.steps))


@functools.cache
def _mesh(device_type: str, world: int):
    """One device mesh over the default group per job (making one creates process groups: a collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world,))


class TorchCPBackend(CPBackend):
    kernel_name = torch_cp.SDPA_KERNEL

    def __init__(self, rotation: str):
        self.rotation = rotation
        self.name = f"torch-cp-{rotation}"

    def available(self, device: str) -> tuple[bool, str]:
        try:
            from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
        except ImportError as err:
            return False, f"torch {torch.__version__} has no context_parallel ({err})"
        if device != "cuda":
            return False, torch_cp.CPU_REASON
        return True, ""

    def supports(self, case, sharding, documents):
        why = torch_cp.blocker(sharding, case.causal, documents)
        return (False, why) if why else (True, "")

    def prepare(self, case, full, sharding, documents, rank):
        device = full.q.device
        positions = torch.arange(sharding.total, device=device)
        stack = contextlib.ExitStack()
        stack.enter_context(torch_cp.sharded(_mesh(device.type, sharding.world), positions, rotation=self.rotation,
                                             load_balance=sharding.name == "zigzag"))
        if not torch.equal(positions, sharding.positions(rank, device)):
            stack.close()
            raise RuntimeError(f"PyTorch's context_parallel holds other positions on rank {rank} than "
                               f"{sharding.name} sharding")
        grad = case.has_backward
        q, k, v = (sharding.shard(x.detach(), rank, 2).requires_grad_(grad) for x in (full.q, full.k, full.v))
        dout = sharding.shard(full.dout, rank, 2) if grad else None

        def call():
            out = torch_cp.attention(q, k, v, causal=case.causal, scale=case.scale)
            return out, _differentiate(out, (q, k, v), dout)

        def result():
            out, grads = call()
            return out.detach(), grads

        return Prepared(run=call, result=result, layout=sharding, close=stack.close)


CP_BACKENDS: dict[str, CPBackend] = {
    b.name: b for b in [*(RingBackend(k) for k in KERNELS), *(TorchCPBackend(r) for r in torch_cp.ROTATIONS)]}


def get_cp_backend(name: str) -> CPBackend:
    if name not in CP_BACKENDS:
        raise KeyError(f"context-parallel backend {name!r} is not known; allowed: {', '.join(CP_BACKENDS)}")
    return CP_BACKENDS[name]
