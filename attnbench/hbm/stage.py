"""The ``attnbench hbm`` job: time a group of cases, profile their DRAM bytes with ncu, write tidy rows.

One row per (case, backend): every results column (:data:`attnbench.bench.results.COLUMNS`),
``bytes_measured`` = DRAM bytes read + written inside the call's NVTX range, and
the columns of :data:`HBM_COLUMNS`. ``status`` is the byte measurement's status;
the timing's own status is ``time_status``.

Times come from a microbench results file when one is given (same case_id and
backend), else from the harness timer in this process (``hbm.time``), never from
the profiled run: ncu replays and serialises kernels, so its times are not the
kernel's. Bytes come from one Nsight Compute process per job running
:mod:`attnbench.hbm.profile`; a process that dies mid-call marks that call an
error and a new process takes the calls not yet run.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.bench import conventions
from attnbench.case import Case
from attnbench.bench.ceilings import Ceilings
from attnbench.bench.microbench import base_row
from attnbench.bench.provenance import timestamp
from attnbench.bench.results import COLUMNS, MEASURED, read_results, to_frame, typed_columns
from attnbench.hbm import ncu as ncu_cli
from attnbench.kernels.registry import get_backend

HBM_COLUMNS: dict[str, tuple[str, str]] = {
    "bytes_read": ("number", "DRAM bytes read by every kernel inside the call's NVTX range (ncu)"),
    "bytes_written": ("number", "DRAM bytes written by every kernel inside the call's NVTX range (ncu)"),
    "read_min": ("number", "bytes_min's read part: each input read once"),
    "written_min": ("number", "bytes_min's written part: each output written once"),
    "model_family": ("string", "byte model used: flash-style, decode, paged, eager or math"),
    "ratio_measured_model": ("number", "bytes_measured / bytes_model"),
    "ratio_measured_min": ("number", "bytes_measured / bytes_min"),
    "ratio_read_min": ("number", "bytes_read / read_min (fwd: bytes read over Q+K+V bytes)"),
    "ratio_written_min": ("number", "bytes_written / written_min"),
    "intensity_measured": ("number", "flops / bytes_measured, FLOP/byte"),
    "gbps_measured": ("number", "bytes_measured / median time / 1e9"),
    "bound_measured": ("string", "memory, compute, latency or unknown, placed at the measured intensity"),
    "frac_of_peak_measured": ("number", "achieved FLOP/s over the roofline at the measured intensity"),
    "n_kernels_profiled": ("integer", "kernels ncu profiled inside the call's NVTX range"),
    "kernels_profiled": ("string", "their names, ';'-joined, in launch order"),
    "kernels_by_order": ("integer", "of those, kernels attributed by launch order (innermost NVTX range not ours)"),
    "time_status": ("string", "status of the timing the row's ms_median comes from, or none"),
    "time_source": ("string", "where ms_median comes from: microbench:<file>, in-process, or none"),
    "ncu_version": ("string", "Nsight Compute version"),
    "ncu_metrics": ("string", "metrics collected, ','-joined; extra ones are kept as ncu_<metric> columns"),
    "ncu_cache_control": ("string", "ncu --cache-control"),
    "ncu_clock_control": ("string", "ncu --clock-control"),
}


@dataclass
class Measured:
    """The byte measurement of one (case, backend)."""

    status: str
    reason: str = ""
    totals: ncu_cli.RangeTotals | None = None


@dataclass
class HbmOptions:
    sweep: str
    group: str
    device: str
    settings: ncu_cli.NcuSettings
    warmup_calls: int = 2
    timeout_s: float = 1800
    time_in_process: bool = True
    run: dict = field(default_factory=dict)  # RunOptions fields of the timing (attnbench.plan.run_options)
    ceilings: Ceilings | None = None
    microbench: str | None = None
    workdir: str | None = None


def model_family(case: Case, backend_family: str) -> str:
    """The byte model a row is held against: flash-style (fused fwd/fwd_bwd), decode, paged, eager, math."""
    if backend_family != "fused":
        return backend_family
    if case.page_size:
        return "paged"
    return "decode" if case.mode == "decode" else "flash-style"


def measurement_blocker(device: str, settings: ncu_cli.NcuSettings) -> tuple[str | None, str]:
    """(ncu path, "") when bytes can be measured here, else (None, reason)."""
    if device != "cuda":
        return None, "no CUDA device: DRAM byte counters need an NVIDIA GPU and Nsight Compute"
    return ncu_cli.find_ncu(settings.ncu)


# --------------------------------------------------------------------------- profiling

def _tail(path: Path, chars: int = 400) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(text[-chars:].split())


def _read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            break
    return events


def _run_killable(cmd: list[str], timeout_s: float, stdout_path: Path) -> str:
    """Run ``cmd`` in its own process group (ncu and the profiled child); returns the exit code or 'timeout'.

    The group is killed on timeout and whenever this process stops waiting (an exception, or
    SystemExit from the SIGTERM handler ``attnbench hbm`` installs), so no profiler outlives its job.
    """
    with open(stdout_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return str(proc.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            return "timeout"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _import_totals(ncu_path: str, report: Path, metrics: list[str]) -> dict[tuple[str, str], ncu_cli.RangeTotals]:
    def printed(rename: bool) -> str:
        done = subprocess.run(ncu_cli.import_command(ncu_path, report, rename), capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise ncu_cli.NcuParseError(f"ncu --import exited {done.returncode}: {' '.join(done.stderr.split())[:300]}")
        return done.stdout

    kernels = ncu_cli.parse_raw_csv(printed(False), metrics)
    renamed = ncu_cli.parse_raw_csv(printed(True), [])
    return ncu_cli.attribute(kernels, renamed)


def _one_process(pending: list[tuple[Case, str]], options: HbmOptions, ncu_path: str, run_dir: Path,
                 log: Callable[[str], None]) -> tuple[dict, bool]:
    """Profile ``pending`` in one ncu process; returns ({(case_id, backend): Measured}, timed_out)."""
    run_dir.mkdir(parents=True)
    by_case: dict[Case, list[str]] = {}
    for case, backend in pending:
        by_case.setdefault(case, []).append(backend)
    plan = {"device": options.device, "seed": options.run.get("seed", 0), "warmup_calls": options.warmup_calls,
            "cases": [{"case": c.fields(), "backends": b} for c, b in by_case.items()]}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    manifest, report, ncu_log = run_dir / "manifest.jsonl", run_dir / "report", run_dir / "ncu.log"
    app = [sys.executable, "-m", "attnbench.hbm.profile", "--plan", str(run_dir / "plan.json"),
           "--manifest", str(manifest)]
    cmd = ncu_cli.profile_command(options.settings, ncu_path, report, ncu_log, app)
    log("attnbench hbm: " + " ".join(cmd))
    rc = _run_killable(cmd, options.timeout_s, run_dir / "child.log")

    events = _read_events(manifest)
    ends = {(e["case_id"], e["backend"]): e for e in events if e["event"] == "end"}
    starts = [(e["case_id"], e["backend"]) for e in events if e["event"] == "start"]
    ncu_text = ncu_log.read_text(errors="replace") if ncu_log.is_file() else ""
    denied = ncu_cli.permission_problem(ncu_text)
    if denied:  # nothing this host profiles can succeed
        return {(c.case_id, b): Measured("unavailable", denied) for c, b in pending}, False
    errors = ncu_cli.error_lines(ncu_text) or _tail(ncu_log)

    totals, parse_error = {}, ""
    if any(e["status"] == "ok" for e in ends.values()):
        found = ncu_cli.report_file(report)
        if found is None:
            parse_error = f"ncu wrote no report (exit {rc}): {errors}"
        else:
            try:
                totals = _import_totals(ncu_path, found, options.settings.metrics)
            except (ncu_cli.NcuParseError, subprocess.SubprocessError, OSError) as err:
                parse_error = f"{str(err)[:400]} | {errors}"

    results = {}
    for key, e in ends.items():
        if e["status"] != "ok":
            results[key] = Measured(e["status"], e["reason"])
        elif key in totals:  # measured, even if the process failed later on
            results[key] = Measured("ok", "", totals[key])
        elif parse_error:
            results[key] = Measured("error", parse_error[:800])
        else:
            results[key] = Measured("error", f"the call ran but ncu profiled no kernel inside its NVTX range "
                                             f"(ncu exit {rc}): {errors}"[:800])
    if starts and starts[-1] not in ends:  # the process died inside this call
        why = "timed out" if rc == "timeout" else f"died (exit {rc})"
        results[starts[-1]] = Measured("error", f"the profiling process {why} during this call: "
                                                f"{_tail(run_dir / 'child.log')}")
    return results, rc == "timeout"


def profile_pairs(pending: list[tuple[Case, str]], options: HbmOptions, ncu_path: str, workdir: Path,
                  log: Callable[[str], None]) -> dict[tuple[str, str], Measured]:
    """Measure every (case, backend), starting a new ncu process after one that died mid-call."""
    results: dict[tuple[str, str], Measured] = {}
    attempt = 0
    while pending:
        attempt += 1
        got, timed_out = _one_process(pending, options, ncu_path, workdir / f"ncu-{attempt}", log)
        results.update(got)
        left = [(c, b) for c, b in pending if (c.case_id, b) not in results]
        if left and (timed_out or len(left) == len(pending)):
            run_dir = workdir / f"ncu-{attempt}"
            why = (f"timed out after {options.timeout_s:g} s" if timed_out else
                   f"ended before profiling these calls: {_tail(run_dir / 'ncu.log')} {_tail(run_dir / 'child.log')}")
            for case, backend in left:
                results[(case.case_id, backend)] = Measured("error", f"ncu process {why}"[:800])
            left = []
        pending = left
    return results


# --------------------------------------------------------------------------- timing

def _time_rows(cases: list[Case], backends: list[str], options: HbmOptions,
               log: Callable[[str], None]) -> tuple[dict, str]:
    """{(case_id, backend): results row} from the microbench file or the harness timer, and the source."""
    if options.microbench:
        df = read_results(options.microbench)
        rows = {(r["case_id"], r["backend"]): r for r in df.to_dict("records")}
        return rows, f"microbench:{options.microbench}"
    if not (options.time_in_process and options.device == "cuda"):
        return {}, "none"
    from attnbench.bench.microbench import RunOptions, run_group

    run = RunOptions(**{**options.run, "numerics": False}, ceilings=options.ceilings)
    rows = run_group(cases, backends, run, log)
    import gc

    import torch

    gc.collect()  # the timing job's last callables hold inputs; free them before ncu's process needs the GPU
    torch.cuda.empty_cache()
    return {(r["case_id"], r["backend"]): r for r in rows}, "in-process"


# --------------------------------------------------------------------------- rows

def _base_row(case: Case, backend_name: str, options: HbmOptions) -> dict:
    return base_row(case, get_backend(backend_name), options.device, options.ceilings)


def _seconds(row: dict) -> float:
    """The row's median time in seconds when its timing ran (ok, or numerics_fail: timed, then judged)."""
    ms = row.get("ms_median")
    if row.get("time_status") in MEASURED and isinstance(ms, (int, float)) and math.isfinite(ms):
        return ms / 1e3
    return float("nan")


