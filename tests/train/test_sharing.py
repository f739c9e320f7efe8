"""A run's record of whether its GPU was its own: the lease it ran under and the other processes NVML listed."""
import os
import sys
import types

from attnbench.train import sharing


def _fake_nvml(monkeypatch, samples):
    """A pynvml whose process list returns ``samples`` one call after another."""
    calls = iter(samples)
    module = types.SimpleNamespace(nvmlDeviceGetComputeRunningProcesses=lambda handle: [
        types.SimpleNamespace(pid=pid) for pid in next(calls)])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(sharing, "nvml_handle", lambda: (module, "gpu-handle"))


def test_a_run_alone_on_its_leased_gpu(monkeypatch):
    _fake_nvml(monkeypatch, [[os.getpid()]] * 3)
    monkeypatch.setenv(sharing.LEASE_ENV, "cuda:3")
    s = sharing.GpuSharing("cuda")
    for _ in range(3):
        s.sample()
    assert s.summary() == {"gpu_lease": "3", "gpu_sharing": "alone", "gpu_shared_with": "", "gpu_sharing_samples": 3}


def test_another_process_seen_once_makes_the_run_shared(monkeypatch):
    _fake_nvml(monkeypatch, [[os.getpid()], [os.getpid(), 4242], [os.getpid()]])
    monkeypatch.delenv(sharing.LEASE_ENV, raising=False)
    s = sharing.GpuSharing("cuda")
    for _ in range(3):
        s.sample()
    assert s.summary() == {"gpu_lease": "", "gpu_sharing": "shared", "gpu_shared_with": "4242",
                           "gpu_sharing_samples": 3}


def test_inside_a_pid_namespace_the_count_still_leaves_the_run_out(monkeypatch):
    _fake_nvml(monkeypatch, [[91001], [91001]])  # NVML reports the host's id of this very process
    s = sharing.GpuSharing("cuda")
    s.sample(), s.sample()
    assert s.summary()["gpu_sharing"] == "alone"


def test_unchecked_on_a_cpu_and_without_nvml(monkeypatch):
    assert sharing.GpuSharing("cpu").summary()["gpu_sharing"] == "unchecked: a cpu run"

    def broken():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(sharing, "nvml_handle", broken)
    s = sharing.GpuSharing("cuda")
    s.sample()
    assert s.summary()["gpu_sharing"] == "unchecked: NVML unavailable (RuntimeError: NVML Shared Library Not Found)"


def test_a_resumed_run_takes_up_its_earlier_parts(monkeypatch):
    """A checkpoint carries the record: shared in any part is shared; else an unchecked part leaves it unchecked."""
    _fake_nvml(monkeypatch, [[os.getpid(), 4242], [os.getpid()], [os.getpid()]])
    monkeypatch.delenv(sharing.LEASE_ENV, raising=False)
    first = sharing.GpuSharing("cuda")
    first.sample()
    later = sharing.GpuSharing("cuda")
    later.resume(first.record())
    later.sample(), later.sample()
    assert later.summary() == {"gpu_lease": "", "gpu_sharing": "shared", "gpu_shared_with": "4242",
                               "gpu_sharing_samples": 3}
    _fake_nvml(monkeypatch, [[os.getpid()]])
    alone = sharing.GpuSharing("cuda")
    alone.resume(sharing.GpuSharing("cpu").record())
    alone.sample()
    assert alone.summary()["gpu_sharing"] == "unchecked: a cpu run"
