"""GPU lease (DESIGN.md, "Where it runs"): one device per job (or N for a multi-GPU job), host-wide.

Snakemake's ``gpu`` resource is only a scheduler token and it never sets
``CUDA_VISIBLE_DEVICES``. A job that needs a GPU takes an exclusive ``fcntl`` lock on one file per
device (host-wide, under ``$ATTNBENCH_LOCK_DIR`` or the temp folder), sets ``CUDA_VISIBLE_DEVICES``
to that device for its child, and holds the lock until the child exits. With ``--resources gpu=N``
equal to the number of GPUs, a free device always exists; a job that finds none waits. A job that
asks for ``count`` devices (the context-parallel stage's N ranks) takes all of them or none: it
releases what it locked when it cannot get the rest, so two such jobs never hold half each.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path

LOCK_DIR_ENV = "ATTNBENCH_LOCK_DIR"


def visible_devices() -> list[str]:
    """Device ids this process may lease: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def lock_dir() -> Path:
    path = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "attnbench-gpu-locks")
    path.mkdir(parents=True, exist_ok=True)
    return path


def try_lease(devices: list[str]) -> tuple[str, object] | None:
    """Lock the first free device; returns (device id, open lock file) or None when all are taken."""
    for device in devices:
        handle = open(lock_dir() / f"gpu-{device}.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return device, handle
    return None


def _release(handles) -> None:
    for handle in handles:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def try_lease_many(devices: list[str], count: int) -> list[tuple[str, object]] | None:
    """Lock ``count`` free devices, or none (what was locked is released): a list of (id, lock file)."""
    held = []
    free = list(devices)
    while len(held) < count:
        lease = try_lease(free)
        if lease is None:
            _release(h for _, h in held)
            return None
        held.append(lease)
        free = free[free.index(lease[0]) + 1:]
    return held


@contextlib.contextmanager
def gpu_lease(poll_s: float = 1.0, count: int = 1):
    """Yield the leased device ids, comma-joined (one id for ``count=1``); blocks until enough are free.
    Errors if this host has no GPU, or fewer than ``count``."""
    devices = visible_devices()
    if not devices:
        raise RuntimeError("a GPU lease was asked for, but no CUDA device is visible")
    if count > len(devices):
        raise RuntimeError(f"a lease of {count} GPUs was asked for; this host shows {len(devices)}")
    leases = try_lease_many(devices, count)
    while leases is None:
        time.sleep(poll_s)
        leases = try_lease_many(devices, count)
    try:
        yield ",".join(device for device, _ in leases)
    finally:
        _release(h for _, h in leases)
