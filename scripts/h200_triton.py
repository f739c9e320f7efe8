#!/usr/bin/env python3
"""The project's Triton attention on one H200: correctness at full size, speed beside flash-attn-4 and cuDNN.

usage (on the GPU host, from the repository root):
    export PYTHONPATH=$PWD OUT=results/h200-triton; python3 scripts/h200_triton.py

Phases, each guarded so that one failure loses only its own rows, in order of priority
within a deadline (BUDGET_S, default 225 s; cases not started in time are ``skipped`` rows):

1. compile every autotuning config of every kernel variant the grid needs (forward,
   backward, fp8; bf16/fp16; head dim 64/128; causal or not) in parallel processes
   (``launch.* (config=..., compile_only=True)``), filling Triton's on-disk cache;
2. correctness on the GPU: the harness gate (``check_numerics``: error against fp64 at most
   2x eager's) for forward+backward at B2 H16 S1024 per (dtype, head dim, causal), and for the
   fp8 forward its error against fp64 and against the bf16 kernel, with the quantisation's
   overflow and underflow shares; every timed Triton case is also compared with cuDNN's output;
3. timing with ``triton.testing.do_bench`` (median; L2 flushed) of triton, fa4
   (``flash_attn.cute``, an ``unavailable`` row where it is not installed), sdpa-cudnn and
   sdpa-flash in this process: forward and forward+backward, bf16 then fp16, head dim 128
   then 64, S 4k/8k/16k/1k with B*S = 16k tokens, 16 heads, causal and not; the fp8 forward
   at the same shapes. In forward+backward, ``triton`` (the dQ path timed per shape by the
   launcher) is joined by ``triton-dq-atomic`` and ``triton-dq-separate``, the backward's two
   dQ paths pinned, side by side, and after the baselines by ``triton-last``, the launcher's
   path timed again (its ratio to ``triton`` is how far a median moves between two timings).
   The forward's autotuning space holds both key loops (the plain one and ``PIPELINE_QK``,
   Q K^T one tile ahead of the softmax); the one kept per shape is recorded
   (``fwd_pipeline_qk``, ``fwd_config``). FLOPs from ``attnbench.bench.conventions.flops``;
4. the compiler's report on the kernels of the S=4096 bf16 cases (registers, spills, shared
   memory, SASS instruction mix) and the roofline position against ceilings measured here;
5. with time left, the ``gpu``-marked tests of tests/test_triton.py (per-test lines in $OUT/gpu_tests.txt;
   the report counts what passed even when the deadline cuts the run).

Writes $OUT/triton_bench.parquet (one row per measurement: part, backend, shape, status,
ms, TFLOP/s, ratios, errors) and $OUT/triton_report.txt (tables, targets, compiler report,
phase times), and prints the TFLOP/s table last.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pandas as pd

from attnbench.failures import one_line

TOKENS, HEADS = 16384, 16
SEQS = [4096, 8192, 16384, 1024]  # the targets are about S >= 4096: those first
BASELINES = ["fa4", "sdpa-cudnn", "sdpa-flash"]
WARMUP_MS, REP_MS = 25, 60
CHECK = dict(batch=2, seq=1024)  # the correctness shape: same kernel specialisation as the grid
KERNELS = {"fwd": ["_attn_fwd"], "fp8": ["_attn_fwd_fp8"],  # what one call of each part launches; the backward
           "fwd_bwd": ["_attn_fwd", "_attn_bwd_preprocess", "_attn_bwd", "_attn_bwd_dkdv", "_attn_bwd_dq"]}  # one path
DQ_VARIANTS = ["triton-dq-atomic", "triton-dq-separate"]  # fwd_bwd rows with the backward's dQ path pinned
# fwd_bwd: the launcher's own path timed again, after the baselines. At D64 S 1024, runs 2 and 3 timed `triton` and
# the pinned path it had chosen (the same kernels) up to 1.5x apart, either way; this row measures how far one
# backend's median moves within one process between two timings of the same case
ORDER_PROBE = "triton-last"
START = time.time()
DEADLINE = START + float(os.environ.get("BUDGET_S", 225))


def log(msg: str) -> None:
    print(f"[{time.time() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def left() -> float:
    return DEADLINE - time.time()


def case_of(part: str, dtype: str, head_dim: int, seq: int, causal: bool, batch: int | None = None):
    from attnbench.case import Case

    return Case(mode="fwd_bwd" if part == "fwd_bwd" else "fwd", layout="mha", batch=batch or TOKENS // seq,
                heads_q=HEADS, heads_kv=HEADS, head_dim_qk=head_dim, head_dim_v=head_dim, seq_q=seq, seq_kv=seq,
                causal=causal, dtype=dtype)


def backend_of(name: str):
    """A registered backend; for ``triton-dq-<mode>`` the triton backend with that dQ path pinned, and for
    ``ORDER_PROBE`` the triton backend under another name."""
    from attnbench.kernels import get_backend

    if name not in (*DQ_VARIANTS, ORDER_PROBE):
        return get_backend(name)
    from attnbench.kernels.triton.backend import TritonFlash

    variant = TritonFlash()
    variant.name = name
    if name in DQ_VARIANTS:
        variant.dq_mode = name.removeprefix("triton-dq-")
    return variant


# --- 1. parallel compilation -------------------------------------------------------------------------------------

def compile_task(task: tuple) -> tuple:
    """In a worker process: compile one config of one kernel variant into Triton's on-disk cache."""
    kind, dtype, head_dim, causal, index = task
    start = time.time()
    try:
        import torch

        from attnbench.kernels.triton import launch, tuning
        from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv

        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        q, k, v, o, do = (torch.randn(1, HEADS, 256, head_dim, device="cuda", dtype=torch_dtype) for _ in range(5))
        scale = head_dim ** -0.5
        config = tuning.TABLES[kind][head_dim][index]
        if kind == "fwd":
            launch.forward(q, k, v, causal=causal, scale=scale, config=config, compile_only=True)
        elif kind in ("bwd", "dkdv", "dq"):  # bwd: the atomic dQ path's kernel; dkdv, dq: the separate path's
            lse = torch.zeros(1, HEADS, 256, device="cuda")
            launch.backward(do, q, k, v, o, lse, causal=causal, scale=scale, compile_only=True,
                            dq_mode="atomic" if kind == "bwd" else "separate", config=None if kind == "dq" else config,
                            dq_config=config if kind == "dq" else None)
        else:
            (q8, k8, v8), _ = quantize_qkv(q, k, v, BLOCK_ROWS)
            launch.fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=torch_dtype, config=config,
                               compile_only=True)
        return task, time.time() - start, ""
    except Exception as err:
        return task, time.time() - start, one_line(err)


