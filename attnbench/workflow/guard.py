"""A guard that turns a job that did not finish into rows, the job's time limit, and the sweep deadline.

A results job whose process dies (segfault, OOM kill, an exception) would stop everything that depends
on it. The guard runs the job as a child (in its own process group, :mod:`attnbench.workflow.process`)
and, when the child leaves no complete output, writes it itself: every row the job finished (its side
file, :mod:`attnbench.workflow.resume`) plus one row per unfinished (case, backend) that says why, so the
sweep's tables show what is missing and the pipeline goes on.

* **Crash** (non-zero exit, killed by a signal): ``error`` rows with the exit status and the child's last
  stderr line, "(retried on the next run)"; the output is marked interrupted and the next run measures
  only those pairs (:func:`attnbench.workflow.resume.reopen`).
* **Job time limit** (``job_time_limit_s`` in the config, the plan file's ``time_limit_s``): the child is
  stopped and the unfinished pairs are ``timeout`` rows. They are final: the same job would run away
  again; raising the limit changes the plan file, and Snakemake reruns the job.
* **Sweep deadline** (``$ATTNBENCH_DEADLINE``, Unix time): jobs that would start after it, or run past
  it, become ``error`` rows that say so and are retried on the next run.
* **Stopped** (SIGTERM, SIGINT or SIGHUP to the guard, e.g. Snakemake or a scheduler stopping the job):
  the child's whole process group is stopped and the guard exits without writing the output; the side
  file keeps the finished rows for the next run.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from attnbench.envvars import DEADLINE_ENV, deadline
from attnbench.workflow import process, resume


def status_rows(job: dict, backends: list[str], status: str, reason: str, done: set | None = None):
    """One ``status`` row per (case, backend) of a results job, except those in ``done``."""
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
            row.update(sweep=job["sweep"], group=job["group"], case_id=case.case_id, backend=backend, status=status,
                       reason=reason[:800], timestamp=timestamp(), flops=conventions.workload_flops(case),
                       flops_padded=conventions.flops(case), bytes_min=conventions.workload_bytes_min(case),
                       numerics_status="not_run", numerics_reason="")
            rows.append(row)
    return to_frame(rows)


def error_rows(job: dict, backends: list[str], reason: str, done: set | None = None):
    return status_rows(job, backends, "error", reason, done)


def _finished_rows(out: Path, fingerprint: str):
    """What the child finished: its side file, and the output if it wrote one before failing."""
    import pandas as pd

    frames = [resume.read_side(out, fingerprint)]
    if out.is_file():
        frames.append(resume.read_rows(out))
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return None
    return pd.concat(frames, ignore_index=True).drop_duplicates(["case_id", "backend"], keep="last")


FINAL, RETRIED, CRASHED = "final", "retried", "crashed"  # what happens to the pairs a job left without rows


def _outcome(finished: process.Finished | None, limit_s: float | None, sweep_left_s: float | None):
    """(status, reason, what next) for the pairs a child left without rows: ``FINAL`` (a runaway job's
    ``timeout`` rows), ``RETRIED`` (the sweep deadline: always retried), ``CRASHED`` (retried until the job
    crashes :data:`~attnbench.workflow.resume.MAX_ATTEMPTS` times in a row without progress)."""
    if finished is None:
        return "error", f"not run: the sweep deadline (${DEADLINE_ENV}) had passed", RETRIED
    if finished.code is None:
        if limit_s is not None and (sweep_left_s is None or limit_s <= sweep_left_s):
            return "timeout", (f"the job reached its time limit (job_time_limit_s={limit_s:g} s) before this case "
                               "finished"), FINAL
        return "error", f"stopped at the sweep deadline (${DEADLINE_ENV}) before this case finished", RETRIED
    last = f": {finished.last_line}" if finished.last_line else ""
    return "error", f"job {process.exit_text(finished.code)} before this case finished{last}", CRASHED


def guard(cmd: list[str], *, job: dict, backends: list[str], out: str) -> int:
    """Run a job that should write ``out``; every (case, backend) it leaves without a row gets a row that says why.

    Returns 0 once ``out`` is complete (written by the job, or by the guard from what the job finished);
    128 + the signal number when the guard itself was stopped (``out`` is then left unwritten).
    """
    import pandas as pd

    from attnbench.bench.results import write_atomic

    out_path = Path(out)
    fingerprint = resume.fingerprint(job, backends)
    limit_s = job.get("time_limit_s")
    end = deadline()
    sweep_left_s = None if end is None else end - time.time()
    finished = None
    if sweep_left_s is None or sweep_left_s > 0:
        timeouts = [t for t in (limit_s, sweep_left_s) if t is not None]
        try:
            finished = process.run(cmd, env=dict(os.environ), timeout_s=min(timeouts) if timeouts else None,
                                   relay_stderr=True)
        except process.Stopped as stop:
            print(f"attnbench guard: stopped by {stop}; stopped the job's processes and left {out} unwritten "
                  f"(its finished rows stay in {resume.side_path(out)} for the next run)", file=sys.stderr)
            return 128 + stop.signum
        if finished.code == 0 and out_path.is_file():
            resume.remove_marker(out)
            return 0
    status, reason, then = _outcome(finished, limit_s, sweep_left_s)
    stopped = reason  # without what happens next: nothing does where every pair has its row
    kept = _finished_rows(out_path, fingerprint)
    done = set(zip(kept["case_id"], kept["backend"])) if kept is not None else set()
    attempts = resume.next_attempt(out, fingerprint, len(done)) if then == CRASHED else 0
    final = attempts >= resume.MAX_ATTEMPTS
    if final:
        reason += (f" (not retried: the job crashed {attempts} times in a row without finishing another case; "
                   f"remove {resume.marker_path(out)} to retry)")
    elif then != FINAL:
        reason += f" {resume.RETRY_NOTE}"
    missing = status_rows(job, backends, status, reason, done)
    if then == FINAL or missing.empty:  # nothing left to retry: a job stopped after its last row is complete
        resume.remove_marker(out)
    else:  # the marker first: an output without its marker would look complete
        resume.write_marker(out, {"fingerprint": fingerprint, "attempts": attempts, "final": final,
                                  "finished": len(done), "reason": reason,
                                  "pairs": [list(p) for p in zip(missing["case_id"], missing["backend"])]})
    df = pd.concat([kept, missing], ignore_index=True) if kept is not None else missing
    write_atomic(df, out_path)
    said = (f"{stopped.removesuffix(' before this case finished')} after its last row; {out} is complete with "
            f"its {len(done)} rows" if missing.empty else
            f"{reason}; kept {len(done)} finished rows, wrote {len(missing)} {status} rows to {out}")
    print(f"attnbench guard: {said}", file=sys.stderr)
    return 0
