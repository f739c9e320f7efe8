"""Results rows for a backend that is not a Python adapter (a rule in workflow/rules/backends/).

The contract is two tab-separated files:

* ``attnbench rule-backend cases`` writes the group's cases, one per line, with
  a header: :data:`CASE_COLUMNS` (``causal`` as 0/1).
* The backend's command reads them and prints one line per case it ran or
  refused, with a header: ``case_id status ms_median ms_p20 ms_p80 n_reps`` and
  optionally ``ms_ci_low ms_ci_high`` (its own 95% interval of the median: with
  them its rows can be compared with other backends' within noise,
  docs/statistics.md; without them nothing is claimed about them) and
  ``rel_err max_abs_err reason``. ``status`` is ``ok``,
  ``unsupported`` (say why in ``reason``) or ``error``.

``attnbench rule-backend ingest`` turns those lines into results rows: case
fields from the job's plan file, FLOPs/bytes/roofline from :mod:`attnbench.bench.conventions`
and the measured ceilings, provenance from this host. A case the command
printed nothing for becomes an ``error`` row; a command that could not be built
makes every row ``unavailable`` with the reason given.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attnbench.bench import conventions
from attnbench.bench.results import ResultsError, case_columns, empty_row, to_frame

CASE_COLUMNS = ("case_id", "mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "seq_q",
                "seq_kv", "causal", "dtype", "page_size")
TIMING_COLUMNS = ("case_id", "status", "ms_median", "ms_p20", "ms_p80", "n_reps")
COMMAND_STATUSES = ("ok", "unsupported", "error")


def write_cases(job: dict, out: str | Path) -> int:
    """The job's cases as TSV (:data:`CASE_COLUMNS`), for the backend's own command to read."""
    from attnbench.plan import job_cases

    rows = [{"case_id": c.case_id, **c.fields()} for c in job_cases(job)]
    df = pd.DataFrame(rows, columns=list(CASE_COLUMNS))
    df["causal"] = df["causal"].astype(int)
    df.to_csv(out, sep="\t", index=False)
    return len(df)


def read_timings(path: str | Path) -> pd.DataFrame:
    """The command's output; one-line errors for a missing column or a status outside the contract.

    A command that printed nothing (it crashed first) gives no lines: every case becomes an error row.
    """
    try:
        df = pd.read_csv(path, sep="\t", comment="#", dtype={"case_id": str, "reason": str})
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame(columns=TIMING_COLUMNS[1:], index=pd.Index([], name="case_id"))
    except (UnicodeDecodeError, pd.errors.ParserError, ValueError) as err:
        raise ResultsError(f"{path}: not a timings file ({type(err).__name__}: {' '.join(str(err).split())[:160]}); "
                           f"allowed: tab-separated lines with columns {', '.join(TIMING_COLUMNS)}") from None
    missing = [c for c in TIMING_COLUMNS if c not in df]
    if missing:
        raise ResultsError(f"{path}: missing column {missing[0]!r}; required: {', '.join(TIMING_COLUMNS)}")
    bad = sorted(set(df["status"]) - set(COMMAND_STATUSES))
    if bad:
        raise ResultsError(f"{path}: status={bad[0]!r} is not allowed; allowed: {', '.join(COMMAND_STATUSES)}")
    return df.drop_duplicates("case_id", keep="last").set_index("case_id")


def ingest(job: dict, backend: str, *, timings: str | None, ceilings: str | None, version: str, family: str,
           unavailable: str | None = None) -> pd.DataFrame:
    """Results rows for every case of the job: measured, refused, missing or unavailable."""
    from attnbench.bench.ceilings import Ceilings
    from attnbench.bench.provenance import environment, timestamp
    from attnbench.plan import job_cases

    cases, group = job_cases(job), job["group"]
    lines = read_timings(timings) if timings and not unavailable else pd.DataFrame(columns=TIMING_COLUMNS[1:])
    peaks = Ceilings.load(ceilings) if ceilings else None
    env = environment("cpu")
    rows = []
    for case in cases:
        row = empty_row() | case_columns(case) | env
        row.update(sweep=job["sweep"], group=group, case_id=case.case_id, backend=backend, backend_version=version,
                   compute_dtype=case.dtype, timestamp=timestamp(), reason="", timer="external",
                   flops=conventions.flops(case), flops_padded=conventions.flops(case),
                   bytes_min=conventions.bytes_min(case), bytes_model=conventions.bytes_model(case, family),
                   numerics_status="not_run", numerics_reason="")
        if peaks:
            row.update(peak_flops=peaks.peak_flops(case.dtype), peak_bytes_per_s=peaks.copy_bytes_per_s)
        if unavailable:
            row.update(status="unavailable", reason=unavailable)
        elif case.case_id not in lines.index:
            row.update(status="error", reason=f"{backend}'s command printed no line for this case")
        else:
            line = lines.loc[case.case_id]
            reason = line.get("reason")
            row.update(status=line["status"], reason="" if pd.isna(reason) else str(reason))
            if line["status"] == "ok":
                _measured(row, line)
        rows.append(row)
    return to_frame(rows)


def _measured(row: dict, line: pd.Series) -> None:
    seconds = float(line["ms_median"]) / 1e3
    if not seconds > 0:
        row.update(status="error", reason=f"ms_median={line['ms_median']!r} is not a positive time")
        return
    row.update(ms_median=seconds * 1e3, ms_p20=float(line["ms_p20"]), ms_p80=float(line["ms_p80"]),
               n_reps=int(line["n_reps"]), tflops=row["flops"] / seconds / 1e12,
               gbps=row["bytes_model"] / seconds / 1e9,
               intensity=conventions.intensity(row["flops"], row["bytes_model"]))
    for name in ("ms_ci_low", "ms_ci_high", "rel_err", "max_abs_err"):
        value = line.get(name)
        row[name] = float(value) if value is not None and not pd.isna(value) else math.nan
    if not math.isnan(row["peak_flops"]):
        row["bound"], row["frac_of_peak"] = conventions.roofline_bound(
            row["flops"], row["bytes_model"], seconds, row["peak_flops"], row["peak_bytes_per_s"])
