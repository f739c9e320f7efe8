"""``attnbench compare BASE NEW``: two results files or sweep folders, row by row, with the noise in view.

Rows are joined by (case, backend). For each row measured on both sides the ratio NEW / BASE of
the median times gets a 95% interval from the two rows' own intervals
(:func:`attnbench.bench.stats.independent_ratio`) and a verdict:

* ``slower`` / ``faster``: the interval excludes 1 and the ratio is beyond ``1 + threshold``
  (or below ``1 / (1 + threshold)``): a difference that is both real and large enough to matter;
* ``within noise``: otherwise;
* ``no interval``: a side without an interval (old files, backends added as rules); nothing is claimed;
* ``not measured``, ``only in base``, ``only in new``: nothing to compare.

The exit status is 1 when some row is ``slower``, else 0, so a library upgrade that slows a kernel
fails ``snakemake compare`` (a file compared with itself has every ratio 1 and exits 0).

:func:`winners` sets the two sides' winners tables against each other: per case, the winner each
names (or "tie within noise"), and whether they contradict (two different backends named).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from attnbench.bench import stats
from attnbench.bench.results import MEASURED, ResultsError

WORDS = {stats.SLOWER: "slower", stats.FASTER: "faster", stats.WITHIN_NOISE: "within noise"}
COLUMNS = ("case", "backend", "status_base", "status_new", "ms_base", "ms_new", "ratio", "ci_low", "ci_high",
           "method", "verdict", "drift_flag", "case_id")


def load_side(path: str | Path) -> pd.DataFrame:
    """A results file, or a folder: a sweep's ``microbench.parquet``, else every results file in it."""
    from attnbench.report.aggregate import load_results

    path = Path(path)
    if path.is_dir():
        merged = path / "microbench.parquet"
        files = [merged] if merged.is_file() else sorted(path.glob("*.parquet"))
        if not files:
            raise ResultsError(f"{path}: no results here; allowed: a results file, a sweep folder with "
                               "microbench.parquet, or a folder of results files")
        return load_results(files)
    return load_results([path])


def case_text(row) -> str:
    """The case of a row in a few words (its fields as Case.label writes them)."""
    from attnbench.case import Case

    fields = {k: row[k] for k in ("mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v",
                                  "seq_q", "seq_kv", "causal", "dtype", "page_size")}
    try:
        return Case(**{k: (bool(v) if k == "causal" else v if isinstance(v, str) else int(v))
                       for k, v in fields.items()}).label()
    except Exception:  # a row whose fields do not make a case (hand-written files): its id
        return str(row["case_id"])


def compare(base: pd.DataFrame, new: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One line per (case, backend) of either side: times, NEW / BASE with its interval, and the verdict."""
    keys = ["case_id", "backend"]
    joined = base.merge(new, on=keys, how="outer", suffixes=("_base", "_new"), indicator=True)
    out = []
    for record in joined.to_dict("records"):
        sides = {side: {c[: -len(side) - 1]: v for c, v in record.items() if c.endswith("_" + side)}
                 | {"case_id": record["case_id"], "backend": record["backend"]} for side in ("base", "new")}
        present = sides["new"] if record["_merge"] == "right_only" else sides["base"]
        line = {"case": case_text(present), "backend": record["backend"], "case_id": record["case_id"],
                "status_base": sides["base"].get("status"), "status_new": sides["new"].get("status"),
                "ms_base": sides["base"].get("ms_median"), "ms_new": sides["new"].get("ms_median"),
                "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "method": "none",
                "drift_flag": stats.flag(sides["base"].get("drift_flag")) or stats.flag(sides["new"].get("drift_flag"))}
        if record["_merge"] != "both":
            line["verdict"] = "only in base" if record["_merge"] == "left_only" else "only in new"
        elif not (line["status_base"] in MEASURED and line["status_new"] in MEASURED):
            line["verdict"] = "not measured"
        else:
            r = stats.row_ratio(sides["new"], sides["base"])
            line.update(ratio=r.ratio, ci_low=r.low, ci_high=r.high, method=r.method)
            line["verdict"] = WORDS[stats.verdict(r, threshold)] if r.has_interval else "no interval"
        out.append(line)
    return pd.DataFrame(out, columns=list(COLUMNS))


def exit_code(table: pd.DataFrame) -> int:
    return int((table["verdict"] == "slower").any())


def _num(value, digits: int = 4) -> str:
    return f"{value:.{digits}g}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def summary(table: pd.DataFrame, threshold: float) -> str:
    counts = table["verdict"].value_counts()
    return (f"{len(table)} rows: " + ", ".join(f"{n} {v}" for v, n in counts.items())
            + f" (slower or faster: 95% interval excludes 1 and |ratio - 1| beyond {threshold:.0%})")


def to_text(table: pd.DataFrame, threshold: float) -> str:
    """The comparison as a Markdown table (one line per row, drift-flagged rows marked) and a summary line."""
    shown = table.assign(
        ms_base=table["ms_base"].map(_num), ms_new=table["ms_new"].map(_num),
        ratio=[f"{_num(r)} [{_num(lo)}, {_num(hi)}]" for r, lo, hi in zip(table["ratio"], table["ci_low"],
                                                                             table["ci_high"])],
        verdict=[v + (" (drift-flagged job)" if d else "") for v, d in zip(table["verdict"], table["drift_flag"])])
    shown = shown[["case", "backend", "ms_base", "ms_new", "ratio", "method", "verdict"]].rename(
        columns={"ms_base": "base ms", "ms_new": "new ms", "ratio": "new/base [95% CI]"})
    return shown.to_markdown(index=False) + "\n\n" + summary(table, threshold) + "\n"


def winners(base: pd.DataFrame, new: pd.DataFrame, min_margin: float) -> pd.DataFrame:
    """Per case measured on both sides: each side's claimed winner and whether the claims agree.

    ``agree`` is False only when both sides name a winner and the names differ; a winner on one
    side and a tie on the other is no contradiction (the other side could not tell them apart).
    """
    from attnbench.report.tables import TIE, winners_table

    sides = []
    for frame in (base, new):
        table = winners_table(frame, min_margin=min_margin).values
        if "winner" not in table:  # no ok rows: an empty note table
            return pd.DataFrame(columns=["case", "winner_base", "winner_new", "agree"])
        sides.append(table.reset_index()[["case_id", "winner"]])
    joined = sides[0].merge(sides[1], on="case_id", suffixes=("_base", "_new"))
    named = (joined["winner_base"] != TIE) & (joined["winner_new"] != TIE)
    joined["agree"] = ~named | (joined["winner_base"] == joined["winner_new"])
    cases = base.drop_duplicates("case_id").set_index("case_id")
    joined.insert(0, "case", [case_text(cases.loc[c]) for c in joined["case_id"]])
    return joined[["case", "winner_base", "winner_new", "agree"]]


def winners_summary(table: pd.DataFrame) -> str:
    from attnbench.report.tables import TIE

    both = ((table["winner_base"] != TIE) & (table["winner_new"] != TIE)).sum()
    one = ((table["winner_base"] != TIE) ^ (table["winner_new"] != TIE)).sum()
    return (f"winners: {len(table)} cases on both sides; {both} with a winner named on both "
            f"({(~table['agree']).sum()} contradict), {one} named on one side and a tie within noise on the other")
