"""Run a group of cases against backends in one process and return tidy rows.

Order: cases outer. For one case, its inputs are drawn once and every backend is built on them
(build, first call, kernel names, peak memory); then the case is timed in ``repeats`` rounds, and
within a round its backends run one after another in rotating order (round r starts with the
r-th backend), so that drift, throttling and other processes hit every backend alike and two
backends' round medians pair up (:func:`attnbench.bench.stats.paired_ratio`). Telemetry is read
around every round (:mod:`attnbench.bench.telemetry`). Then each backend's energy window and
numerics run, and the case's rows are appended together.

Each (case, backend) is isolated: an exception becomes that row's status (``oom``,
``unsupported`` for "No available kernel", ``error`` otherwise), whichever phase raised it, and
the group goes on. The built callables of one case are alive at once (a backend's layout copies
stay while the others time), so a case close to the memory limit can run out of memory where it
would not alone: that is an ``oom`` row, and ``peak_mem_bytes`` counts only the row's own backend.
"""
from __future__ import annotations

import math
import os
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from attnbench.bench import conventions, telemetry
from attnbench.case import Case
from attnbench.bench.ceilings import Ceilings
from attnbench.failures import classify
from attnbench.bench.inputs import make_tensors
from attnbench.bench.numerics import (FP8_REL_ERR_BOUND, Baselines, baselines, check_built, check_numerics,
                                      ratios_vs_best_fused)
from attnbench.bench.provenance import environment, kernel_names, sm_clock_mhz, timestamp
from attnbench.bench.results import MEASURED, case_columns, empty_row
from attnbench.bench.timing import DRIFT_LIMIT, Rounds, Timing, time_callable
from attnbench.kernels.registry import Backend, get_backend, safe_available, safe_version


@dataclass
class RunOptions:
    sweep: str = "adhoc"
    group: str = "default"
    device: str = "cpu"
    numerics: bool = True
    max_err_ratio: float = 2.0  # flash-attention's test rule: at most 2x plain PyTorch's error in the same dtype
    seed: int = 0
    warmup_ms: float = 25
    rep_ms: float = 100
    cpu_min_run_time_s: float = 0.2
    min_reps: int = 10
    repeats: int = 3  # rounds per (case, backend); attnbench.plan.run_options gives 5 on CUDA, 3 on CPU
    discard_throttled: bool = False  # time a round again when NVML saw a throttle reason during it
    cooldown_ms: float = 0  # idle time before each backend's round
    energy_ms: float = 500  # back-to-back calls per row for the energy counter (CUDA); 0: no energy
    telemetry_ms: float = 20  # NVML sampling interval while timing; 0: start and end of each round only
    ceilings: Ceilings | None = None


def base_row(case: Case, backend: Backend, device: str, ceilings: Ceilings | None) -> dict:
    """A results row with everything known before running: case fields, provenance, FLOPs, bytes, ceilings."""
    row = empty_row()
    row.update(case_columns(case))
    row.update(environment(device))
    row.update(case_id=case.case_id, backend=backend.name, backend_version=safe_version(backend),
               compute_dtype=backend.compute_dtype or case.dtype, numerics_status="not_run", numerics_reason="",
               flops=conventions.workload_flops(case), flops_padded=conventions.flops(case),
               bytes_min=conventions.workload_bytes_min(case),
               bytes_model=conventions.workload_bytes_model(case, backend.family, backend.fp8_inputs, device=device))
    if ceilings:  # the roofline of the precision the matmuls run in: an fp8 kernel on bf16 inputs is held to fp8's
        row["peak_flops"] = ceilings.peak_flops(row["compute_dtype"])
        row["peak_bytes_per_s"] = ceilings.copy_bytes_per_s
    return row


def _case_seed(case: Case, base: int) -> int:
    return (int(case.case_id, 16) + base) % (2**31)


