"""Where and with what a row was measured: device, clocks, versions, commit, kernels that ran."""
from __future__ import annotations

import datetime
import functools
import os
import platform
import shutil
import socket
import subprocess
from typing import Callable

import torch

from attnbench.bench.gpu import current_gpu, open_nvml


def _run(cmd: list[str], cwd: str | None = None) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def git_sha() -> str:
    """``ATTNBENCH_GIT_SHA`` when set (copies without .git, e.g. a remote GPU host), else git's HEAD."""
    env = os.environ.get("ATTNBENCH_GIT_SHA")
    if env:
        return env
    sha = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=os.path.dirname(__file__))
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=os.path.dirname(__file__))
    return f"{sha}{'-dirty' if sha and dirty else ''}" or "unknown"


def sm_clock_mhz() -> float:
    """Current SM clock of the GPU torch uses, via NVML (or nvidia-smi); NaN where neither answers."""
    if not torch.cuda.is_available():
        return float("nan")
    opened = open_nvml()
    if opened is not None:
        nvml, handle = opened
        try:
            return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        except nvml.NVMLError:
            pass
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", current_gpu()])
        try:
            return float(out.splitlines()[0])
        except (ValueError, IndexError):
            pass
    return float("nan")


@functools.cache
def environment(device: str) -> dict:
    """Typed provenance fields that go into every row (they survive aggregation, unlike a metadata bag)."""
    info = {
        "device": device,
        "device_name": platform.processor() or platform.machine(),
        "driver": "",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "cudnn_version": str(torch.backends.cudnn.version() or "") if torch.backends.cudnn.is_available() else "",
        "triton_version": "",
        "python_version": platform.python_version(),
        "git_sha": git_sha(),
        "host": socket.gethostname(),
        "gpu": "",
    }
    try:
        import triton

        info["triton_version"] = triton.__version__
    except ImportError:
        pass
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name()
        info["gpu"] = current_gpu()
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                               info["gpu"]]).split("\n")[0]
    else:
        info["device_name"] = f"CPU {platform.machine()} x{torch.get_num_threads()} threads"
    return info


def timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def kernel_names(fn: Callable, device: str) -> list[str]:
    """Names of the device kernels (CUDA) or ATen ops (CPU) one call of ``fn`` ran, in order, deduplicated."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    names = []
    for event in prof.events():
        is_kernel = event.device_type == torch.autograd.DeviceType.CUDA if device == "cuda" else event.name.startswith("aten::")
        if is_kernel and event.name not in names:
            names.append(event.name)
    return names