def compile_all(report: list) -> None:
    from attnbench.kernels.triton import tuning

    tasks = []
    for dtype, head_dim in (("bf16", 128), ("bf16", 64), ("fp16", 128), ("fp16", 64)):
        for causal in (False, True):
            for kind, table in tuning.TABLES.items():
                if kind != "fp8" or dtype == "bf16":  # the grid times the fp8 forward in bf16 only
                    tasks += [(kind, dtype, head_dim, causal, i) for i in range(len(table[head_dim]))]
    workers = max(1, min(len(tasks), (os.cpu_count() or 2) - 1))
    start = time.time()
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(compile_task, task) for task in tasks]
    done, pending = concurrent.futures.wait(futures, timeout=max(30.0, min(150.0, left() - 90)))
    pool.shutdown(wait=not pending, cancel_futures=True)  # leftovers compile on demand in this process
    failures = [f"  {task}: {error}" for task, _, error in (f.result() for f in done) if error]
    slowest = max((f.result()[1] for f in done), default=0.0)
    report.append(f"compiled {len(done)} of {len(tasks)} kernel configs in {time.time() - start:.1f} s on {workers} "
                  f"processes (slowest {slowest:.1f} s); {len(failures)} failed" + "".join("\n" + f for f in failures))
    log(report[-1].splitlines()[0])


# --- 2. correctness ------------------------------------------------------------------------------------------------