@dataclass
class _Entry:
    """One backend of the case being measured: its row, its built callable and its rounds so far."""

    backend: Backend
    row: dict
    fn: Callable | None = None
    estimate_s: float = math.nan  # the second call's wall time: sizes the timer
    method: str | None = None  # the timer the first round chose, used by every later round
    timings: list[Timing] = field(default_factory=list)
    windows: list[telemetry.Window] = field(default_factory=list)
    discarded: int = 0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, for the log

    @property
    def live(self) -> bool:
        return self.fn is not None

    def fail(self, status: str, reason: str) -> None:
        self.row.update(status=status, reason=reason)
        self.fn = None

    def spent(self, phase: str, start: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - start


class _Job:
    def __init__(self, backends: list[str], options: RunOptions, log: Callable[[str], None]):
        self.options = options
        self.log = log
        self.backends = [get_backend(name) for name in backends]
        self.availability = {b.name: safe_available(b) for b in self.backends}
        self.env = environment(options.device)
        self.profiled: dict[tuple, list[str]] = {}
        self.reference: tuple[Callable, Case, float, Rounds] | None = None
        self.baselines: tuple[Case, Baselines] | None = None  # the current case's, shared by its backends
        self.telemetry = telemetry.Telemetry.open(options.device, options.telemetry_ms)
        self.job_id = uuid.uuid4().hex[:16]  # pairs rows timed side by side in this process
        self.timing_lock = bool(os.environ.get(telemetry.LEASE_ENV))
        self.case_memory = 0  # bytes allocated once the case's inputs exist (CUDA)

    def sync(self):
        if self.options.device == "cuda":
            torch.cuda.synchronize()

    def time(self, fn: Callable, case: Case, estimate_s: float, method: str | None = None) -> Timing:
        o = self.options
        return time_callable(fn, o.device, prefer_graph=case.mode == "decode", warmup_ms=o.warmup_ms,
                             rep_ms=o.rep_ms, cpu_min_run_time_s=o.cpu_min_run_time_s, estimate_s=estimate_s,
                             min_reps=o.min_reps, method=method)

    def base_row(self, case: Case, backend: Backend) -> dict:
        row = base_row(case, backend, self.options.device, self.options.ceilings)
        row.update(sweep=self.options.sweep, group=self.options.group, timestamp=timestamp(), reason="",
                   job_id=self.job_id, timing_lock=self.timing_lock)
        return row

    def guarded(self, entry: _Entry, step: Callable[[], None]) -> None:
        """Run one phase of one backend; an exception becomes its row's status and drops its callable."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                step()
            except Exception as err:
                entry.fail(*classify(err, caught))
        if not entry.live and self.options.device == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------ phases

    def prepare(self, case: Case, backend: Backend, tensors) -> _Entry:
        entry = _Entry(backend, self.base_row(case, backend))
        ok, reason = self.availability[backend.name]
        if not ok:
            entry.row.update(status="unavailable", reason=reason)
            return entry
        ok, reason = backend.supports(case)
        if not ok:
            entry.row.update(status="unsupported", reason=reason)
            return entry
        self.guarded(entry, lambda: self._build(case, entry, tensors))
        return entry

    def _build(self, case: Case, entry: _Entry, tensors) -> None:
        o, row, backend = self.options, entry.row, entry.backend
        held = torch.cuda.memory_allocated() - self.case_memory if o.device == "cuda" else 0  # the other backends'
        start = time.perf_counter()  # setup_s: build (layout conversion, planning, JIT) and the first call
        entry.fn = backend.build(case, tensors)
        entry.fn()
        self.sync()
        row["setup_s"] = time.perf_counter() - start
        entry.spent("build", start)

        key = (backend.name, case.shape_class)
        if key not in self.profiled:
            t0 = time.perf_counter()
            self.profiled[key] = kernel_names(entry.fn, o.device)
            entry.spent("profile", t0)
        names = self.profiled[key]
        row["kernels"] = ";".join(names)
        if o.device == "cuda" and not backend.kernels_match(names):
            entry.fail("error", f"kernels that ran do not match {backend.name} "
                       f"(pattern {backend.kernel_pattern!r}): {';'.join(names)[:300]}")
            return

        if o.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        entry.fn()
        self.sync()
        entry.estimate_s = time.perf_counter() - start
        if o.device == "cuda":
            row["peak_mem_bytes"] = float(torch.cuda.max_memory_allocated() - held)

    def time_round(self, case: Case, entry: _Entry) -> None:
        """One round of one backend: cooldown, then the timer inside a telemetry window.

        With ``discard_throttled``, a round during which a throttle reason was seen is timed again,
        at most ``repeats`` times over the row (then it is kept, and counted in ``throttle_share``).
        """
        o = self.options
        while True:
            if o.cooldown_ms > 0:
                time.sleep(o.cooldown_ms / 1e3)
            start = time.perf_counter()
            with self.telemetry.window() as window:
                timing = self.time(entry.fn, case, entry.estimate_s, entry.method)
            entry.spent("time", start)
            if o.discard_throttled and telemetry.throttled(window) and entry.discarded < o.repeats:
                entry.discarded += 1
                continue
            entry.method = timing.method
            entry.timings.append(timing)
            entry.windows.append(window)
            return

    def rounds(self, case: Case, entries: list[_Entry]) -> None:
        """``repeats`` rounds; round r runs the live backends starting from the r-th (rotating order)."""
        n = len(entries)
        for r in range(self.options.repeats):
            for entry in (entries[(j + r) % n] for j in range(n)):
                if entry.live:
                    self.guarded(entry, lambda: self.time_round(case, entry))

    def finish(self, case: Case, entry: _Entry) -> None:
        """Statistics, telemetry and energy of a backend whose rounds all ran."""
        o, row = self.options, entry.row
        rounds = Rounds(tuple(entry.timings))
        seconds = rounds.pooled.median
        low, high = rounds.ci()
        pooled = rounds.pooled
        row.update(timer=rounds.method, ms_median=seconds * 1e3, ms_p20=pooled.quantile(0.2) * 1e3,
                   ms_p80=pooled.quantile(0.8) * 1e3, ms_ci_low=low * 1e3, ms_ci_high=high * 1e3, cv=pooled.cv,
                   n_reps=pooled.n, n_rounds=rounds.n_rounds, round_ms=[m * 1e3 for m in rounds.round_medians],
                   round_cv=rounds.round_cv, n_discarded=entry.discarded,
                   tflops=row["flops"] / seconds / 1e12, gbps=row["bytes_model"] / seconds / 1e9,
                   intensity=conventions.intensity(row["flops"], row["bytes_model"]), status="ok",
                   **telemetry.summarize(entry.windows, o.device))
        first, last = entry.windows[0].readings[0], entry.windows[-1].readings[-1]
        row.update(sm_clock_start_mhz=first.clock_mhz, sm_clock_end_mhz=last.clock_mhz)
        if o.device == "cuda" and math.isnan(last.clock_mhz):  # no NVML here: nvidia-smi's reading, once
            row["sm_clock_end_mhz"] = sm_clock_mhz()
        if o.ceilings:
            row["bound"], row["frac_of_peak"] = conventions.roofline_bound(
                row["flops"], row["bytes_model"], seconds, row["peak_flops"], row["peak_bytes_per_s"])
        if o.device == "cuda" and o.energy_ms > 0:
            start = time.perf_counter()
            try:
                row["energy_j"] = telemetry.energy_per_call(entry.fn, self.telemetry, o.energy_ms / 1e3, seconds,
                                                            self.sync)
            except (RuntimeError, torch.OutOfMemoryError):  # the timing stands; only its energy is unknown
                row["energy_j"] = math.nan
            row["tflop_per_j"] = row["flops"] / row["energy_j"] / 1e12 if row["energy_j"] > 0 else math.nan
            entry.spent("energy", start)
        if self.reference is None:
            self.reference = (entry.fn, case, entry.estimate_s, rounds)

    def numerics(self, case: Case, entry: _Entry) -> None:
        """The row's error against fp64 and its gate. The timing stands whatever happens here: a reference
        that runs out of memory makes ``numerics_status`` oom, not the row."""
        start = time.perf_counter()
        row = entry.row
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self._numerics(case, entry.backend, row)
            except Exception as err:
                status, reason = classify(err, caught)
                row.update(numerics_status="oom" if status == "oom" else "error", numerics_reason=reason)
                if self.options.device == "cuda":
                    torch.cuda.empty_cache()
        entry.spent("numerics", start)

    def _baselines(self, case: Case, seed: int) -> Baselines:
        """The case's baselines, computed once for its backends; a failure is kept and raised for each."""
        if self.baselines is None or self.baselines[0] != case:
            self.baselines = None  # free the previous case's tensors first
            try:
                self.baselines = (case, baselines(case, self.options.device, seed))
            except Exception as err:
                self.baselines = (case, err)
        found = self.baselines[1]
        if isinstance(found, Exception):
            raise found
        return found

    def _numerics(self, case: Case, backend: Backend, row: dict) -> None:
        seed = _case_seed(case, self.options.seed + 1)
        base = self._baselines(case, seed)
        if case.dense and not case.page_size:
            def attend(q, k, v):
                return backend.attention(q, k, v, causal=case.causal, scale=case.scale)

            result = check_numerics(case, attend, self.options.device, seed, base)
        else:  # ragged, a variant, or paged: check the built path that was timed
            result = check_built(case, backend, self.options.device, seed, base)
        row.update(rel_err=result.out.rel_err, max_abs_err=result.out.max_abs_err, **result.ratios())
        if result.grads:
            for name, errs in zip(("dq", "dk", "dv"), result.grads):
                row[f"rel_err_{name}"] = errs.rel_err
        errors = [row["rel_err"]] + [row[f"rel_err_{n}"] for n in ("dq", "dk", "dv") if result.grads]
        worst = row["err_ratio_vs_eager"] = result.worst_ratio_vs_eager()
        limit = self.options.max_err_ratio
        row["numerics_status"] = "ok"
        if not all(math.isfinite(e) for e in errors):
            row.update(status="numerics_fail", reason="non-finite output or gradient (NaN/inf, or an unwritten element)")
        elif backend.compute_dtype == "fp8":
            if max(errors) > FP8_REL_ERR_BOUND:
                row.update(status="numerics_fail", reason=f"error {max(errors):.3g} against fp64 (allowed for an "
                           f"e4m3 backend: <= {FP8_REL_ERR_BOUND:g}, twice e4m3's unit roundoff 2^-4)")
        else:
            row["max_err_ratio"] = limit
            if worst > limit:
                row.update(status="numerics_fail",
                           reason=f"error {worst:.2f}x eager's in {case.dtype} (allowed: <= {limit}x)")
        if row["status"] == "numerics_fail":
            row.update(numerics_status="fail", numerics_reason=row["reason"])

    def drift(self) -> float:
        """Re-time the job's first measured call with the same timer; its relative change flags clock or thermal drift."""
        if self.reference is None:
            return float("nan")
        fn, case, estimate_s, first = self.reference
        return self.time(fn, case, estimate_s, first.method).median / first.pooled.median - 1


def _row_text(row: dict) -> str:
    if row["status"] not in MEASURED:
        return row["reason"][:120]
    return (f"{row['ms_median']:.4f} ms [{row['ms_ci_low']:.4f}, {row['ms_ci_high']:.4f}] over "
            f"{row['n_rounds']} rounds, {row['tflops']:.2f} TFLOP/s")


def run_group(cases: list[Case], backends: list[str], options: RunOptions,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              rows: list[dict] | None = None) -> list[dict]:
    """Measure every (case, backend); never raises for a single case's failure.

    A case's rows are appended to ``rows`` (a new list by default) once all its rounds, energy
    windows and numerics are done, so a caller that is interrupted still holds every finished case.
    The drift check re-times the job's first measured call after every case: a case's rows carry the
    drift up to their end, so the rows of a job stopped part-way still say how far its clocks had moved,
    and once the job ends every row carries the drift over the whole job.
    """
    job = _Job(backends, options, log)
    rows = [] if rows is None else rows
    first = len(rows)
    drift = float("nan")  # nothing measured yet
    for i, case in enumerate(cases, 1):
        started = time.perf_counter()
        try:
            tensors = make_tensors(case, options.device, seed=_case_seed(case, options.seed))
        except Exception as err:  # inputs that cannot be drawn are this case's rows (oom or error), not the job's end
            tensors, input_error = None, classify(err)
        if tensors is None:
            entries = [_Entry(b, {**job.base_row(case, b), "status": input_error[0],
                                  "reason": f"drawing the case's inputs: {input_error[1]}"}) for b in job.backends]
        else:
            job.case_memory = torch.cuda.memory_allocated() if options.device == "cuda" else 0
            entries = [job.prepare(case, backend, tensors) for backend in job.backends]
            job.rounds(case, entries)
            for entry in entries:
                if entry.live:
                    job.guarded(entry, lambda: job.finish(case, entry))
                entry.fn = None
            for entry in entries:
                if entry.row["status"] == "ok":
                    if options.numerics:
                        job.numerics(case, entry)
                    else:
                        entry.row["numerics_status"] = "off"
            if options.numerics:
                fused = [e.backend.family == "fused" and e.backend.compute_dtype is None for e in entries]
                for entry, ratio in zip(entries, ratios_vs_best_fused([e.row for e in entries], fused)):
                    entry.row["err_ratio_vs_best_fused"] = ratio
        drift = job.drift()
        for entry in entries:
            _set_drift(entry.row, drift)
        rows.extend(entry.row for entry in entries)
        for entry in entries:
            log(f"[{i}/{len(cases)}] {entry.backend.name:15s} {case.label()}: {entry.row['status']} "
                f"{_row_text(entry.row)} (" + " ".join(f"{k} {v:.1f}" for k, v in entry.phases.items()) + " s)")
        log(f"[{i}/{len(cases)}] case done in {time.perf_counter() - started:.1f} s")
        del tensors, entries
        job.baselines = None
        if options.device == "cuda":
            torch.cuda.empty_cache()
    for row in rows[first:]:
        _set_drift(row, drift)
    return rows


def _set_drift(row: dict, drift: float) -> None:
    row["job_drift"] = drift
    row["drift_flag"] = bool(abs(drift) > DRIFT_LIMIT)  # NaN (nothing measured) compares False