def _finish_row(row: dict, case: Case, measured: Measured, options: HbmOptions) -> dict:
    backend = get_backend(row["backend"])
    row.update({name: (float("nan") if kind == "number" else None) for name, (kind, _) in HBM_COLUMNS.items()
                if name not in row})
    read_min, written_min = conventions.bytes_min_read_write(case)
    row.update(read_min=read_min, written_min=written_min, model_family=model_family(case, backend.family),
               status=measured.status, reason=measured.reason, sweep=options.sweep, group=options.group,
               timestamp=timestamp(), ncu_metrics=",".join(options.settings.metrics),
               ncu_cache_control=options.settings.cache_control, ncu_clock_control=options.settings.clock_control)
    totals = measured.totals
    if measured.status != "ok" or totals is None:
        return row
    s = options.settings
    read, written = totals.values[s.read_metric], totals.values[s.write_metric]
    row.update(bytes_read=read, bytes_written=written, bytes_measured=read + written,
               n_kernels_profiled=totals.n_kernels, kernels_profiled=";".join(totals.kernels)[:2000],
               kernels_by_order=totals.by_order)
    for metric in s.extra_metrics:
        row[f"ncu_{metric}"] = totals.values.get(metric, float("nan"))
    if options.device == "cuda" and not backend.kernels_match(totals.kernels):
        row.update(status="error", reason=f"kernels ncu profiled do not match {backend.name} (pattern "
                                          f"{backend.kernel_pattern!r}): {';'.join(totals.kernels)[:300]}")
    measured_bytes = row["bytes_measured"]
    row.update(ratio_measured_model=measured_bytes / row["bytes_model"],
               ratio_measured_min=measured_bytes / row["bytes_min"],
               ratio_read_min=read / read_min, ratio_written_min=written / written_min,
               intensity_measured=conventions.intensity(row["flops"], measured_bytes))
    seconds = _seconds(row)
    if seconds > 0:
        row["gbps_measured"] = measured_bytes / seconds / 1e9
        if row.get("peak_flops", float("nan")) > 0 and row.get("peak_bytes_per_s", float("nan")) > 0:
            row["bound_measured"], row["frac_of_peak_measured"] = conventions.roofline_bound(
                row["flops"], measured_bytes, seconds, row["peak_flops"], row["peak_bytes_per_s"])
    return row