def check_backward(rows: list, dtype: str, head_dim: int) -> None:
    """The harness gate on forward+backward (error vs fp64 <= 2x eager's) per causal setting and dQ path."""
    from attnbench.bench.numerics import check_numerics

    for causal, name in itertools.product((False, True), DQ_VARIANTS):
        backend = backend_of(name)
        case = case_of("fwd_bwd", dtype, head_dim, CHECK["seq"], causal, CHECK["batch"])
        row = dict(part="check", backend=name, dtype=dtype, head_dim=head_dim, seq=case.seq_q, batch=case.batch,
                   causal=causal)
        try:
            res = check_numerics(case, lambda q, k, v: backend.attention(q, k, v, causal=causal, scale=case.scale),
                                 "cuda", seed=1)
            ratio = res.worst_ratio_vs_eager()
            row.update(status="ok" if ratio <= 2.0 else "failed", err_vs_fp64=res.out.rel_err,
                       err_ratio_vs_eager=ratio, **{f"err_d{n}_vs_fp64": g.rel_err for n, g in zip("qkv", res.grads)})
        except Exception as err:
            row.update(status="error", reason=one_line(err))
        rows.append(row)
        log(f"check fwd_bwd {name} {dtype} D{head_dim} causal={causal}: {row['status']} "
            f"ratio={row.get('err_ratio_vs_eager', float('nan')):.2f}")


def check_fp8(rows: list, head_dim: int) -> None:
    """fp8 forward: error vs fp64, vs the bf16 kernel, bf16's own error, and the quantisation shares."""
    import torch

    from attnbench.bench.inputs import make_tensors
    from attnbench.bench.numerics import Errors, reference
    from attnbench.kernels.triton import launch
    from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv

    for causal in (False, True):
        case = case_of("fwd", "bf16", head_dim, CHECK["seq"], causal, CHECK["batch"])
        row = dict(part="check-fp8", backend="triton-fp8", dtype="bf16", head_dim=head_dim, seq=case.seq_q,
                   batch=case.batch, causal=causal)
        try:
            t = make_tensors(case, "cuda", seed=2, dtype=torch.float64)
            ref, _ = reference(t, case)
            q, k, v = (x.to(torch.bfloat16) for x in (t.q, t.k, t.v))
            (q8, k8, v8), stats = quantize_qkv(q, k, v, BLOCK_ROWS)
            out8, _ = launch.fp8_forward(q8, k8, v8, causal=causal, scale=case.scale, out_dtype=torch.bfloat16)
            out16, _ = launch.forward(q, k, v, causal=causal, scale=case.scale)
            row.update(status="ok", err_vs_fp64=Errors.of(out8, ref).rel_err,
                       err_vs_bf16_kernel=Errors.of(out8, out16.double()).rel_err,
                       bf16_err_vs_fp64=Errors.of(out16, ref).rel_err, overflow_share=stats.overflow_share,
                       underflow_share=stats.underflow_share, scale_block_rows=BLOCK_ROWS)
        except Exception as err:
            row.update(status="error", reason=one_line(err))
        rows.append(row)
        log(f"check fp8 D{head_dim} causal={causal}: {row['status']} err={row.get('err_vs_fp64', float('nan')):.4f}")


def rel_diff(triton_backend, ref_backend, case, tensors) -> float:
    """Largest relative Frobenius difference of output (and gradients) between two backends' attention()."""
    import torch

    def run(backend):
        q, k, v = (x.detach().requires_grad_(case.has_backward) for x in (tensors.q, tensors.k, tensors.v))
        out = backend.attention(q, k, v, causal=case.causal, scale=case.scale)
        grads = torch.autograd.grad(out, (q, k, v), tensors.dout) if case.has_backward else ()
        return [out.detach().float(), *(g.float() for g in grads)]

    mine, ref = run(triton_backend), run(ref_backend)
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(mine, ref))


# --- 3. timing ------------------------------------------------------------------------------------------------------

