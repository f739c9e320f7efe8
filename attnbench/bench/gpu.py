"""Which GPU torch uses, as NVML and ``nvidia-smi -i`` name it, and NVML's handle of it.

Below :mod:`attnbench.bench.provenance` (the rows' ``gpu`` column, the SM clock) and
:mod:`attnbench.bench.telemetry` (the sampling thread), which both ask NVML about the same device.
torch is imported only when a GPU is asked about: ``attnbench lease``, which wraps every job, imports
the telemetry module for its one variable and must start without it.
"""
from __future__ import annotations

import functools
import os


def gpu_selector(uuid: str, visible: str | None, index: int) -> str:
    """How NVML and ``nvidia-smi -i`` name the GPU torch calls ``index``.

    The UUID when torch knows it: CUDA enumerates fastest-first and after
    ``CUDA_VISIBLE_DEVICES``, NVML in PCI order, so indices need not agree. Else the
    ``CUDA_VISIBLE_DEVICES`` entry for ``index`` (an index or a UUID), else ``index``.
    """
    if uuid:
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index < len(entries):
            return entries[index]
    return str(index)


def current_gpu() -> str:
    """NVML's name (UUID or index) of the GPU torch uses."""
    import torch

    index = torch.cuda.current_device()
    try:
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    except RuntimeError:
        uuid = ""
    return gpu_selector(uuid, os.environ.get("CUDA_VISIBLE_DEVICES"), index)


def nvml_handle():
    """(pynvml, NVML's handle of the GPU torch uses); raises ImportError without nvidia-ml-py, NVMLError
    without a driver or permission, and ValueError for a selector NVML does not know."""
    import pynvml

    pynvml.nvmlInit()
    gpu = current_gpu()
    if gpu.startswith(("GPU-", "MIG-")):
        try:
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(gpu)
        except TypeError:  # older nvidia-ml-py takes bytes
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(gpu.encode())
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(gpu))


@functools.cache
def open_nvml():
    """:func:`nvml_handle`, or None where NVML cannot answer; once per process."""
    try:
        return nvml_handle()
    except Exception:  # ImportError, NVMLError (no driver, no permission) or a selector NVML does not know
        return None
