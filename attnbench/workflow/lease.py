"""The timing lease (DESIGN.md, "Where it runs"): one timing job per device, host-wide.

Every job that times something runs under ``attnbench lease --device <cpu|cuda> -- <command>``
(common.smk's ``LEASE``), whatever Snakemake's ``--cores`` or ``--resources`` say, and whichever
sweep it belongs to:

* **cuda**: an exclusive ``fcntl`` lock on one file per GPU (``gpu-<id>.lock``) among the devices
  this job may use (:func:`visible_devices`); the command gets ``CUDA_VISIBLE_DEVICES`` set to that
  device, since Snakemake's ``gpu`` resource is only a scheduler token. With ``--resources gpu=N``
  equal to the number of GPUs a free device always exists within one sweep; a second sweep on the
  same host waits for one. A job of N ranks (the context-parallel stage) asks for ``gpus=N``
  (``attnbench lease --gpus N``): it takes N devices or none, releasing what it locked when it cannot
  get the rest, so two such jobs never hold half each; ``CUDA_VISIBLE_DEVICES`` lists all N.
* **cpu**: an exclusive lock on ``cpu.lock``, the whole machine: no two timing jobs on one host run
  at once, even when ``--cores`` would let Snakemake start them together or two sweeps run side by
  side. ``--untimed`` (a job that needs the device but times nothing) takes no CPU lock.
* **under SLURM** (profiles/slurm): a GPU job takes the GPUs SLURM assigned it (:func:`scheduler_devices`),
  with no lock file on top, since SLURM already gives each job its own devices; only a job whose
  allocation holds more GPUs than it asks for (several local jobs inside one ``salloc``) leases among them.
  A CPU timing job asks SLURM for its node exclusively (:mod:`attnbench.workflow.resources`) and still
  takes the CPU lock, which is node-local (keep ``$ATTNBENCH_LOCK_DIR`` off shared filesystems, or timing
  jobs on different nodes would wait for each other): it waits only for a timing job SLURM did not start.

A job that must wait says so in one line (who holds the lock) and blocks until it is free. The
locks live in ``$ATTNBENCH_LOCK_DIR`` (default ``<tmp>/attnbench-locks``), shared by every sweep
of the host; a lock is released when its holder exits, however it exits. The command gets
``ATTNBENCH_LEASE`` (``cpu`` or ``cuda:<id>[,<id>...]``), so rows record that they were timed under the lock
(``timing_lock``) and a nested ``attnbench lease`` (a command that itself calls one) runs directly
under its parent's lease instead of waiting for itself.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from attnbench.bench.telemetry import LEASE_ENV

LOCK_DIR_ENV = "ATTNBENCH_LOCK_DIR"
CPU_LOCK = "cpu.lock"
POLL_S = 1.0


def lock_dir() -> Path:
    path = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "attnbench-locks")
    path.mkdir(parents=True, exist_ok=True)
    return path


def scheduler_devices() -> list[str] | None:
    """GPUs a batch scheduler has already given this job, which the lease then takes as they are.

    In a SLURM job (``$SLURM_JOB_ID``: the SLURM executor's jobs, profiles/slurm) the devices are SLURM's:
    ``CUDA_VISIBLE_DEVICES`` as SLURM set it for the job's gres, else ``SLURM_STEP_GPUS`` or
    ``SLURM_JOB_GPUS``; an empty list when SLURM gave the job none. None outside SLURM: lease among
    :func:`visible_devices`. SLURM owns exclusivity on its nodes, so :func:`gpu_lease` locks nothing when
    the job holds exactly the GPUs it asks for.
    """
    from attnbench.envvars import check_environment

    env = check_environment()
    if env["SLURM_JOB_ID"] is None:
        return None
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if env[name] is not None:
            return env[name]
    return []


def visible_devices() -> list[str]:
    """Device ids this process may lease: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _try_lock(path: Path):
    """The open, exclusively locked file, or None when another process holds it."""
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}\n")
    handle.flush()
    return handle


