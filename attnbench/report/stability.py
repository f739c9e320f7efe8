"""The stability stage's tables: do independent processes timing the same group agree within their noise?

Each pass of a group (``results/<sweep>/stability/<group>/<i>.parquet``) is its own ``attnbench
microbench`` process: its own CUDA context, allocator, compile caches and clock history. Two tables:

Tables
* ``stability``: every (case, backend) of pass i > 1 against pass 1 (:func:`attnbench.report.compare.compare`:
  the ratio of the passes' medians with the 95% interval their two intervals give). ``agree``: the
  interval contains 1, i.e. the passes' medians agree within their intervals. The caption gives
  the share that agree (the issue's target for the H200 anchor: at least 90% of rows).
* ``stability_pairs``: the paired ratio of every two backends in each pass
  (:func:`attnbench.bench.stats.pairs`), its interval's relative width (high / low - 1), and
  ``agree``: the passes' intervals overlap. The caption gives the widest interval (the target for
  fa4 against cuDNN on the anchor: at most 2%).

Figure
* ``spread``: each (case, backend)'s ratio of pass i over pass 1 against its time, with its interval.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from attnbench.bench import stats  # noqa: E402
from attnbench.report import compare  # noqa: E402
from attnbench.report.artifacts import Figure, StageOutputs, Table, fmt  # noqa: E402
from attnbench.report.figures import placeholder  # noqa: E402

TABLE_NAMES = ("stability", "stability_pairs")
FIGURE_NAMES = ("spread",)


def row_table(groups: dict[str, dict[str, pd.DataFrame]], threshold: float) -> pd.DataFrame:
    frames = []
    for group, passes in groups.items():
        names = list(passes)
        for name in names[1:]:
            table = compare.compare(passes[names[0]], passes[name], threshold)
            table = table[table["verdict"].isin(["faster", "slower", "within noise", "no interval"])]
            agree = [(lo <= 1 <= hi) if pd.notna(lo) and pd.notna(hi) else pd.NA
                     for lo, hi in zip(table["ci_low"], table["ci_high"])]
            frames.append(table.assign(group=group, passes=f"{name} vs {names[0]}",
                                       agree=pd.array(agree, dtype="boolean")))
    columns = ["group", "passes", "case", "backend", "ms_base", "ms_new", "ratio", "ci_low", "ci_high", "agree",
               "verdict", "drift_flag"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def pair_table(groups: dict[str, dict[str, pd.DataFrame]], min_margin: float) -> pd.DataFrame:
    frames = []
    for group, passes in groups.items():
        for name, rows in passes.items():
            p = stats.pairs(rows, min_margin)
            frames.append(p.assign(group=group, **{"pass": name},
                                   case=[compare.case_text(r) for r in p.to_dict("records")],
                                   ci_width=p["ratio_ci_high"] / p["ratio_ci_low"] - 1))
    if not frames:
        return pd.DataFrame(columns=["group", "case", "backend_a", "backend_b", "pass", "ratio", "ratio_ci_low",
                                     "ratio_ci_high", "ci_width", "verdict", "agree"])
    table = pd.concat(frames, ignore_index=True)
    keys = ["group", "case_id", "backend_a", "backend_b"]
    overlap = table.groupby(keys)[["ratio_ci_low", "ratio_ci_high"]].agg({"ratio_ci_low": "max",
                                                                         "ratio_ci_high": "min"})
    passes = table.groupby(keys)["pass"].nunique()
    agree = (overlap["ratio_ci_low"] <= overlap["ratio_ci_high"]).astype("boolean").where(passes >= 2, pd.NA)
    table = table.join(agree.rename("agree"), on=keys)
    return table[["group", "case", "backend_a", "backend_b", "pass", "ratio", "ratio_ci_low", "ratio_ci_high",
                  "ci_width", "verdict", "agree"]]


def _display(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.map(lambda v: fmt(v) if not isinstance(v, (bool, str)) else str(v)).astype(str)


def spread_figure(rows: pd.DataFrame) -> plt.Figure:
    """Each (case, backend)'s ratio of a later pass over the first against the first pass's time, with its
    95% interval: the passes agree where the bar crosses 1."""
    rows = rows.dropna(subset=["ratio", "ms_base"])
    if rows.empty:
        return placeholder("Later passes over the first", "no (case, backend) measured in two passes")
    fig, ax = plt.subplots(figsize=(7, 4))
    for backend, sub in rows.groupby("backend", sort=True):
        low = (sub["ratio"] - sub["ci_low"]).clip(lower=0).fillna(0)
        high = (sub["ci_high"] - sub["ratio"]).clip(lower=0).fillna(0)
        ax.errorbar(sub["ms_base"], sub["ratio"], yerr=[low, high], fmt="o", ms=4, capsize=2, label=backend)
    ax.axhline(1, color="black", lw=0.8)
    ax.set(xscale="log", xlabel="ms (first pass)", ylabel="median ratio, pass i / pass 1",
           title="Timing across fresh processes: ratio with its 95% interval")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    return fig


def build(groups: dict[str, dict[str, pd.DataFrame]], threshold: float, min_margin: float) -> StageOutputs:
    """``groups``: {group: {pass: rows}}, passes in order (the first is the base of the others)."""
    rows, pairs = row_table(groups, threshold), pair_table(groups, min_margin)
    agreed = rows["agree"].dropna()
    share = f"{agreed.mean():.0%} of {len(agreed)}" if len(agreed) else "none"
    widest = pairs["ci_width"].max() if len(pairs) else float("nan")
    row_caption = (f"Each (case, backend) timed again in its own process, against the first pass: the ratio of "
                   f"the passes' medians with the 95% interval their two intervals give (Altman & Bland 2003); "
                   f"agree = the interval contains 1. Rows that agree: {share}.")
    pair_caption = (f"Paired ratio (time_a / time_b, Student-t 95% interval over the rounds of one process) of "
                    f"every two backends in each pass; ci_width = high / low - 1 (widest: "
                    f"{fmt(widest * 100)}%); agree = the passes' intervals overlap.")
    row_values = rows.set_index(["group", "passes", "case", "backend"])
    pair_values = pairs.set_index(["group", "case", "backend_a", "backend_b", "pass"])
    return StageOutputs([Table("stability", row_caption, row_values, _display(row_values), empty=rows.empty),
                         Table("stability_pairs", pair_caption, pair_values, _display(pair_values), empty=pairs.empty)],
                        [Figure("spread", "Each (case, backend) of a later pass over the first pass against its "
                                "time, with the ratio's 95% interval (the passes agree where it crosses 1)",
                                spread_figure(rows))])
