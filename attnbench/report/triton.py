"""Our Triton kernels against the best of the other backends, and the compiler's report on them.

* :func:`versus_best_table` (group ``triton`` of the microbench stage): per case with ``triton`` or
  ``triton-fp8`` rows, their TFLOP/s (status where they did not run) beside the fastest other
  backend that passed numerics, and the ratio; from the microbench rows.
* :func:`compiler_table` (the triton stage): registers, spills, shared memory, warps and stages per
  compiled kernel, from ``results/<sweep>/triton/compiler.parquet``
  (:func:`attnbench.kernels.triton.sass.compiler_report` rows).
"""
from __future__ import annotations

import pandas as pd

from attnbench.bench.results import MEASURED
from attnbench.report.artifacts import Table, fmt, frame_table, note_table
from attnbench.report.tables import CASE_DIMS, FLOP_CONVENTION, device_text

GROUP = "triton"
OURS = ("triton", "triton-fp8")
COMPILER_COLUMNS = ("n_regs", "n_spills", "shared_bytes", "num_warps", "num_stages")
# identity of a compiler row, where present: what was compiled, for which case
COMPILER_KEYS = ("backend", "part", "mode", "dtype", "head_dim", "seq", "causal", "kernel")


def has_triton_rows(df: pd.DataFrame) -> bool:
    return bool(df["backend"].isin(OURS).any())


def versus_best_table(df: pd.DataFrame) -> Table:
    caption = ("Our Triton FlashAttention (triton; triton-fp8: e4m3 Q, K, V) against the fastest other backend "
               "of each case that passed numerics: TFLOP/s (median time; the status where a kernel did not run) "
               f"and the ratio ours / best. {FLOP_CONVENTION}. Device: {device_text(df)}.")
    ours = df[df["backend"].isin(OURS)]
    if ours.empty:
        return note_table("triton_vs_best", caption, "no triton rows in this sweep", GROUP)
    others = df[~df["backend"].isin(OURS) & (df["status"] == "ok")].dropna(subset=["tflops"])
    best = others.sort_values("tflops", ascending=False).drop_duplicates("case_id").set_index("case_id")
    dims = [d for d in CASE_DIMS if ours[d].nunique(dropna=False) > 1 or d == "mode"]
    rows = []
    for case_id, group in ours.groupby("case_id", sort=False):
        first = group.iloc[0]
        row = {**{d: first[d] for d in dims}, "seq_q": first["seq_q"], "seq_kv": first["seq_kv"]}
        top = best.loc[case_id] if case_id in best.index else None
        row["best_other"] = top["backend"] if top is not None else "none ok"
        row["best_other_tflops"] = top["tflops"] if top is not None else float("nan")
        for backend in OURS:
            mine = group[group["backend"] == backend]
            if mine.empty:
                continue
            mine = mine.iloc[0]
            measured = mine["status"] in MEASURED and pd.notna(mine["tflops"])
            row[backend] = mine["tflops"] if measured else mine["status"]
            row[f"{backend} / best"] = (mine["tflops"] / row["best_other_tflops"]
                                        if measured and top is not None else float("nan"))
        rows.append(row)
    values = pd.DataFrame(rows).set_index([*dims, "seq_q", "seq_kv"]).sort_index()
    return Table("triton_vs_best", caption, values, values.map(fmt), group=GROUP)


def compiler_table(compiler: pd.DataFrame) -> Table:
    caption = ("The compiler's report on our Triton kernels (triton's CompiledKernel metadata): registers per "
               "thread, spilled registers, shared memory in bytes, warps and software-pipeline stages per compiled "
               "kernel; spills above 0 mean local-memory traffic inside the kernel's loop.")
    if compiler.empty:
        return note_table("compiler", caption, "no compiled kernels were reported")
    keys = [k for k in COMPILER_KEYS if k in compiler]
    columns = [c for c in COMPILER_COLUMNS if c in compiler]
    return frame_table("compiler", caption, compiler[keys + columns].set_index(keys))
