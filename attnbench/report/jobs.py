"""How the workflow runs one job: a GPU lease, and a guard that turns a crashed job into rows.

GPU lease (DESIGN.md, "Where it runs"): Snakemake's ``gpu`` resource is only a
scheduler token and it never sets ``CUDA_VISIBLE_DEVICES``. A job that needs a
GPU takes an exclusive ``fcntl`` lock on one file per device (host-wide, under
``$ATTNBENCH_LOCK_DIR`` or the temp folder), sets ``CUDA_VISIBLE_DEVICES`` to
that device for its child, and holds the lock until the child exits. With
``--resources gpu=N`` equal to the number of GPUs, a free device always exists;
a job that finds none waits.

Guard: a microbench job whose process dies (segfault, OOM kill, a hung kernel
past the sweep deadline) would stop everything that depends on it. The guard
runs the job as a child and, when the child leaves no results file, writes one
``error`` row per (case, backend) of the group with the exit status and the
child's last stderr line, so the sweep's tables show the failure and the
pipeline goes on. ``$ATTNBENCH_DEADLINE`` (Unix time) bounds a whole sweep:
jobs that would start after it, or run past it, become rows that say so.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DEADLINE_ENV = "ATTNBENCH_DEADLINE"
LOCK_DIR_ENV = "ATTNBENCH_LOCK_DIR"
TERM_GRACE_S = 60  # after SIGTERM at the deadline, time to write finished rows before SIGKILL


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


@contextlib.contextmanager
def gpu_lease(poll_s: float = 1.0):
    """Yield the leased device id; blocks until one is free. Errors if this host has no GPU."""
    devices = visible_devices()
    if not devices:
        raise RuntimeError("a GPU lease was asked for, but no CUDA device is visible")
    lease = try_lease(devices)
    while lease is None:
        time.sleep(poll_s)
        lease = try_lease(devices)
    device, handle = lease
    try:
        yield device
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def deadline() -> float | None:
    value = os.environ.get(DEADLINE_ENV)
    return float(value) if value else None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run_child(cmd: list[str], env: dict, timeout_s: float | None) -> tuple[int | None, str]:
    """Run ``cmd``, relaying its stderr; return (exit code or None on timeout, last non-empty stderr line)."""
    tail: collections.deque[str] = collections.deque(maxlen=1)
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")

    def relay():
        for line in proc.stderr:
            sys.stderr.write(line)
            if line.strip():
                tail.append(line.strip())

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # `attnbench microbench` writes the rows it finished on SIGTERM
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        code = None
    reader.join(timeout=5)
    sys.stderr.flush()
    return code, (tail[0] if tail else "")


def error_rows(config_path: str, group: str, backends: list[str] | None, reason: str, done: set | None = None):
    """One ``error`` row per (case, backend) of ``group`` in the config's resolved grid, except those in ``done``."""
    from attnbench.bench import conventions
    from attnbench.bench.provenance import environment, timestamp
    from attnbench.bench.results import empty_row, to_frame
    from attnbench.config import load_config, microbench_plan, resolve_device

    config = load_config(config_path)
    device = resolve_device(config)[0]
    plan = microbench_plan(config, device)
    try:
        env = environment(device)
    except Exception:  # a wedged GPU must not stop the rows that report it
        env = environment("cpu") | {"device": device}
    rows = []
    for case in plan.groups[group]:
        for backend in backends or plan.group_backends[group]:
            if done and (case.case_id, backend) in done:
                continue
            row = empty_row() | case.fields() | env
            row.update(sweep=config["sweep"], group=group, case_id=case.case_id, backend=backend, status="error",
                       reason=reason[:800], timestamp=timestamp(), flops=conventions.flops(case),
                       bytes_min=conventions.bytes_min(case))
            rows.append(row)
    return to_frame(rows)


def guard(cmd: list[str], *, config: str, group: str, backends: list[str] | None, out: str,
          gpu: bool = False) -> int:
    """Run a job that should write ``out``; every (case, backend) it leaves without a row gets an error row.

    A job that exits 0 with its file is left alone. One that fails after writing
    some rows (a microbench job stopped by SIGTERM writes the rows it finished)
    keeps them, and the missing ones are added. Returns 0 once ``out`` is complete.
    """
    import pandas as pd

    from attnbench.bench.results import write_atomic

    out_path = Path(out)
    limit = deadline()
    if limit is not None and time.time() >= limit:
        reason = f"not run: the sweep deadline (${DEADLINE_ENV}) had passed"
    else:
        timeout = None if limit is None else max(1.0, limit - time.time())
        with contextlib.ExitStack() as stack:
            env = dict(os.environ)
            if gpu:
                env["CUDA_VISIBLE_DEVICES"] = stack.enter_context(gpu_lease())
                print(f"attnbench guard: leased GPU {env['CUDA_VISIBLE_DEVICES']}", file=sys.stderr)
            code, last = run_child(cmd, env, timeout)
        if code == 0 and out_path.is_file():
            return 0
        what = f"killed at the sweep deadline (${DEADLINE_ENV})" if code is None else f"job {_exit_text(code)}"
        reason = f"{what} before this case finished" + (f": {last}" if last and code is not None else "")
    kept = pd.read_parquet(out_path) if out_path.is_file() else None
    done = set(zip(kept["case_id"], kept["backend"])) if kept is not None and len(kept) else set()
    missing = error_rows(config, group, backends, reason, done)
    df = pd.concat([kept, missing], ignore_index=True) if done else missing
    write_atomic(df, out_path)
    print(f"attnbench guard: {reason}; kept {len(done)} rows, wrote {len(missing)} error rows to {out}",
          file=sys.stderr)
    return 0
