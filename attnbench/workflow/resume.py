"""A results job that stops part-way keeps every finished row, and its next run measures only the rest.

Snakemake knows one thing about a job: whether its output exists. So a results job writes its output
``<out>`` (e.g. ``results/<sweep>/microbench/<group>.parquet``) only once every (case, backend) of the
job has a row, and keeps what it has finished in two files beside it:

* ``<out>.partial``: the rows finished so far (parquet, rewritten atomically after each row, tagged
  with the job's :func:`fingerprint`). A run of the same job skips the pairs it holds; a side file of
  another job (other cases, backends or options) is set aside. The job removes it once ``<out>`` is written.
* ``<out>.interrupted``: written by :mod:`attnbench.workflow.guard` when the job crashed or was stopped
  at the sweep deadline. The guard then writes ``<out>`` from the finished rows plus an ``error`` row for
  every other pair ("... (retried on the next run)"), so that the sweep's tables render and say which
  cases are missing and why; the marker (JSON) lists the pairs it filled in.

At the next parse, :func:`reopen` (called from ``workflow/rules/common.smk``) moves each marked output's
finished rows back into its side file and removes the output: Snakemake reruns the job because its output
is missing, and the rerun measures only the pairs that were filled in. Nothing is removed while another
Snakemake holds this folder's lock, and nothing is lost: every row stays in the side file.

A job that crashes :data:`MAX_ATTEMPTS` times in a row without finishing another pair is not retried
again: its error rows are final (their reason says so) until its plan changes or the marker is removed.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.bench.results import to_frame, write_atomic

FINGERPRINT = "attnbench_job"  # the side file's DataFrame.attrs key (kept in the parquet metadata)
MAX_ATTEMPTS = 2  # consecutive interrupted runs without a new finished pair before the error rows are final
RETRY_NOTE = "(retried on the next run)"


def side_path(out: str | Path) -> Path:
    return Path(f"{out}.partial")


def marker_path(out: str | Path) -> Path:
    return Path(f"{out}.interrupted")


def fingerprint(job: dict, backends: list[str]) -> str:
    """What decides a row's value: the job's cases, backends and run options (not its time limit)."""
    key = {"cases": job["cases"], "backends": list(backends), "options": job.get("options")}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pairs(job: dict, backends: list[str]) -> list[tuple[str, str]]:
    """Every (case_id, backend) of the job, in job order (cases outer, backends inner)."""
    from attnbench.plan import job_cases

    return [(case.case_id, backend) for case in job_cases(job) for backend in backends]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def read_rows(path: Path) -> pd.DataFrame | None:
    """A parquet file's rows, or None (with one line) when it is not a readable results file."""
    from attnbench.files import InputError, read_parquet

    try:
        df = read_parquet(path)
    except InputError as err:
        _stderr(f"attnbench: {err}; ignoring it")
        return None
    if not {"case_id", "backend"} <= set(df.columns):
        _stderr(f"attnbench: {path}: not a results file (no case_id/backend columns); ignoring it")
        return None
    return df


def read_side(out: str | Path, job_fingerprint: str) -> pd.DataFrame | None:
    """The finished rows of this job, or None (a side file of another job is renamed ``.stale``)."""
    path = side_path(out)
    if not path.is_file():
        return None
    df = read_rows(path)
    if df is not None and df.attrs.get(FINGERPRINT) == job_fingerprint:
        return df.drop_duplicates(["case_id", "backend"], keep="last")
    stale = path.with_name(path.name + ".stale")
    os.replace(path, stale)
    _stderr(f"attnbench: {path} holds rows of another plan of this job (other cases, backends or options); "
            f"moved aside to {stale}, measuring every case")
    return None


def write_side(df: pd.DataFrame, out: str | Path, job_fingerprint: str) -> None:
    df = df.copy()
    df.attrs[FINGERPRINT] = job_fingerprint
    write_atomic(df, side_path(out))


class StreamingRows(list):
    """The rows list a job passes to ``run_group``: rows appended (one at a time, or a case's rows together)
    are also written to the side file, so a job killed at any point keeps every row it finished."""

    def __init__(self, on_append: Callable[[list[dict]], None]):
        super().__init__()
        self._on_append = on_append

    def append(self, row: dict) -> None:
        super().append(row)
        self._on_append(self)

    def extend(self, rows) -> None:
        super().extend(rows)
        self._on_append(self)