def time_part(rows: list, reports: list, part: str, dtype: str, head_dim: int, ceilings) -> None:
    import torch
    from triton.testing import do_bench

    from attnbench.bench.conventions import flops
    from attnbench.bench.inputs import make_tensors
    from attnbench.kernels import safe_available

    names = {"fp8": ["triton-fp8"], "fwd": ["triton", *BASELINES],
             "fwd_bwd": ["triton", *DQ_VARIANTS, *BASELINES, ORDER_PROBE]}[part]
    for seq in SEQS:
        for causal in (False, True):
            case = case_of(part, dtype, head_dim, seq, causal)
            tensors = None
            for name in names:
                backend = backend_of(name)
                row = dict(part=part, backend=name, dtype=dtype, head_dim=head_dim, seq=seq, batch=case.batch,
                           causal=causal, flops=flops(case))
                rows.append(row)
                ok, reason = safe_available(backend)
                if ok:
                    ok, reason = backend.supports(case)
                if not ok:
                    row.update(status="unavailable" if "install" in reason or "not installed" in reason
                               else "unsupported", reason=reason)
                    continue
                if left() < 8:
                    row.update(status="skipped", reason="out of time")
                    continue
                try:
                    tensors = tensors or make_tensors(case, "cuda", seed=3)
                    start = time.time()
                    fn = backend.build(case, tensors)
                    fn()  # compiles / autotunes / JITs
                    torch.cuda.synchronize()
                    row["setup_s"] = time.time() - start
                    ms = do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
                    row.update(status="ok", ms=ms, tflops=row["flops"] / (ms * 1e-3) / 1e12)
                    if name.startswith("triton") and name != ORDER_PROBE:
                        try:
                            describe(row, reports, backend, case, tensors, part, ceilings)
                        except Exception as err:  # the timing stands; say what the extras could not measure
                            row["extras_error"] = one_line(err)
                    del fn
                except torch.cuda.OutOfMemoryError as err:
                    row.update(status="oom", reason=one_line(err))
                except Exception as err:
                    row.update(status="error", reason=one_line(err))
                    log(traceback.format_exc(limit=3))
                torch.cuda.empty_cache()
                log(f"{part} {dtype} D{head_dim} S{seq} causal={causal} {name}: {row['status']} "
                    f"{row.get('tflops', float('nan')):.0f} TFLOP/s")
            del tensors


def describe(row: dict, reports: list, backend, case, tensors, part: str, ceilings) -> None:
    """A timed Triton row's extras: chosen configs, roofline position, compiler report, cross-checks."""
    from attnbench.bench.conventions import bytes_model, roofline_bound
    from attnbench.kernels import get_backend, safe_available
    from attnbench.kernels.triton import backward as bwd_kernels
    from attnbench.kernels.triton import forward as fwd_kernels
    from attnbench.kernels.triton import launch
    from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv
    from attnbench.kernels.triton.sass import compiler_report

    tuned = fwd_kernels.attn_fwd_fp8 if part == "fp8" else fwd_kernels.attn_fwd
    row["fwd_config"] = str(getattr(tuned, "best_config", ""))
    best = getattr(tuned, "best_config", None)  # which forward loop the autotuner kept (PIPELINE_QK: Q K^T ahead)
    row["fwd_pipeline_qk"] = bool(best.kwargs.get("PIPELINE_QK")) if best is not None else None
    if part == "fwd_bwd":  # the path the latest backward ran (launch keeps only its kernels)
        row["dq_mode"] = "atomic" if "_attn_bwd" in launch.last_compiled else "separate"
        tuned_bwd = ([bwd_kernels.attn_bwd] if row["dq_mode"] == "atomic"
                     else [bwd_kernels.attn_bwd_dkdv, bwd_kernels.attn_bwd_dq])
        row["bwd_config"] = "; ".join(str(getattr(t, "best_config", "")) for t in tuned_bwd)
    if ceilings:
        case_bytes = bytes_model(case, backend.family, backend.fp8_inputs)  # triton-fp8 reads Q, K, V in e4m3
        row["bound"], row["roofline_fraction"] = roofline_bound(
            row["flops"], case_bytes, row["ms"] * 1e-3, ceilings.peak_flops("fp8" if part == "fp8" else case.dtype),
            ceilings.copy_bytes_per_s)
    if part == "fp8":
        _, stats = quantize_qkv(tensors.q.detach(), tensors.k.detach(), tensors.v.detach(), BLOCK_ROWS)
        row.update(overflow_share=stats.overflow_share, underflow_share=stats.underflow_share)
    else:
        ref_name = "sdpa-cudnn" if safe_available(get_backend("sdpa-cudnn"))[0] else "sdpa-flash"
        row["rel_diff_vs_" + ref_name] = rel_diff(backend, get_backend(ref_name), case, tensors)
    if case.seq_q == 4096 and not case.causal:  # the main case: the compiler's report on its kernels
        fn = backend.build(case, tensors)
        fn()  # the main case's own launches, after rel_diff's
        for kernel_name in KERNELS[part]:
            if kernel_name in launch.last_compiled:  # of the backward, the kernels of the path that ran
                reports.append(dict(compiler_report(kernel_name, launch.last_compiled[kernel_name]), part=part,
                                    backend=row["backend"], dtype=case.dtype, head_dim=case.head_dim_qk,
                                    seq=case.seq_q))


