"""Run a group of cases against backends in one process and return tidy rows.

Order: cases outer, backends inner, so a case's inputs are drawn once and every
backend times the same tensors. Each (case, backend) is isolated: an exception
becomes that row's status (``oom``, ``unsupported`` for "No available kernel",
``error`` otherwise) and the group goes on.
"""
from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.bench import conventions
from attnbench.case import Case
from attnbench.bench.ceilings import Ceilings
from attnbench.failures import classify
from attnbench.bench.inputs import make_tensors
from attnbench.bench.numerics import Baselines, baselines, check_built, check_numerics
from attnbench.bench.provenance import environment, kernel_names, sm_clock_mhz, timestamp
from attnbench.bench.results import case_columns, empty_row
from attnbench.bench.timing import DRIFT_LIMIT, Timing, time_callable
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
               bytes_model=conventions.workload_bytes_model(case, backend.family, backend.fp8_inputs))
    if ceilings:
        row["peak_flops"] = ceilings.peak_flops(case.dtype)
        row["peak_bytes_per_s"] = ceilings.copy_bytes_per_s
    return row


def _case_seed(case: Case, base: int) -> int:
    return (int(case.case_id, 16) + base) % (2**31)


class _Job:
    def __init__(self, backends: list[str], options: RunOptions, log: Callable[[str], None]):
        self.options = options
        self.log = log
        self.backends = [get_backend(name) for name in backends]
        self.availability = {b.name: safe_available(b) for b in self.backends}
        self.env = environment(options.device)
        self.profiled: dict[tuple, list[str]] = {}
        self.phases: dict[str, float] = {}  # seconds per phase of the current row, for the log
        self.reference: tuple[Callable, Case, float, Timing] | None = None
        self.baselines: tuple[Case, Baselines] | None = None  # the current case's, shared by its backends

    def sync(self):
        if self.options.device == "cuda":
            torch.cuda.synchronize()

    def time(self, fn: Callable, case: Case, estimate_s: float) -> Timing:
        o = self.options
        return time_callable(fn, o.device, prefer_graph=case.mode == "decode", warmup_ms=o.warmup_ms,
                             rep_ms=o.rep_ms, cpu_min_run_time_s=o.cpu_min_run_time_s, estimate_s=estimate_s,
                             min_reps=o.min_reps)

    def base_row(self, case: Case, backend: Backend) -> dict:
        row = base_row(case, backend, self.options.device, self.options.ceilings)
        row.update(sweep=self.options.sweep, group=self.options.group, timestamp=timestamp(), reason="")
        return row

    def measure(self, case: Case, backend: Backend, tensors) -> dict:
        row = self.base_row(case, backend)
        ok, reason = self.availability[backend.name]
        if not ok:
            return {**row, "status": "unavailable", "reason": reason}
        ok, reason = backend.supports(case)
        if not ok:
            return {**row, "status": "unsupported", "reason": reason}
        device = self.options.device
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self._measure(case, backend, tensors, row)
            except Exception as err:
                status, reason = classify(err, caught)
                row.update(status=status, reason=reason)
        if row["status"] != "ok" and device == "cuda":
            torch.cuda.empty_cache()
        return row

    def _measure(self, case: Case, backend: Backend, tensors, row: dict) -> None:
        o = self.options
        start = time.perf_counter()  # setup_s: build (layout conversion, planning, JIT) and the first call
        fn = backend.build(case, tensors)
        fn()
        self.sync()
        row["setup_s"] = time.perf_counter() - start

        key = (backend.name, case.shape_class)
        if key not in self.profiled:
            t0 = time.perf_counter()
            self.profiled[key] = kernel_names(fn, o.device)
            self.phases["profile"] = time.perf_counter() - t0
        names = self.profiled[key]
        row["kernels"] = ";".join(names)
        if o.device == "cuda" and not backend.kernels_match(names):
            row.update(status="error", reason=f"kernels that ran do not match {backend.name} "
                       f"(pattern {backend.kernel_pattern!r}): {';'.join(names)[:300]}")
            return

        if o.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        fn()
        self.sync()
        second_call_s = time.perf_counter() - start
        if o.device == "cuda":
            row["peak_mem_bytes"] = float(torch.cuda.max_memory_allocated())

        row["sm_clock_start_mhz"] = sm_clock_mhz()
        t0 = time.perf_counter()
        timing = self.time(fn, case, second_call_s)
        self.phases["time"] = time.perf_counter() - t0
        row["sm_clock_end_mhz"] = sm_clock_mhz()
        seconds = timing.median
        row.update(timer=timing.method, ms_median=seconds * 1e3, ms_p20=timing.quantile(0.2) * 1e3,
                   ms_p80=timing.quantile(0.8) * 1e3, cv=timing.cv, n_reps=timing.n,
                   tflops=row["flops"] / seconds / 1e12, gbps=row["bytes_model"] / seconds / 1e9,
                   intensity=conventions.intensity(row["flops"], row["bytes_model"]), status="ok")
        if o.ceilings:
            row["bound"], row["frac_of_peak"] = conventions.roofline_bound(
                row["flops"], row["bytes_model"], seconds, row["peak_flops"], row["peak_bytes_per_s"])
        if self.reference is None:
            self.reference = (fn, case, second_call_s, timing)
        del fn

        if not o.numerics:
            row["numerics_status"] = "off"
            return
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # the timing stands whatever happens here: a reference that runs out of memory is not an oom row
                self._numerics(case, backend, row)
            except Exception as err:
                status, reason = classify(err, caught)
                row.update(numerics_status="oom" if status == "oom" else "error", numerics_reason=reason)
                if self.options.device == "cuda":
                    torch.cuda.empty_cache()
        self.phases["numerics"] = time.perf_counter() - t0

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
        row["numerics_status"] = "ok"
        if not all(math.isfinite(e) for e in errors):
            row.update(status="numerics_fail", reason="non-finite output or gradient (NaN/inf, or an unwritten element)")
        elif backend.compute_dtype is None and worst > self.options.max_err_ratio:
            row.update(status="numerics_fail",
                       reason=f"error {worst:.2f}x eager's in {case.dtype} (allowed: <= {self.options.max_err_ratio}x)")
        if row["status"] == "numerics_fail":
            row.update(numerics_status="fail", numerics_reason=row["reason"])

    def drift(self) -> float:
        """Re-time the job's first measured call with the same timer; its relative change flags clock or thermal drift."""
        if self.reference is None:
            return float("nan")
        fn, case, estimate_s, first = self.reference
        return self.time(fn, case, estimate_s).median / first.median - 1


