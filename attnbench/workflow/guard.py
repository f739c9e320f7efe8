"""A guard that turns a crashed job into rows, and the sweep deadline.

A microbench job whose process dies (segfault, OOM kill, a hung kernel past the sweep deadline)
would stop everything that depends on it. The guard runs the job as a child and, when the child
leaves no results file, writes one ``error`` row per (case, backend) of the group with the exit
status and the child's last stderr line, so the sweep's tables show the failure and the pipeline
goes on. ``$ATTNBENCH_DEADLINE`` (Unix time) bounds a whole sweep: jobs that would start after it,
or run past it, become rows that say so.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DEADLINE_ENV = "ATTNBENCH_DEADLINE"
TERM_GRACE_S = 60  # after SIGTERM at the deadline, time to write finished rows before SIGKILL


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


def error_rows(job: dict, backends: list[str], reason: str, done: set | None = None):
    """One ``error`` row per (case, backend) of a results job, except those in ``done``."""
    from attnbench.bench import conventions
    from attnbench.bench.provenance import environment, timestamp
    from attnbench.bench.results import case_columns, empty_row, to_frame
    from attnbench.plan import job_cases

    device = job["device"]
    try:
        env = environment(device)
    except Exception:  # a wedged GPU must not stop the rows that report it
        env = environment("cpu") | {"device": device}
    rows = []
    for case in job_cases(job):
        for backend in backends:
            if done and (case.case_id, backend) in done:
                continue
            row = empty_row() | case_columns(case) | env
            row.update(sweep=job["sweep"], group=job["group"], case_id=case.case_id, backend=backend, status="error",
                       reason=reason[:800], timestamp=timestamp(), flops=conventions.workload_flops(case),
                       flops_padded=conventions.flops(case), bytes_min=conventions.workload_bytes_min(case),
                       numerics_status="not_run", numerics_reason="")
            rows.append(row)
    return to_frame(rows)


def guard(cmd: list[str], *, job: dict, backends: list[str], out: str) -> int:
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
        code, last = run_child(cmd, dict(os.environ), timeout)
        if code == 0 and out_path.is_file():
            return 0
        what = f"killed at the sweep deadline (${DEADLINE_ENV})" if code is None else f"job {_exit_text(code)}"
        reason = f"{what} before this case finished" + (f": {last}" if last and code is not None else "")
    kept = pd.read_parquet(out_path) if out_path.is_file() else None
    done = set(zip(kept["case_id"], kept["backend"])) if kept is not None and len(kept) else set()
    missing = error_rows(job, backends, reason, done)
    df = pd.concat([kept, missing], ignore_index=True) if done else missing
    write_atomic(df, out_path)
    print(f"attnbench guard: {reason}; kept {len(done)} rows, wrote {len(missing)} error rows to {out}",
          file=sys.stderr)
    return 0