# --- 4. report -----------------------------------------------------------------------------------------------------

def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Triton's TFLOP/s over each baseline's and the fp8 forward over the bf16 forward, per shape."""
    key = ["dtype", "head_dim", "seq", "causal"]
    ok = df[(df.get("status") == "ok") & df["part"].isin(["fwd", "fwd_bwd", "fp8"])]
    wide = ok.pivot_table(index=["part", *key], columns="backend", values="tflops").reset_index()
    for base in BASELINES:
        if base in wide and "triton" in wide:
            wide[f"triton/{base}"] = wide["triton"] / wide[base]
    if all(name in wide for name in DQ_VARIANTS):  # fwd_bwd: the separate dQ path against the atomic one
        wide["dq separate/atomic"] = wide["triton-dq-separate"] / wide["triton-dq-atomic"]
    if ORDER_PROBE in wide and "triton" in wide:  # 1.0 unless the order of timing moves the launcher's row
        wide[f"{ORDER_PROBE}/triton"] = wide[ORDER_PROBE] / wide["triton"]
    fp8 = wide[wide.part == "fp8"].set_index(key)["triton-fp8"] if "triton-fp8" in wide else pd.Series(dtype=float)
    bf16 = wide[wide.part == "fwd"].set_index(key)["triton"] if "triton" in wide else pd.Series(dtype=float)
    if len(fp8):
        speedup = (fp8 / bf16.reindex(fp8.index)).rename("fp8/bf16").reset_index()
        speedup["part"] = "fp8"
        wide = wide.merge(speedup, on=["part", *key], how="left")
    return wide


def targets(wide: pd.DataFrame) -> list[str]:
    if wide.empty:
        return ["no timings"]
    lines = []
    main = wide[(wide.dtype == "bf16") & (wide.head_dim == 128) & (wide.seq >= 4096)]
    for part, target, col in (("fwd", 0.8, "triton/fa4"), ("fwd_bwd", 0.7, "triton/fa4"), ("fp8", 1.3, "fp8/bf16")):
        sel = main[main.part == part]
        if col not in sel or sel[col].isna().all():
            lines.append(f"{part}: {col} not measured (baseline unavailable or out of time)")
            continue
        worst, best = sel[col].min(), sel[col].max()
        verdict = "met" if worst >= target else "NOT met"
        lines.append(f"{part} bf16 D128 S>=4096: {col} {worst:.2f}-{best:.2f} (target >= {target}): {verdict}")
    return lines


def write(rows: list, reports: list, notes: list, out: Path) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df.to_parquet(out / "triton_bench.parquet", index=False)
    text = ["# Triton attention on " + notes[0], ""] + notes[1:]
    if df.empty:
        (out / "triton_report.txt").write_text("\n".join(text) + "\n")
        return df
    if "tflops" in df:
        wide = ratios(df)
        text += ["", "## Targets", *targets(wide), "", "## TFLOP/s and ratios", wide.to_string(index=False,
                                                                                          float_format="%.2f")]
    if "fwd_pipeline_qk" in df:  # the autotuner's choice between the two forward loops, per timed shape
        chosen = df[(df.backend == "triton") & df.fwd_pipeline_qk.notna()]
        text += ["", "## Forward loop chosen by the autotuner (fwd_pipeline_qk: Q K^T one tile ahead)",
                 chosen[["part", "dtype", "head_dim", "seq", "causal", "fwd_pipeline_qk", "fwd_config"]]
                 .to_string(index=False)]
    checks = df[df.part.isin(["check", "check-fp8"])]
    if len(checks):
        shape = f"B{CHECK['batch']} H{HEADS} S{CHECK['seq']}"
        text += ["", f"## Correctness ({shape}; errors are relative Frobenius norms)",
                 checks.dropna(axis=1, how="all").to_string(index=False, float_format="%.3g")]
    if reports:
        text += ["", "## Compiler report (kernels of the S=4096 non-causal cases)",
                 pd.DataFrame(reports).to_string(index=False)]
    (out / "triton_report.txt").write_text("\n".join(text) + "\n")
    return df


def gpu_tests(timeout: float, out: Path) -> str:
    """Run the ``gpu``-marked tests of tests/test_triton.py; one line with what passed, even if cut at the deadline.

    Each full-size test autotunes every config for its new shape (seconds a test), so the whole set may not fit
    the time left: the verbose per-test lines (kept in ``$OUT/gpu_tests.txt``) are counted either way.
    """
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_triton.py"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        log_text, cut = done.stdout, ""
    except subprocess.TimeoutExpired as err:
        log_text = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        cut = ", stopped at the deadline"
    (out / "gpu_tests.txt").write_text(log_text)
    counts = {word: len(re.findall(rf"::\S+ {word}", log_text)) for word in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    failed = re.findall(r"::(\S+) (?:FAILED|ERROR)", log_text)
    return (f"gpu tests (tests/test_triton.py -m gpu): {counts['PASSED']} passed, {counts['FAILED']} failed, "
            f"{counts['ERROR']} errors, {counts['SKIPPED']} skipped{cut}"
            + (f"; failing: {', '.join(failed)}" if failed else ""))


def main() -> None:
    import torch

    out = Path(os.environ.get("OUT", "results/h200-triton"))
    out.mkdir(parents=True, exist_ok=True)
    rows, reports = [], []
    notes = [f"{torch.cuda.get_device_name()} (torch {torch.__version__})"]
    try:
        import triton

        from attnbench.bench.provenance import git_sha
        from attnbench.kernels import get_backend, safe_available

        fa4 = safe_available(get_backend("fa4"))
        notes += [f"triton {triton.__version__}, git {git_sha()}, budget {DEADLINE - START:.0f} s",
                  f"fa4: {'available ' + get_backend('fa4').version() if fa4[0] else 'unavailable: ' + fa4[1]}",
                  f"shapes: B*S = {TOKENS} tokens, {HEADS} heads (MHA), do_bench median, warmup {WARMUP_MS} ms, "
                  f"rep {REP_MS} ms; FLOPs = attnbench.bench.conventions.flops (causal halves, bwd 2.5x fwd)"]
    except Exception as err:
        notes.append(f"setup: {one_line(err)}")
    phases = {}

    def phase(name, fn, *args):
        start = time.time()
        try:
            fn(*args)
        except Exception as err:
            notes.append(f"{name} failed: {one_line(err)}")
            log(traceback.format_exc())
        phases[name] = time.time() - start
        write(rows, reports, notes + [f"phase times (s): {phases}"], out)

    phase("compile", compile_all, notes)
    ceilings = None
    try:
        from attnbench.bench.ceilings import measure_ceilings

        ceilings = measure_ceilings("cuda", dtypes=("bf16", "fp16", "fp8"))
        notes.append(f"ceilings: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, matmul "
                     + ", ".join(f"{k} {v / 1e12:.0f}" for k, v in ceilings.matmul_flops_per_s.items()) + " TFLOP/s")
    except Exception as err:
        notes.append(f"ceilings failed: {one_line(err)}")
    for dtype, head_dim in (("bf16", 128), ("bf16", 64), ("fp16", 128), ("fp16", 64)):
        phase(f"check {dtype} D{head_dim}", check_backward, rows, dtype, head_dim)
        for part in ("fwd", "fwd_bwd"):
            phase(f"{part} {dtype} D{head_dim}", time_part, rows, reports, part, dtype, head_dim, ceilings)
        if dtype == "bf16":
            phase(f"check fp8 D{head_dim}", check_fp8, rows, head_dim)
            phase(f"fp8 D{head_dim}", time_part, rows, reports, "fp8", dtype, head_dim, ceilings)
    if left() > 30:
        notes.append(gpu_tests(left() - 10, out))
    else:
        notes.append("gpu tests: not run (out of time)")
    df = write(rows, reports, notes + [f"phase times (s): {phases}"], out)
    if "tflops" in df:
        wide = ratios(df)
        main_cols = [c for c in ["part", "dtype", "head_dim", "seq", "causal", "triton", *DQ_VARIANTS, "triton-fp8",
                                 "fa4", "sdpa-cudnn", "triton/fa4", "triton/sdpa-cudnn", "dq separate/atomic",
                                 "fp8/bf16"] if c in wide]
        print(wide[(wide.dtype == "bf16") & (wide.head_dim == 128)][main_cols].to_string(index=False,
                                                                                        float_format="%.2f"))
        print("\n".join(targets(wide)))


if __name__ == "__main__":
    main()