class SideFile:
    """A job's side file: the rows a previous run finished (:attr:`kept`) and the ones this run adds (:attr:`rows`)."""

    def __init__(self, out: str | Path, job: dict, backends: list[str]):
        self.out = Path(out)
        self.order = pairs(job, backends)
        self.fingerprint = fingerprint(job, backends)
        self.kept = read_side(out, self.fingerprint)
        self.rows = StreamingRows(self._write)

    @property
    def done(self) -> set[tuple[str, str]]:
        if self.kept is None:
            return set()
        return set(zip(self.kept["case_id"], self.kept["backend"]))

    def pending(self, cases: list, backends: list[str]) -> list[tuple[list, list[str]]]:
        """What is left to measure, as (cases, backends) batches for ``run_group``: the cases that miss the
        same backends go together, in job order."""
        done, batches = self.done, {}
        for case in cases:
            missing = tuple(b for b in backends if (case.case_id, b) not in done)
            if missing:
                batches.setdefault(missing, []).append(case)
        return [(group, list(missing)) for missing, group in batches.items()]

    def frame(self) -> pd.DataFrame:
        """Kept and new rows, in job order."""
        frames = [f for f in (self.kept, to_frame(list(self.rows)) if self.rows else None) if f is not None]
        if not frames:
            return to_frame([])
        df = pd.concat(frames, ignore_index=True).drop_duplicates(["case_id", "backend"], keep="last")
        rank = {pair: i for i, pair in enumerate(self.order)}
        df = df.assign(_order=[rank.get(p, len(rank)) for p in zip(df["case_id"], df["backend"])])
        return df.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)

    def _write(self, rows: list[dict]) -> None:
        write_side(self.frame(), self.out, self.fingerprint)

    def finish(self) -> pd.DataFrame:
        """Write the output (every row of the job), then remove the side file and any interrupted marker
        (the output is complete now); returns the rows."""
        df = self.frame()
        write_atomic(df, self.out)
        remove_marker(self.out)
        side_path(self.out).unlink(missing_ok=True)
        return df


# ----------------------------------------------------------------------------------------------- the marker

def read_marker(out: str | Path) -> dict | None:
    path = marker_path(out)
    try:
        marker = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        _stderr(f"attnbench: {path}: not a marker file; ignoring it")
        return None
    return marker if isinstance(marker, dict) else None


def write_marker(out: str | Path, marker: dict) -> None:
    path = marker_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, path)


def remove_marker(out: str | Path) -> None:
    marker_path(out).unlink(missing_ok=True)


def next_attempt(out: str | Path, job_fingerprint: str, finished: int) -> int:
    """This interruption's number in a row of interruptions without progress (1 after any new finished pair)."""
    marker = read_marker(out)
    if not marker or marker.get("fingerprint") != job_fingerprint or finished > marker.get("finished", -1):
        return 1
    return int(marker.get("attempts", 0)) + 1


# ----------------------------------------------------------------------------------------------- parse time

def snakemake_running(workdir: str | Path = ".") -> bool:
    """Whether a Snakemake holds this folder's lock (its lock files, ``.snakemake/locks/*``, exist)."""
    locks = Path(workdir) / ".snakemake" / "locks"
    return locks.is_dir() and any(locks.iterdir())


def reopen(results_dir: str | Path, log: Callable[[str], None] = _stderr, workdir: str | Path = ".") -> list[Path]:
    """Reopen every interrupted output under ``results_dir`` (see the module docstring); returns them.
    Nothing is touched while a Snakemake holds ``workdir``'s lock (it may be writing those outputs)."""
    if snakemake_running(workdir):
        return []
    reopened = []
    for marker in sorted(Path(results_dir).rglob("*.interrupted")):
        out = Path(str(marker)[: -len(".interrupted")])
        state = read_marker(out)
        if not state or state.get("final") or not out.is_file():
            continue
        filled = {tuple(p) for p in state.get("pairs", [])}
        rows = read_rows(out)
        if rows is None:
            continue
        finished = rows[[pair not in filled for pair in zip(rows["case_id"], rows["backend"])]]
        kept = read_side(out, state["fingerprint"])
        frames = [f for f in (finished, kept) if f is not None and len(f)]
        merged = (pd.concat(frames, ignore_index=True).drop_duplicates(["case_id", "backend"], keep="last")
                  if frames else finished)
        write_side(merged, out, state["fingerprint"])
        out.unlink()
        reopened.append(out)
        log(f"attnbench: {out} was interrupted ({len(filled)} of {len(rows)} rows not measured); its "
            f"{len(merged)} finished rows are kept in {side_path(out)} and the job runs again for the rest")
    return reopened

