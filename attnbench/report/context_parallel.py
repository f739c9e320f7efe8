"""Tables and figures of the context-parallel stage, from its merged rows (docs/context-parallel.md).

:func:`build` makes the stage's report outputs from the merged rows (``attnbench tables context_parallel``,
registered in :mod:`attnbench.report.stages`). Tables (:class:`attnbench.report.artifacts.Table`):

  cp_tflops      TFLOP/s per GPU by world size (the N=1 baseline shown beside every sharding)
  cp_efficiency  scaling efficiency, TFLOP/s per GPU over one GPU's, by world size
  cp_phases      communication against computation, exposed communication and per-rank imbalance
  cp_memory      peak memory per rank by sequence length, and the length that would fill a GPU
  cp_numerics    errors against fp64 on the gathered sequence, and over the unsharded kernel's
  cp_status      rows per backend and status, with the reasons

Figures (:data:`FIGURE_NAMES`, :class:`attnbench.report.artifacts.Figure` objects from :func:`build_figures`): ``cp-scaling`` (TFLOP/s per GPU against world size, scaling efficiency against
sequence length) and ``cp-phases`` (computation, communication and exposed communication per rank).
"""
from __future__ import annotations

from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.bench.results import MEASURED  # noqa: E402
from attnbench.parallel.columns import BASELINE_KEYS  # noqa: E402
from attnbench.report.artifacts import Figure, StageOutputs, Table, fmt, note_table  # noqa: E402
from attnbench.report.tables import (CASE_DIMS, FLOP_CONVENTION, _cell_pivot, device_text,  # noqa: E402
                                     status_table)

TABLE_NAMES = ("cp_tflops", "cp_efficiency", "cp_phases", "cp_memory", "cp_numerics", "cp_status")
FIGURE_NAMES = ("cp-scaling", "cp-phases")
FIGURE_CAPTIONS = {
    "cp-scaling": "Context-parallel attention: TFLOP/s per GPU against the number of GPUs at the longest sequence "
                  "every N ran (top) and scaling efficiency, TFLOP/s per GPU over one GPU's, against the sequence "
                  "length (bottom), per mode and mask, dense sequences",
    "cp-phases": "Per call, at the largest N and its longest sequence: the slowest rank's computation, its "
                 "communication and the communication the overlapped call leaves exposed",
}
GIB = 2 ** 30


def _keys(sub: pd.DataFrame, last: tuple[str, ...]) -> list[str]:
    """Case dims that vary, then mode and causal, then ``last`` (whose final key is the backend)."""
    varying = [d for d in CASE_DIMS if d not in ("mode", "causal", "page_size") and sub[d].nunique(dropna=False) > 1]
    return ["mode", "causal", *varying, "packing", *last]


def _caption(what: str, df: pd.DataFrame) -> str:
    return (f"{what}. {FLOP_CONVENTION}; packed documents count only the work inside a document. "
            f"Device: {device_text(df)}.")