def assemble_rows(pending: list[tuple[Case, str]], times: dict, source: str,
                  measured: dict[tuple[str, str], Measured], options: HbmOptions, ncu_version: str = "",
                  log: Callable[[str], None] = lambda s: None) -> list[dict]:
    """One row per (case, backend): base fields, the timing row's columns, the byte measurement and ratios."""
    rows = []
    for case, backend in pending:
        key = (case.case_id, backend)
        timed = times.get(key)
        row = _base_row(case, backend, options)
        if timed is not None:
            row.update({k: v for k, v in timed.items() if k in COLUMNS and k not in ("status", "reason")})
            row.update(time_status=timed["status"], time_source=source)
        else:
            row.update(time_status="none", time_source="none" if source == "none" else f"{source} (no row)")
        row["ncu_version"] = ncu_version
        row = _finish_row(row, case, measured[key], options)
        rows.append(row)
        text = (f"read {row['bytes_read'] / 1e6:.1f} MB written {row['bytes_written'] / 1e6:.1f} MB "
                f"({row['ratio_measured_model']:.2f}x model)" if row["status"] == "ok" else row["reason"][:120])
        log(f"hbm {backend:15s} {case.label()}: {row['status']} {text}")
    return rows


def run_hbm(cases: list[Case], backends: list[str], options: HbmOptions,
            log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> pd.DataFrame:
    """Time and profile every (case, backend); never raises for one call's failure."""
    times, source = _time_rows(cases, backends, options, log)
    ncu_path, blocker = measurement_blocker(options.device, options.settings)
    pending = [(case, b) for case in cases for b in backends]
    version = ""
    if ncu_path is None:
        measured = {(c.case_id, b): Measured("unavailable", blocker) for c, b in pending}
    elif options.workdir:  # kept: plans, manifests, ncu logs and reports, for inspection
        version = ncu_cli.ncu_version(ncu_path)
        Path(options.workdir).mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"{options.group}-", dir=options.workdir))
        measured = profile_pairs(pending, options, ncu_path, workdir, log)
    else:
        version = ncu_cli.ncu_version(ncu_path)
        with tempfile.TemporaryDirectory(prefix="attnbench-hbm-") as tmp:
            measured = profile_pairs(pending, options, ncu_path, Path(tmp), log)
    return frame(assemble_rows(pending, times, source, measured, options, version, log))


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows to a frame: results columns first, then :data:`HBM_COLUMNS` typed, then ncu_<metric> extras."""
    df = typed_columns(to_frame(rows), HBM_COLUMNS)
    for name in [c for c in df.columns if c.startswith("ncu_") and c not in HBM_COLUMNS]:
        df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
    return df
