"""Whether a training run had its GPU to itself: the lease it ran under, and the processes NVML saw on it.

A run's tokens/s and MFU are its own only if nothing else ran on its GPU meanwhile. The pipeline
gives every GPU job a whole GPU (``attnbench lease``, which holds a host-wide lock per device and
sets ``ATTNBENCH_LEASE`` to ``cuda:<id>`` for its child); this module records that, and checks
it: NVML's list of compute processes on the run's GPU (``nvmlDeviceGetComputeRunningProcesses``) is
sampled when the run starts, at every evaluation and when it ends.

Summary columns: ``gpu_lease`` (the leased device id, empty without a lease), ``gpu_sharing``
(``alone``: no sample saw another process; ``shared``: some did, their process ids in
``gpu_shared_with``; ``unchecked: <why>`` on a CPU or without NVML) and ``gpu_sharing_samples``.
The run's own process is one entry of NVML's list once its CUDA context exists; inside a PID
namespace (a container) NVML reports host process ids, so the own entry cannot be told apart by id:
the count of others is the list's length minus one, and ``gpu_shared_with`` may then hold the run's
own host id. NVML cannot list processes of other containers on some drivers: ``alone`` means no
process was visible, and the lease is what guarantees it inside one pipeline.

A run resumed from a checkpoint is one run over several processes: its checkpoint carries the record so far
(:meth:`GpuSharing.record`, taken up by :meth:`GpuSharing.resume`), so a run that shared its GPU before a cut
is ``shared`` however its last part ran: its tokens/s are over every part's steps.
"""
from __future__ import annotations

import os

from attnbench.bench.gpu import nvml_handle
from attnbench.failures import first_line

from attnbench.bench.telemetry import LEASE_ENV  # noqa: E402  (the lease's one variable)


class GpuSharing:
    """Samples the other compute processes on the run's GPU (see the module docstring)."""

    def __init__(self, device: str):
        self.others: set[int] = set()
        self.samples, self.most_others, self.handle, self.why = 0, 0, None, ""
        self.earlier: dict = {}  # the record of the run's parts before a resume
        if device != "cuda":
            self.why = f"unchecked: a {device} run"
            return
        try:
            _, self.handle = nvml_handle()
        except Exception as err:  # no nvidia-ml-py, no driver access
            self.why = f"unchecked: NVML unavailable ({first_line(err)})"

    def sample(self) -> None:
        if self.handle is None:
            return
        import pynvml

        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception as err:
            self.handle, self.why = None, f"unchecked: NVML process query failed ({type(err).__name__})"
            return
        own = os.getpid()
        self.samples += 1
        self.most_others = max(self.most_others, max(0, len(procs) - 1))  # the run's own context is one of them
        self.others |= {int(p.pid) for p in procs if int(p.pid) != own}

    def resume(self, earlier: dict) -> None:
        """Take up the :meth:`record` of the run's earlier parts (from its checkpoint)."""
        self.earlier = earlier

    def record(self) -> dict:
        """The run's finding so far, every part's (plain values: a checkpoint is loaded with weights_only)."""
        summary = self.summary()
        return {key: summary[key] for key in ("gpu_sharing", "gpu_shared_with", "gpu_sharing_samples")}

    def summary(self) -> dict:
        """``shared`` if any part of the run saw another process, else the first part's ``unchecked: <why>`` if
        any, else ``alone``."""
        own = self.why if self.handle is None and not self.samples else "shared" if self.most_others else "alone"
        earlier = self.earlier.get("gpu_sharing")
        parts = [earlier, own] if earlier else [own]
        sharing = "shared" if "shared" in parts else next((p for p in parts if p != "alone"), "alone")
        others = {int(pid) for pid in self.earlier.get("gpu_shared_with", "").split(",") if pid}
        others |= self.others if self.most_others else set()
        return {"gpu_lease": os.environ.get(LEASE_ENV, "").removeprefix("cuda:"), "gpu_sharing": sharing,
                "gpu_shared_with": ",".join(map(str, sorted(others))),
                "gpu_sharing_samples": self.samples + int(self.earlier.get("gpu_sharing_samples", 0))}
