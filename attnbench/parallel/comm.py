"""The ring's point-to-point exchange, and the timer that splits a call into computation and communication.

Every ring step sends the buffer a rank holds to the next rank and receives the previous rank's
into a second buffer (``torch.distributed.batch_isend_irecv``: NCCL groups the two into one
launch; gloo runs them on its own threads). The exchange is posted before the step's blocks are
computed and waited for after them, so the transfer overlaps the computation (double buffering).

:class:`PhaseTimer` measures a call in its *serialised* form, where the ring waits for each
exchange before computing (``serialize=True`` in :mod:`attnbench.parallel.ring`): on CUDA with
CUDA events recorded on the compute stream around each block (computation) and around posting
and waiting for each exchange (communication: the wait makes the stream wait for NCCL's);
on CPU with ``time.perf_counter`` around the same spans (gloo calls block, CPU kernels are
synchronous), labelled as wall-clock time.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

PHASES = ("compute", "comm")


def post_exchange(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int) -> list:
    """Post sending ``send`` to rank + 1 and receiving rank - 1's into ``recv`` (default group); the works."""
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    return dist.batch_isend_irecv(ops)


def wait(works: list | None) -> None:
    for work in works or ():
        work.wait()


class PhaseTimer:
    """Time per phase (computation, communication) of the calls made while it is attached to a ring."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.method = "cuda-events" if self.cuda else "wall-clock"
        self.spans: dict[str, list] = {phase: [] for phase in PHASES}

    @contextlib.contextmanager
    def span(self, phase: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans[phase].append((start, end))
        else:
            start = time.perf_counter()
            yield
            self.spans[phase].append(time.perf_counter() - start)

    def totals_s(self) -> dict[str, float]:
        """Seconds spent in each phase since the last :meth:`reset` (waits for the GPU first)."""
        if self.cuda:
            torch.cuda.synchronize()
            return {p: sum(s.elapsed_time(e) for s, e in spans) / 1e3 for p, spans in self.spans.items()}
        return {p: sum(spans) for p, spans in self.spans.items()}

    def reset(self) -> None:
        self.spans = {phase: [] for phase in PHASES}


def kernel_time_split(fn) -> dict[str, float]:
    """Seconds of GPU kernel time in one call of ``fn``, split into NCCL kernels (communication) and the
    rest (computation), from the PyTorch profiler: for a call with no hook between its exchanges and its
    blocks (PyTorch's context_parallel). Kernel times are summed, so overlapping kernels count in full."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spent = {phase: 0.0 for phase in PHASES}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            phase = "comm" if "nccl" in event.name.lower() else "compute"
            spent[phase] += event.time_range.elapsed_us() / 1e6
    return spent


def span(timer: PhaseTimer | None, phase: str):
    """The timer's span, or nothing when no timer is attached."""
    return timer.span(phase) if timer is not None else contextlib.nullcontext()
