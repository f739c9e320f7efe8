"""The stability stage's tables: do independent processes timing the same group agree within their noise?

Each pass of a group (``results/<sweep>/stability/<group>/<i>.parquet``) is its own ``attnbench
microbench`` process: its own CUDA context, allocator, compile caches and clock history. Two tables:

* ``stability``: every (case, backend) of pass i > 1 against pass 1 (:func:`attnbench.report.compare.compare`:
  the ratio of the passes' medians with the 95% interval their two intervals give). ``agree``: the
  interval contains 1, i.e. the passes' medians agree within their intervals. The caption gives
  the share that agree (the issue's target for the H200 anchor: at least 90% of rows).
* ``stability_pairs``: the paired ratio of every two backends in each pass
  (:func:`attnbench.bench.stats.pairs`), its interval's relative width (high / low - 1), and
  ``agree``: the passes' intervals overlap. The caption gives the widest interval (the target for
  fa4 against cuDNN on the anchor: at most 2%).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.bench import stats
from attnbench.bench.results import read_results, write_atomic
from attnbench.report import compare
from attnbench.report.tables import Table, fmt

TABLE_NAMES = ("stability", "stability_pairs")


def passes_by_group(paths: list[str | Path]) -> dict[str, dict[str, pd.DataFrame]]:
    """{group: {pass: rows}} from files named ``.../<group>/<pass>.parquet``, passes in numeric order."""
    found: dict[str, dict[str, pd.DataFrame]] = {}
    for path in sorted(map(Path, paths), key=lambda p: (p.parent.name, int(p.stem) if p.stem.isdigit() else p.stem)):
        found.setdefault(path.parent.name, {})[path.stem] = read_results(path)
    return found


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


def build(groups: dict[str, dict[str, pd.DataFrame]], threshold: float, min_margin: float) -> list[Table]:
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
    return [Table("stability", row_caption, rows.set_index(["group", "passes", "case", "backend"]),
                  _display(rows.set_index(["group", "passes", "case", "backend"]))),
            Table("stability_pairs", pair_caption, pairs.set_index(["group", "case", "backend_a", "backend_b", "pass"]),
                  _display(pairs.set_index(["group", "case", "backend_a", "backend_b", "pass"])))]


def write(paths: list[str | Path], folder: str | Path, threshold: float, min_margin: float) -> dict:
    """Both tables in every format, their rows as parquet, and ``index.json`` (name -> caption and files)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = {}
    for table in build(passes_by_group(paths), threshold, min_margin):
        files = table.write(folder)
        write_atomic(table.values.reset_index(), folder / f"{table.name}.parquet")
        index[table.name] = {"caption": table.caption, "files": [p.name for p in files] + [f"{table.name}.parquet"]}
    (folder / "index.json").write_text(json.dumps(index, indent=2))
    return index