def _with_baseline_per_sharding(df: pd.DataFrame) -> pd.DataFrame:
    """N=1 rows repeated under each sharding the larger world sizes ran the same problem with (with one
    rank every sharding is one layout)."""
    keys = list(BASELINE_KEYS)
    larger = df[df["world_size"] > 1]
    one = df[df["world_size"] == 1]
    pairs = larger[keys + ["sharding"]].drop_duplicates()
    repeated = one.drop(columns="sharding").merge(pairs, on=keys, how="inner")
    alone = one.merge(pairs[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    alone = alone[alone["_merge"] == "left_only"].drop(columns="_merge")  # no larger N ran it: keep as is
    return pd.concat([larger, repeated, alone], ignore_index=True)


def tflops_table(df: pd.DataFrame) -> Table:
    caption = _caption("Context-parallel attention: TFLOP/s per GPU (total FLOPs / the slowest rank's median "
                       "time / N) by world size N; the N=1 row is one GPU on the whole sequence, shown under "
                       "every sharding", df)
    if df.empty:
        return note_table("cp_tflops", caption, "no context-parallel rows")
    sub = _with_baseline_per_sharding(df)
    values, display = _cell_pivot(sub, "tflops_per_gpu", _keys(sub, ("seq_kv", "sharding", "backend")),
                                  "world_size", "N")
    return Table("cp_tflops", caption, values, display)


def efficiency_table(df: pd.DataFrame) -> Table:
    caption = _caption("Scaling efficiency (TFLOP/s per GPU at N over the N=1 rate of the same case and backend; "
                       "1 = perfect strong scaling), in percent", df)
    sub = df[df["world_size"] > 1]
    if sub.empty or sub["scaling_efficiency"].isna().all():
        return note_table("cp_efficiency", caption, "no row with an N=1 baseline")
    values, display = _cell_pivot(sub, "scaling_efficiency", _keys(sub, ("seq_kv", "sharding", "backend")),
                                  "world_size", "N", scale=100)
    return Table("cp_efficiency", caption, values, display)


PHASE_COLUMNS = ("ms_median", "serial_ms", "compute_ms_max", "compute_ms_mean", "comm_ms", "exposed_comm_ms",
                 "comm_compute_ratio", "imbalance", "work_imbalance", "comm_gbps")


def phases_table(df: pd.DataFrame) -> Table:
    caption = _caption("Where a call's time goes, per world size N > 1: the overlapped call (ms_median), the same "
                       "call with every exchange waited for (serial_ms), its per-rank computation (slowest and "
                       "mean) and communication, the communication the overlapped call leaves exposed "
                       "(ms_median - compute_ms_max), comm/compute, the measured per-rank imbalance (max/mean "
                       "compute) beside the block plan's (work_imbalance), and the ring's send rate; CPU rows "
                       "are wall-clock times of gloo processes", df)
    sub = df[(df["world_size"] > 1) & df["status"].isin(MEASURED) & df["compute_ms_max"].notna()]
    if sub.empty:
        return note_table("cp_phases", caption, "no serialised ring rows")
    keys = _keys(sub, ("seq_kv", "world_size", "sharding", "backend"))
    values = sub.set_index(keys)[list(PHASE_COLUMNS)].sort_index()
    return Table("cp_phases", caption, values, values.map(fmt))


def fit_length(rows: pd.DataFrame, memory: float) -> float:
    """Sequence length at which the peak per-rank memory reaches ``memory``: the line through the two
    longest measured lengths (memory of a flash-style ring grows linearly in S), or through 0 with one."""
    rows = rows.dropna(subset=["peak_mem_bytes"]).sort_values("seq_kv")
    if rows.empty or not memory > 0:
        return float("nan")
    s1, m1 = rows["seq_kv"].iloc[-1], rows["peak_mem_bytes"].iloc[-1]
    if len(rows) == 1 or rows["seq_kv"].iloc[-2] == s1:
        return float(s1 * memory / m1)
    s0, m0 = rows["seq_kv"].iloc[-2], rows["peak_mem_bytes"].iloc[-2]
    slope = (m1 - m0) / (s1 - s0)
    return float(s1 + (memory - m1) / slope) if slope > 0 else float("nan")


def memory_table(df: pd.DataFrame) -> Table:
    caption = _caption("Peak allocated memory per rank (GiB, the largest rank's) by sequence length, and the "
                       "length at which it would fill the GPU (extrapolated along the line through the two "
                       "longest measured lengths, not measured; an oom cell is a measured failure)", df)
    sub = df[df["peak_mem_bytes"].notna() | (df["status"] == "oom")]
    if sub.empty:
        return note_table("cp_memory", caption, "no rows with a measured peak memory (CUDA only)")
    keys = _keys(sub, ("world_size", "sharding", "backend"))
    values, display = _cell_pivot(sub, "peak_mem_bytes", keys, "seq_kv", "S", scale=1 / GIB)
    fits = {}
    for key, rows in sub[sub["status"].isin(MEASURED)].groupby(keys, sort=False, observed=True):
        fits[key] = fit_length(rows, rows["device_mem_bytes"].max())
    values["fits_up_to_S"] = [fits.get(k, float("nan")) for k in values.index]
    display["fits_up_to_S"] = [fmt(v) for v in values["fits_up_to_S"]]
    return Table("cp_memory", caption, values, display)


NUMERICS_COLUMNS = ("rel_err", "max_abs_err", "rel_err_dq", "rel_err_dk", "rel_err_dv", "rel_err_unsharded",
                    "err_ratio_vs_unsharded")


def numerics_table(df: pd.DataFrame) -> Table:
    caption = _caption("Errors against fp64 attention on the gathered sequence (per document when packed), and "
                       "the worst of them over the same kernel's on one device (err_ratio_vs_unsharded: what "
                       "sharding and the log-sum-exp merge add)", df)
    sub = df[df["numerics_status"] == "checked"]
    if sub.empty:
        return note_table("cp_numerics", caption, "no rows with numerics")
    keys = _keys(sub, ("seq_kv", "world_size", "sharding", "backend"))
    values = sub.set_index(keys)[list(NUMERICS_COLUMNS)].sort_index()
    return Table("cp_numerics", caption, values, values.map(fmt))


def build_tables(df: pd.DataFrame) -> list[Table]:
    status = replace(status_table(df), name="cp_status") if len(df) else note_table(
        "cp_status", "Rows per backend and status, with the reasons", "no context-parallel rows")
    return [tflops_table(df), efficiency_table(df), phases_table(df), memory_table(df), numerics_table(df), status]


def _no_data(ax, what: str, df: pd.DataFrame) -> None:
    reasons = df["reason"].dropna().astype(str) if "reason" in df else pd.Series(dtype=str)
    reasons = reasons[reasons != ""]
    why = reasons.value_counts().index[0][:110] if len(reasons) else "no rows"
    ax.text(0.5, 0.5, f"no {what}\n{why}", ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=9)
    ax.set_axis_off()


def _series(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with a line label: backend / sharding, and the layout where it varies."""
    ok = df[df["status"].isin(MEASURED)].copy()
    ok["series"] = ok["backend"] + " / " + ok["sharding"]
    if ok["layout"].nunique() > 1:
        ok["series"] += " " + ok["layout"]
    return ok


def _panels(ok: pd.DataFrame) -> list[tuple[str, bool]]:
    dense = ok[ok["packing"] == "dense"]
    return sorted(set(zip(dense["mode"], dense["causal"].astype(bool))))


def scaling_figure(df: pd.DataFrame) -> plt.Figure:
    """Per (mode, mask) of the dense rows: TFLOP/s per GPU against N at the longest sequence every N ran
    (top), and scaling efficiency against S per N (bottom)."""
    ok = _series(_with_baseline_per_sharding(df))
    panels = _panels(ok)
    cols = max(1, len(panels))
    fig, axes = plt.subplots(2, cols, figsize=(6 * cols, 8), squeeze=False)
    if not panels:
        _no_data(axes[0, 0], "dense measured rows", df)
        _no_data(axes[1, 0], "dense rows with an N=1 baseline", df)
    for col, (mode, causal) in enumerate(panels):
        rows = ok[(ok["mode"] == mode) & (ok["causal"] == causal) & (ok["packing"] == "dense")]
        name = f"{mode}, {'causal' if causal else 'no mask'}"
        per_n = rows.groupby("seq_kv")["world_size"].nunique()
        longest = per_n[per_n == per_n.max()].index.max()
        at = rows[rows["seq_kv"] == longest]
        ax = axes[0, col]
        sns.lineplot(data=at, x="world_size", y="tflops_per_gpu", hue="series", marker="o", errorbar=None, ax=ax)
        sizes = sorted(at["world_size"].unique())
        ax.set(xscale="log", xlabel="GPUs (world size N)", ylabel="TFLOP/s per GPU", title=f"{name}, S={longest}")
        ax.set_xticks(sizes, labels=[str(n) for n in sizes])
        ax.legend(fontsize=7)
        eff = rows[(rows["world_size"] > 1) & rows["scaling_efficiency"].notna()]
        ax = axes[1, col]
        if len(eff):
            eff = eff.assign(label=eff["series"] + " N=" + eff["world_size"].astype(str))
            sns.lineplot(data=eff, x="seq_kv", y="scaling_efficiency", hue="label", marker="o", errorbar=None, ax=ax)
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set(xscale="log", xlabel="sequence length S (tokens)", ylabel="scaling efficiency",
                   title=f"{name}: TFLOP/s per GPU over one GPU's")
            ax.legend(fontsize=6)
        else:
            _no_data(ax, f"{name} rows with an N=1 baseline", df)
    fig.tight_layout()
    return fig


def phases_figure(df: pd.DataFrame) -> plt.Figure:
    """Bars per (backend, sharding) at the largest N and its longest sequence (dense rows where there are any):
    computation, communication and exposed communication."""
    ok = _series(df)
    ok = ok[ok["compute_ms_max"].notna() & (ok["world_size"] > 1)]
    if (ok["packing"] == "dense").any():
        ok = ok[ok["packing"] == "dense"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if ok.empty:
        _no_data(ax, "serialised ring rows", df)
    else:
        n = ok["world_size"].max()
        at = ok[ok["world_size"] == n]
        at = at[at["seq_kv"] == at["seq_kv"].max()]
        at = at.assign(label=at["series"] + " " + at["mode"] + np.where(at["causal"].astype(bool), " causal", ""))
        long = at.melt(id_vars=["label"], value_vars=["compute_ms_max", "comm_ms", "exposed_comm_ms"],
                       var_name="phase", value_name="ms")
        sns.barplot(data=long, x="label", y="ms", hue="phase", errorbar=None, ax=ax)
        ax.tick_params(axis="x", rotation=30)
        ax.set(xlabel="", ylabel="ms per call (slowest rank)",
               title=f"N={n}, S={at['seq_kv'].max()}: computation, communication (serialised) and exposed "
                     "communication")
    fig.tight_layout()
    return fig


def build_figures(df: pd.DataFrame) -> list[Figure]:
    """Every figure of :data:`FIGURE_NAMES` with its caption; each renders with or without rows."""
    drawn = {"cp-scaling": scaling_figure(df), "cp-phases": phases_figure(df)}
    return [Figure(name, FIGURE_CAPTIONS[name], drawn[name]) for name in FIGURE_NAMES]


def build(df: pd.DataFrame) -> StageOutputs:
    """The stage's report outputs from its merged rows (:func:`merge`): every table, then every figure."""
    return StageOutputs(build_tables(df), build_figures(df))