def run_group(cases: list[Case], backends: list[str], options: RunOptions,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              rows: list[dict] | None = None) -> list[dict]:
    """Measure every (case, backend); never raises for a single case's failure.

    Rows are appended to ``rows`` (a new list by default) as they are measured, so a
    caller that is interrupted still holds every finished row.
    """
    job = _Job(backends, options, log)
    rows = [] if rows is None else rows
    first = len(rows)
    for i, case in enumerate(cases, 1):
        try:
            tensors = make_tensors(case, options.device, seed=_case_seed(case, options.seed))
        except Exception as err:  # inputs that cannot be drawn are this case's rows (oom or error), not the job's end
            tensors, input_error = None, classify(err)
        for backend in job.backends:
            started = time.perf_counter()
            job.phases = {}
            if tensors is None:
                row = {**job.base_row(case, backend), "status": input_error[0],
                       "reason": f"drawing the case's inputs: {input_error[1]}"}
            else:
                row = job.measure(case, backend, tensors)
            rows.append(row)
            timing = f"{row['ms_median']:.4f} ms {row['tflops']:.2f} TFLOP/s" if row["status"] in ("ok", "numerics_fail") else row["reason"][:120]
            log(f"[{i}/{len(cases)}] {backend.name:15s} {case.label()}: {row['status']} {timing} "
                f"({time.perf_counter() - started:.1f} s: "
                + " ".join(f"{k} {v:.1f}" for k, v in job.phases.items()) + ")")
        del tensors
        job.baselines = None
        if options.device == "cuda":
            torch.cuda.empty_cache()
    drift = job.drift()
    for row in rows[first:]:
        row["job_drift"] = drift
        row["drift_flag"] = bool(abs(drift) > DRIFT_LIMIT)  # NaN (nothing measured) compares False
    return rows
