"""Timing fidelity across processes: the stability stage times named microbench groups again in
``stability.processes`` fresh processes (own CUDA context, allocator, plans and clock history).

Tables
  passes     per (case, backend): each process's median and CV, and the spread of the medians,
             max / min - 1 over the processes
  summary    per backend: pairs compared, the largest CV and spread, and how many pairs stay within
             the limits (CV under 2%, spread under 3%: the harness's claim for cases over 100 us)
Figure
  spread     each pair's spread against its median time
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.report.artifacts import Figure, StageOutputs, Table, fmt, frame_table, note_table  # noqa: E402
from attnbench.report.figures import placeholder  # noqa: E402
from attnbench.report.tables import device_text  # noqa: E402

CV_LIMIT, SPREAD_LIMIT, MIN_MS = 0.02, 0.03, 0.1  # the limits hold for calls over MIN_MS
KEY = ["group", "case_id", "backend", "mode", "layout", "batch", "heads_q", "head_dim_qk", "seq_kv", "causal", "dtype"]


def compare(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per (case, backend) measured in every process: medians, CVs, spread; column ``process``."""
    ok = rows[rows["status"] == "ok"].dropna(subset=["ms_median"])
    processes = sorted(ok["process"].unique())
    wide = ok.pivot_table(index=KEY, columns="process", values=["ms_median", "cv"], aggfunc="first", observed=True)
    wide = wide.dropna()  # a pair is compared only where every process measured it
    medians = wide["ms_median"]
    out = pd.DataFrame(index=wide.index)
    for p in processes:
        out[f"ms_median_{p}"] = medians[p]
    for p in processes:
        out[f"cv_{p}"] = wide["cv"][p]
    out["spread"] = medians.max(axis=1) / medians.min(axis=1) - 1
    out["max_cv"] = wide["cv"].max(axis=1)
    return out


def summary(pairs: pd.DataFrame) -> pd.DataFrame:
    long = pairs[pairs.filter(like="ms_median_").min(axis=1) > MIN_MS]
    by = long.groupby(level="backend", observed=True)
    return pd.DataFrame({"pairs_over_min_ms": by.size(), "max_cv": by["max_cv"].max(), "max_spread": by["spread"].max(),
                         "within_limits": by.apply(lambda g: int(((g["max_cv"] < CV_LIMIT)
                                                                  & (g["spread"] < SPREAD_LIMIT)).sum()))})


def spread_figure(pairs: pd.DataFrame) -> plt.Figure:
    if pairs.empty:
        return placeholder("Median spread across processes", "no (case, backend) measured in every process")
    data = pairs.reset_index().assign(ms=pairs.filter(like="ms_median_").median(axis=1).to_numpy())
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.scatterplot(data=data, x="ms", y="spread", hue="backend", style="mode", ax=ax)
    ax.axhline(SPREAD_LIMIT, color="red", lw=1, ls="--", label=f"{SPREAD_LIMIT:.0%}")
    ax.axvline(MIN_MS, color="black", lw=0.8, ls=":")
    ax.set(xscale="log", xlabel="median time (ms)", ylabel="max / min median - 1",
           title="Median spread across fresh processes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def build(rows: pd.DataFrame) -> StageOutputs:
    """The stability stage's tables and figure from every process's rows (column ``process``)."""
    n = rows["process"].nunique() if len(rows) else 0
    where = f"{n} fresh processes; {device_text(rows)}" if len(rows) else "no rows"
    caption = (f"Each (case, backend) timed again in {where}: each process's median time (ms) and coefficient "
               "of variation, and the spread of the medians (max / min - 1).")
    pairs = compare(rows) if len(rows) else pd.DataFrame()
    totals = summary(pairs) if len(pairs) else pd.DataFrame()
    summary_caption = (f"Per backend, over pairs slower than {MIN_MS} ms: how many, the largest CV and spread, and how "
                       f"many stay within CV < {CV_LIMIT:.0%} and spread < {SPREAD_LIMIT:.0%}.")
    tables = [Table("passes", caption, pairs, pairs.map(fmt)) if len(pairs) else
              note_table("passes", caption, "no (case, backend) measured in every process"),
              frame_table("summary", summary_caption, totals) if len(totals) else
              note_table("summary", summary_caption, f"no pair slower than {MIN_MS} ms measured in every process")]
    figure = Figure("spread", "The spread of each (case, backend)'s medians across processes against its median "
                    f"time; dashed: {SPREAD_LIMIT:.0%}, dotted: {MIN_MS} ms.", spread_figure(pairs))
    return StageOutputs(tables, [figure])