def holder(path: Path) -> str:
    """Who holds a lock, as its holder wrote it ("pid 123: attnbench lease ..."); '' when unknown."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def try_lease(devices: list[str]) -> tuple[str, object] | None:
    """Lock the first free device; returns (device id, open lock file) or None when all are taken."""
    for device in devices:
        handle = _try_lock(lock_dir() / f"gpu-{device}.lock")
        if handle is not None:
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
        got = try_lease(free)
        if got is None:
            _release(h for _, h in held)
            return None
        held.append(got)
        free = free[free.index(got[0]) + 1:]
    return held


def _wait(attempt: Callable[[], object], message: Callable[[], str], notify: Callable[[str], None],
          poll_s: float):
    """Call ``attempt`` until it returns something; say once, in one line, why it waits."""
    got = attempt()
    if got is None:
        notify(message())
    while got is None:
        time.sleep(poll_s)
        got = attempt()
    return got


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def gpu_lease(poll_s: float = POLL_S, notify: Callable[[str], None] = _say, count: int = 1) -> Iterator[str]:
    """Yield the leased device ids, comma-joined (one id for ``count=1``); blocks until ``count`` are free at
    once (:func:`try_lease_many`). Errors if this host has no GPU, or fewer than ``count``."""
    given = scheduler_devices()
    if given is not None and len(given) == count:  # SLURM's assignment, taken as it is
        yield ",".join(given)
        return
    if given == []:
        raise RuntimeError(f"a lease of {count} GPU(s) was asked for, but SLURM job {os.environ['SLURM_JOB_ID']} was "
                           "given none; ask for them in the rule's resources (gpu=N, attnbench.workflow.resources)")
    devices = given or visible_devices()  # more than asked for (a shared allocation): leased among them
    if not devices:
        raise RuntimeError("a GPU lease was asked for, but no CUDA device is visible")
    if count < 1 or count > len(devices):
        raise RuntimeError(f"a lease of {count} GPUs was asked for; this host shows {len(devices)}")

    def busy() -> str:
        held = "; ".join(f"GPU {d}: {holder(lock_dir() / f'gpu-{d}.lock') or 'held'}" for d in devices)
        wanted = "a free GPU" if count == 1 else f"{count} free GPUs"
        return f"attnbench lease: waiting for {wanted} among {', '.join(devices)} ({held})"

    leases = _wait(lambda: try_lease_many(devices, count), busy, notify, poll_s)
    try:
        yield ",".join(device for device, _ in leases)
    finally:
        _release(h for _, h in leases)


@contextlib.contextmanager
def cpu_lock(poll_s: float = POLL_S, notify: Callable[[str], None] = _say) -> Iterator[None]:
    """Hold the host's CPU timing lock; blocks (after one line saying who holds it) until it is free."""
    path = lock_dir() / CPU_LOCK
    handle = _wait(lambda: _try_lock(path), lambda: (
        f"attnbench lease: waiting for the CPU timing lock {path} ({holder(path) or 'held'}): another "
        "timing job on this host"), notify, poll_s)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@contextlib.contextmanager
def lease(device: str, untimed: bool = False, notify: Callable[[str], None] = _say, gpus: int = 1) -> Iterator[dict]:
    """The environment a leased command runs with: ``CUDA_VISIBLE_DEVICES`` on a GPU (``gpus`` of them, all or
    none), and ``ATTNBENCH_LEASE``.

    Inside another lease (``ATTNBENCH_LEASE`` already set) nothing is locked again.
    """
    if os.environ.get(LEASE_ENV):
        yield {}
    elif device == "cuda":
        with gpu_lease(notify=notify, count=gpus) as gpu:
            notify(f"attnbench lease: GPU {gpu}")
            yield {"CUDA_VISIBLE_DEVICES": gpu, LEASE_ENV: f"cuda:{gpu}"}
    elif untimed:
        yield {}
    else:
        with cpu_lock(notify=notify):
            yield {LEASE_ENV: "cpu"}


def run_leased(cmd: list[str], device: str, untimed: bool = False, gpus: int = 1) -> int:
    """Run ``cmd`` under :func:`lease`, in its own process group (:func:`attnbench.workflow.process.run`:
    stopped as a whole when the lease is stopped, and when its parent dies); its exit code, or 128 + the
    signal that stopped the lease."""
    from attnbench.workflow import process

    with lease(device, untimed, gpus=gpus) as env:
        try:
            return process.run(cmd, env={**os.environ, **env}).code
        except process.Stopped as stop:
            return 128 + stop.signum
