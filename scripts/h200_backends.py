#!/usr/bin/env python3
"""Paper grid of the named GPU backends on one H200: fwd, fwd_bwd and decode, every backend available.

usage (on the GPU host, from the repository root):
    export PYTHONPATH=$PWD OUT=results/h200-backends; python3 scripts/h200_backends.py

Writes into $OUT: backends.parquet (one results row per (case, backend), fa2/fa3 rows
``unavailable`` with their install command where they are not installed), ceilings.json (copy
bandwidth and matmul rate measured first), tables.md (the tables printed last: TFLOP/s per
backend x sequence length in the style of the FA3 README, decode as a fraction of the measured
copy bandwidth, FlashInfer JIT times, fp8 errors).

Budget (BUDGET_S, default 290 s). FlashInfer JIT-compiles each kernel variant once (about 70 s
a prefill variant, 12 s a decode variant on 16 cores), so its variants are few (bf16 D128 prefill,
single and ragged; GQA paged decode with bf16 and fp8 KV; MLA absorbed decode, d_c 512 + d_h^R 64, 16
heads, in a job of its own) and a background process compiles them
with half the cores (MAX_JOBS) while the other backends are measured; its compile times go into
tables.md. Every job runs in its own process with a deadline: one crash or overrun loses that
job's rows only, and groups not started in time are listed as skipped.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

TOKENS = 32768  # fwd/fwd_bwd: batch * seq constant, as in the FA3 README's benchmarks
KV_TOKENS = 262144  # decode: batch * KV length constant (B64 at 4k, B2 at 128k): equal KV bytes per column
SEQS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
DECODE_KV = [4096, 8192, 16384, 32768, 65536, 131072]
HEADS_FWD, HEADS_DECODE = 16, 32  # fwd: 16 x 128 = a 2048-wide model; decode: Llama-3-8B-like GQA 32/8
HEADS_MLA = 16  # DeepSeek-V2's 128 heads over 8 GPUs, as in the hbm stage's mla group
MLA_KV = [4096, 16384, 65536]
TIMING = dict(warmup_ms=150, rep_ms=100)  # warm-up long enough for the power-limited clock to settle


def _fwd(mode, seqs, *, dtype="bf16", head_dim=128, layout="mha", causal=(False, True)):
    return [dict(mode=mode, layout=layout, batch=TOKENS // s, heads_q=HEADS_FWD, gqa_group=4, head_dim=head_dim,
                 seq=s, causal=list(causal), dtype=dtype) for s in seqs]


def _decode(kvs, *, dtype="bf16", layout="gqa", page_size=0, heads_q=HEADS_DECODE):
    """Decode grids; layout mla takes its dims from the grid defaults (d_c 512 + d_h^R 64), not head_dim."""
    return [dict(mode="decode", layout=layout, batch=KV_TOKENS // kv, heads_q=heads_q, gqa_group=4, head_dim=128,
                 seq=kv, dtype=dtype, page_size=page_size) for kv in kvs]


# job -> (backends, [(group, grids)]), groups in order of priority
JOBS = {
    "core": (["sdpa-cudnn", "sdpa-flash", "fa4"], [
        ("fwd", _fwd("fwd", SEQS)),
        ("decode", _decode(DECODE_KV)),
        ("fwd_bwd", _fwd("fwd_bwd", SEQS)),
        ("fwd-fp16", _fwd("fwd", [1024, 4096, 16384], dtype="fp16")),
        ("fwd-d64", _fwd("fwd", [1024, 4096, 16384], head_dim=64)),
        ("fwd-gqa", _fwd("fwd", [1024, 4096, 16384], layout="gqa")),
        ("fwd-mqa", _fwd("fwd", [1024, 4096, 16384], layout="mqa")),
        ("decode-layouts", _decode([8192, 32768], layout="mha") + _decode([8192, 32768], layout="mqa")
         + _decode([8192, 32768], dtype="fp16")),
    ]),
    # fa2 and fa3 have no wheels for this host: one case per mode records their rows and reasons
    "absent": (["fa2", "fa3", "fa3-fp8"], [
        ("fwd", _fwd("fwd", [4096])), ("fwd_bwd", _fwd("fwd_bwd", [4096], causal=(False,))),
        ("decode", _decode([8192])),
    ]),
    "flashinfer": (["flashinfer", "flashinfer-fp8kv"], [
        ("decode", _decode(DECODE_KV, page_size=16)),
        ("fwd", _fwd("fwd", SEQS)),
    ]),
    # MLA absorbed decode on FlashInfer's MLA kernel; the other backends here take no 576-wide query (the hbm
    # stage's mla group has sdpa-math, eager and flex on it)
    "flashinfer-mla": (["flashinfer-mla"], [
        ("decode-mla", _decode(MLA_KV, layout="mla", page_size=16, heads_q=HEADS_MLA)),
    ]),
}
GROUP_MIN_S = 20  # a group is started only with this much of the job's time left


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_job(name: str, part: Path, ceilings_path: str, deadline: float) -> None:
    """One job in this process: its groups in order until the deadline, rows written after each group."""
    from attnbench.bench.ceilings import Ceilings
    from attnbench.workloads.grid import expand_grid
    from attnbench.bench.microbench import RunOptions, run_group
    from attnbench.bench.results import to_frame, write_atomic

    backends, groups = JOBS[name]
    ceilings = Ceilings.load(ceilings_path)
    rows = []
    for group, grids in groups:
        if time.time() > deadline - GROUP_MIN_S:
            _log(f"[{name}] skipped group {group}: out of time")
            continue
        cases = [c for g in grids for c in expand_grid(g, f"{name}.{group}")]
        options = RunOptions(sweep="h200-backends", group=group, device="cuda", ceilings=ceilings, **TIMING)
        rows += run_group(cases, backends, options)
        write_atomic(to_frame(rows), part)


def prewarm_flashinfer(report: Path) -> None:
    """Compile FlashInfer's variants of the flashinfer job on tiny inputs; write each one's wall time."""
    import torch

    from attnbench.case import Case
    from attnbench.bench.inputs import make_tensors
    from attnbench.kernels import get_backend, safe_available

    times = {}
    variants = {
        "prefill single (bf16, D128)": ("flashinfer", dict(mode="fwd", batch=1, seq_q=128, seq_kv=128)),
        "prefill ragged batch (bf16, D128)": ("flashinfer", dict(mode="fwd", batch=2, seq_q=128, seq_kv=128)),
        "decode paged (bf16 KV, GQA 4)": ("flashinfer", dict(mode="decode", batch=2, seq_q=1, seq_kv=128)),
        "decode paged (fp8 KV, GQA 4)": ("flashinfer-fp8kv", dict(mode="decode", batch=2, seq_q=1, seq_kv=128)),
        "decode MLA (bf16, d_c 512 + d_h^R 64)": ("flashinfer-mla", dict(
            mode="decode", layout="mla", batch=2, heads_q=HEADS_MLA, heads_kv=1, head_dim_qk=576, head_dim_v=512,
            seq_q=1, seq_kv=128)),
    }
    for label, (name, kw) in variants.items():
        backend = get_backend(name)
        ok, reason = safe_available(backend)
        if not ok:
            times[label] = f"unavailable: {reason}"
            continue
        heads_q = HEADS_DECODE if kw["mode"] == "decode" else HEADS_FWD
        case = Case(**{**dict(layout="gqa", heads_q=heads_q, heads_kv=heads_q // 4, head_dim_qk=128, head_dim_v=128,
                              causal=False, dtype="bf16"), **kw})
        start = time.perf_counter()
        try:
            backend.build(case, make_tensors(case, "cuda", seed=0))
            torch.cuda.synchronize()
            times[label] = round(time.perf_counter() - start, 1)
        except Exception as err:
            times[label] = f"failed: {type(err).__name__}: {str(err)[:200]}"
        report.write_text(json.dumps(times, indent=1))


# --- tables ---------------------------------------------------------------------------------

def _seq_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _cell(row, value: str) -> str:
    return value if row["status"] == "ok" else row["status"]


def fa3_style_table(df: pd.DataFrame, *, mode: str, causal: bool, dtype: str, head_dim: int, layout: str) -> str:
    """Markdown: backends down, sequence lengths across, TFLOP/s (status where not ok); '' if no rows."""
    sel = df[(df["mode"] == mode) & (df["causal"] == causal) & (df["dtype"] == dtype)
             & (df["head_dim_qk"] == head_dim) & (df["layout"] == layout)]
    if sel.empty:
        return ""
    seqs = sorted(sel["seq_kv"].unique())
    title = (f"{mode}, {'causal' if causal else 'non-causal'}, {layout.upper()}, head dim {head_dim}, {dtype}, "
             f"{HEADS_FWD} query heads, batch x seq = {TOKENS // 1024}k tokens: TFLOP/s")
    lines = [f"**{title}**", "", "| backend | " + " | ".join(_seq_label(s) for s in seqs) + " |",
             "|---|" + "---:|" * len(seqs)]
    for backend, rows in sel.groupby("backend", sort=False):
        by_seq = {r["seq_kv"]: _cell(r, f"{r['tflops']:.0f}") for _, r in rows.iterrows()}
        lines.append(f"| {backend} | " + " | ".join(by_seq.get(s, "") for s in seqs) + " |")
    return "\n".join(lines)


def decode_table(df: pd.DataFrame, *, layout: str, dtype: str) -> str:
    """Markdown: backends (and page size) down, KV length across, bytes / time over the measured copy bandwidth."""
    sel = df[(df["mode"] == "decode") & (df["layout"] == layout) & (df["dtype"] == dtype)]
    if sel.empty:
        return ""
    kvs = sorted(sel["seq_kv"].unique())
    r0 = sel.iloc[0]
    title = (f"decode, {layout.upper()} {r0['heads_q']}/{r0['heads_kv']} heads, head dim {r0['head_dim_qk']}, {dtype}, "
             f"batch x KV = {KV_TOKENS // 1024}k tokens: achieved bytes/s over measured copy bandwidth "
             f"({r0['peak_bytes_per_s'] / 1e12:.2f} TB/s); fp8 KV counted at 1 byte")
    lines = [f"**{title}**", "", "| backend | " + " | ".join(_seq_label(s) for s in kvs) + " |",
             "|---|" + "---:|" * len(kvs)]
    for (backend, page), rows in sel.groupby(["backend", "page_size"], sort=False):
        label = backend + (f" (page {page})" if page else "")
        by_kv = {r["seq_kv"]: _cell(r, f"{r['bytes_model'] / (r['ms_median'] * 1e-3) / r['peak_bytes_per_s']:.2f}")
                 for _, r in rows.iterrows()}
        lines.append(f"| {label} | " + " | ".join(by_kv.get(s, "") for s in kvs) + " |")
    return "\n".join(lines)


def _markdown(frame: pd.DataFrame, fmt: str) -> str:
    lines = ["| " + " | ".join([frame.index.name or ""] + list(frame.columns)) + " |",
             "|---|" + "---:|" * len(frame.columns)]
    lines += [f"| {i} | " + " | ".join(fmt.format(v) for v in row) + " |" for i, row in frame.iterrows()]
    return "\n".join(lines)


def render(df: pd.DataFrame, jit: dict) -> str:
    parts = ["# Attention backends on " + (df["device_name"].dropna().iloc[0] if df["device_name"].notna().any() else "?"), ""]
    for mode in ("fwd", "fwd_bwd"):
        for causal in (False, True):
            parts += [fa3_style_table(df, mode=mode, causal=causal, dtype="bf16", head_dim=128, layout="mha"), ""]
    for dtype, hd, layout in (("fp16", 128, "mha"), ("bf16", 64, "mha"), ("bf16", 128, "gqa"), ("bf16", 128, "mqa")):
        for causal in (False, True):
            parts += [fa3_style_table(df, mode="fwd", causal=causal, dtype=dtype, head_dim=hd, layout=layout), ""]
    for layout, dtype in (("gqa", "bf16"), ("gqa", "fp16"), ("mha", "bf16"), ("mqa", "bf16"), ("mla", "bf16")):
        parts += [decode_table(df, layout=layout, dtype=dtype), ""]
    fp8 = df[(df["compute_dtype"] == "fp8") & (df["status"] == "ok")]
    if not fp8.empty:
        parts += ["**fp8 error against the fp64 reference (rel. Frobenius), per backend**", "",
                  _markdown(fp8.groupby("backend")["rel_err"].agg(["min", "median", "max"]), "{:.4f}"), ""]
    ok = df[df["status"] == "ok"]
    if not ok.empty:
        parts += ["**median setup_s (build + first call: layout, planning, JIT/compile) per backend**", "",
                  _markdown(ok.groupby("backend")["setup_s"].agg(["median", "max"]), "{:.2f}"), ""]
    if jit:
        parts += ["**FlashInfer JIT compile, wall seconds (background process, half the cores)**", ""]
        parts += [f"- {k}: {v}" for k, v in jit.items()] + [""]
    other = df[~df["status"].isin(["ok"])].drop_duplicates(["backend", "status", "reason"])
    if not other.empty:
        parts += ["**rows that did not run**", "", "| backend | status | reason |", "|---|---|---|"]
        parts += [f"| {r['backend']} | {r['status']} | {str(r['reason'])[:160].replace('|', '/')} |"
                  for _, r in other.iterrows()] + [""]
    return "\n".join(p for p in parts if p is not None)


def main() -> int:
    out = Path(os.environ.get("OUT", "results/h200-backends"))
    budget = float(os.environ.get("BUDGET_S", "290"))
    start = time.time()
    deadline = start + budget
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("WORK", "results/h200-backends-parts"))
    work.mkdir(parents=True, exist_ok=True)
    for stale in glob.glob(str(work / "*")):
        os.remove(stale)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    me = [sys.executable, __file__]

    jit_report = work / "flashinfer-jit.json"
    cores = os.cpu_count() or 2
    prewarm = subprocess.Popen(me + ["--prewarm", str(jit_report)], env={**env, "MAX_JOBS": str(max(1, cores // 2))},
                               stdout=sys.stderr, stderr=sys.stderr)

    from attnbench.bench.ceilings import measure_ceilings
    ceilings = measure_ceilings("cuda")
    ceilings.save(out / "ceilings.json")
    import torch
    torch.cuda.empty_cache()  # the children need the memory this process's measurement buffers cached
    _log(f"ceilings: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 {ceilings.matmul_flops_per_s.get('bf16', 0) / 1e12:.0f} TFLOP/s")

    for job in ("core", "absent", "flashinfer-mla", "flashinfer"):
        if job.startswith("flashinfer"):  # FlashInfer's timing must not share the host with its compiler
            try:
                prewarm.wait(timeout=max(1.0, deadline - time.time() - 60))
            except subprocess.TimeoutExpired:
                _log("flashinfer prewarm still compiling; the flashinfer job compiles what is left itself")
        left = deadline - time.time()
        if left < GROUP_MIN_S:
            _log(f"skipped job {job}: out of time")
            continue
        try:
            subprocess.run(me + ["--job", job, "--part", str(work / f"{job}.parquet"), "--ceilings",
                                 str(out / "ceilings.json"), "--deadline", str(deadline)],
                           env=env, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            _log(f"job {job} killed at the deadline; its finished groups are kept")
    if prewarm.poll() is None:
        prewarm.kill()

    parts = [pd.read_parquet(p) for p in sorted(glob.glob(str(work / "*.parquet")))]
    if not parts:
        _log("no rows were measured")
        return 1
    df = pd.concat(parts, ignore_index=True)
    df.to_parquet(out / "backends.parquet", index=False)
    jit = json.loads(jit_report.read_text()) if jit_report.exists() else {}
    text = render(df, jit)
    (out / "tables.md").write_text(text + "\n")
    print(df.groupby(["backend", "status"]).size().to_string())
    print(f"\n{len(df)} rows in {time.time() - start:.0f} s\n")
    print(text)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", choices=sorted(JOBS))
    parser.add_argument("--part")
    parser.add_argument("--ceilings")
    parser.add_argument("--deadline", type=float)
    parser.add_argument("--prewarm", metavar="REPORT")
    args = parser.parse_args()
    if args.prewarm:
        prewarm_flashinfer(Path(args.prewarm))
    elif args.job:
        run_job(args.job, Path(args.part), args.ceilings, args.deadline)
    else:
        sys.exit(main())
