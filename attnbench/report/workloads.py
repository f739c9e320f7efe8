"""The real-workloads section: traces, ragged batches, variants (``docs/workloads.md``).

Part of the microbench stage's outputs (group ``workloads`` in its index), shown by the report's
workloads section. Tables (:class:`attnbench.report.artifacts.Table`: numbers, display cells, a caption)
  workload_batches     per workload and batch kind: batches, sequences, real tokens, KV lengths
  workload_throughput  per workload (trace or distribution) and batch kind (prefill, chunked, decode):
                       each backend's throughput over the real tokens (sum of tokens / sum of batch
                       times, and TFLOP/s over the real FLOPs) and its latency percentiles over batches
  variant_coverage     backend x variant: supported or not (with the row status), TFLOP/s, error ratio, over
                       the groups that hold variants (their ``none`` cases are the same shapes without one)
  padding_waste        per workload: the FLOPs padding to the longest sequence adds, and what it costs
                       measured (the padded SDPA baseline's time over the fastest native ragged backend)
Figure
  workload_latency     batch latency per backend, one panel per workload and batch kind

Every table and figure is built from the joined results frame alone and exists whatever the sweep
holds (a note says what is missing), so the pipeline's outputs always exist.
"""
from __future__ import annotations

import pandas as pd

from attnbench.bench.results import MEASURED
from attnbench.report.artifacts import Figure, Table, fmt, note_table
from attnbench.report.tables import _caption, ragged

GROUP = "workloads"  # a part of the microbench stage's outputs: the report's workloads section shows it
TABLE_NAMES = ("workload_batches", "workload_throughput", "variant_coverage", "padding_waste")
FIGURE_NAMES = ("workload_latency",)
PADDED_BASELINE = "sdpa-padded"
SHAPE = ("layout", "heads_q", "heads_kv", "head_dim_qk", "dtype", "causal", "page_size", "variant")
PERCENTILES = (50, 90, 99)


def batch_kind(df: pd.DataFrame) -> pd.Series:
    """prefill (whole prompts), chunked (chunks against cached prefixes: some query lengths below their KV
    lengths) or decode, per row."""
    chunked = df["seq_lens_q"].fillna("") != df["seq_lens_kv"].fillna("")
    return pd.Series(["decode" if m == "decode" else ("chunked" if c else "prefill")
                      for m, c in zip(df["mode"], chunked)], index=df.index)


def workload_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of ragged batches (a workload's, not a grid's equal lengths), with their batch kind."""
    rows = df[ragged(df) & (df["variant"].fillna("none") == "none")]
    return rows.assign(kind=batch_kind(rows))


def _empty(name: str, caption: str, note: str) -> Table:
    return note_table(name, caption, note, group=GROUP)


def batches_table(df: pd.DataFrame) -> Table:
    caption = ("What the workloads were: batches per workload and kind, the median number of sequences in a "
               "batch, the real query and KV tokens summed over the batches, the longest KV length and the "
               "median of the batches' median KV lengths")
    rows = workload_rows(df).drop_duplicates("case_id")
    if rows.empty:
        return _empty("workload_batches", caption, "no ragged-batch groups in this sweep (a grid's `workload` "
                                                   "key makes them)")
    values = rows.groupby(["workload", "kind"], observed=True).agg(
        batches=("case_id", "size"), sequences_median=("batch", "median"), tokens_q=("tokens_q", "sum"),
        tokens_kv=("tokens_kv", "sum"), longest_kv=("seq_kv", "max"), median_kv=("seq_kv_median", "median"))
    return Table("workload_batches", caption, values, values.map(fmt), group=GROUP)


def _keys(sub: pd.DataFrame) -> list[str]:
    """The shape columns that tell a workload's groups apart here."""
    return [c for c in SHAPE if sub[c].nunique(dropna=False) > 1]


def throughput_table(df: pd.DataFrame) -> Table:
    caption = _caption("Throughput over the real tokens of each workload's batches (no padding counted): "
                       "tokens per second = the batches' query tokens over their summed median times, TFLOP/s "
                       "over the real FLOPs (conventions.workload_flops); batch latency percentiles over the "
                       "batches; kind: prefill (whole prompts under a token budget), chunked (chunks against "
                       "cached prefixes), decode (one token per request)", "", df)
    rows = workload_rows(df)
    if rows.empty:
        return _empty("workload_throughput", caption, "no ragged-batch rows in this sweep")
    keys = ["workload", "kind", *_keys(rows), "backend"]
    out = []
    for key, group in rows.groupby(keys, sort=True, observed=True, dropna=False):
        timed = group[group["status"].isin(MEASURED)].dropna(subset=["ms_median"])
        cell = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        cell["batches"] = len(group)
        cell["timed"] = len(timed)
        if len(timed) == len(group):
            seconds = timed["ms_median"].sum() / 1e3
            cell["tokens_per_s"] = timed["tokens_q"].sum() / seconds
            cell["tflops"] = timed["flops"].sum() / seconds / 1e12
            for p in PERCENTILES:
                cell[f"ms_p{p}"] = timed["ms_median"].quantile(p / 100)
            cell["status"] = "ok" if (timed["status"] == "ok").all() else "numerics_fail"
        else:  # a backend that did not time every batch has no throughput over the workload
            missing = group[~group.index.isin(timed.index)]
            cell["status"] = missing["status"].mode().iloc[0]
        out.append(cell)
    values = pd.DataFrame(out).set_index(keys)
    numbers = ["tokens_per_s", "tflops", *(f"ms_p{p}" for p in PERCENTILES)]
    values = values.reindex(columns=["batches", "timed", *numbers, "status"])
    display = values.copy().astype(object)
    for col in numbers:
        display[col] = [fmt(v) if pd.notna(v) else s for v, s in zip(values[col], values["status"])]
    display["batches"] = values["batches"].map(lambda n: str(int(n)))
    display["timed"] = values["timed"].map(lambda n: str(int(n)))
    return Table("workload_throughput", caption, values, display.drop(columns=["status"]), group=GROUP)


def coverage_table(df: pd.DataFrame) -> Table:
    caption = _caption("Semantic coverage: which backend runs which attention variant natively (a mask or score "
                       "change it applies itself; else the row's status), its median TFLOP/s over the variant's "
                       "cases (FLOPs at the variant's unmasked pairs) and its worst error over eager's in the "
                       "same dtype (the 2x gate)", "", df)
    # the groups that hold variants; their `none` rows are the same shapes without one
    has_variant = df["variant"].fillna("none") != "none"
    rows = df[df["group"].isin(df.loc[has_variant, "group"])]
    if rows.empty:
        return _empty("variant_coverage", caption, "no attention-variant rows in this sweep")
    variants = list(dict.fromkeys(rows["variant"]))
    backends = list(dict.fromkeys(rows["backend"]))
    values, display = {}, {}
    for variant in variants:
        sub = rows[rows["variant"] == variant]
        for backend in backends:
            cell = sub[sub["backend"] == backend]
            timed = cell[cell["status"].isin(MEASURED)]
            supported = bool(len(timed))
            tflops = timed["tflops"].median() if supported else float("nan")
            ratio = timed["err_ratio_vs_eager"].max() if supported else float("nan")
            status = "" if not len(cell) else ("ok" if supported and (timed["status"] == "ok").all()
                                               else cell["status"].mode().iloc[0])
            values[(backend, f"{variant} supported")] = supported
            values[(backend, f"{variant} tflops")] = tflops
            values[(backend, f"{variant} err_ratio")] = ratio
            if not len(cell):
                text = ""
            elif supported:
                text = f"{fmt(tflops)} ({fmt(ratio)}x)" + ("" if status == "ok" else f" {status}")
            else:
                text = status
            display[(backend, variant)] = text
    values = pd.Series(values).unstack()
    values = values.reindex(index=backends, columns=[f"{v} {s}" for v in variants
                                                     for s in ("supported", "tflops", "err_ratio")])
    display = pd.Series(display).unstack().reindex(index=backends, columns=variants)
    values.index.name = display.index.name = "backend"
    return Table("variant_coverage", caption, values, display, group=GROUP)


def padding_table(df: pd.DataFrame) -> Table:
    caption = _caption(f"Padding waste per workload: the share of the padded batch's FLOPs that padding to the "
                       f"longest sequence adds (1 - flops / flops_padded, summed over batches) and what it costs "
                       f"measured: {PADDED_BASELINE}'s time over the fastest native ragged backend's, median over "
                       "batches", "", df)
    rows = workload_rows(df)
    if rows.empty:
        return _empty("padding_waste", caption, "no ragged-batch rows in this sweep")
    keys = ["workload", "kind", *_keys(rows)]
    out = []
    for key, group in rows.groupby(keys, sort=True, observed=True, dropna=False):
        cell = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        batches = group.drop_duplicates("case_id")
        cell["batches"] = len(batches)
        cell["padded_flops_share"] = 1 - batches["flops"].sum() / batches["flops_padded"].sum()
        cell["padded_kv_tokens_share"] = 1 - batches["tokens_kv"].sum() / (batches["batch"] * batches["seq_kv"]).sum()
        timed = group[group["status"] == "ok"].dropna(subset=["ms_median"])
        padded = timed[timed["backend"] == PADDED_BASELINE].set_index("case_id")["ms_median"]
        native = timed[timed["backend"] != PADDED_BASELINE]
        best = native.loc[native.groupby("case_id")["ms_median"].idxmin()] if len(native) else native
        best = best.set_index("case_id")
        both = padded.index.intersection(best.index)
        cell["padded_over_best"] = (padded[both] / best.loc[both, "ms_median"]).median() if len(both) else float("nan")
        cell["best_native"] = best.loc[both, "backend"].mode().iloc[0] if len(both) else ""
        out.append(cell)
    values = pd.DataFrame(out).set_index(keys)
    display = values.copy().astype(object)
    for col in ("padded_flops_share", "padded_kv_tokens_share"):
        display[col] = values[col].map(lambda v: f"{100 * v:.0f}%")
    display["padded_over_best"] = values["padded_over_best"].map(
        lambda v: f"{fmt(v)}x" if pd.notna(v) else f"no timed {PADDED_BASELINE} and native pair")
    display["batches"] = values["batches"].map(lambda n: str(int(n)))
    return Table("padding_waste", caption, values, display, group=GROUP)


BUILDERS = {"workload_batches": batches_table, "workload_throughput": throughput_table, "variant_coverage": coverage_table,
            "padding_waste": padding_table}


def build_tables(df: pd.DataFrame) -> list[Table]:
    return [BUILDERS[name](df) for name in TABLE_NAMES]


def build_figures(df: pd.DataFrame) -> list[Figure]:
    return [Figure("workload_latency", "Batch latency (median time of each batch) per backend, a panel per "
                   "workload and batch kind", latency_figure(df), group=GROUP)]


def latency_figure(df: pd.DataFrame):
    """Batch latency (median time of each batch) per backend, a panel per workload and batch kind."""
    import seaborn as sns

    from attnbench.report.figures import placeholder
    from attnbench.report.tables import device_text

    rows = workload_rows(df)
    rows = rows[rows["status"].isin(MEASURED)].dropna(subset=["ms_median"])
    title = f"Batch latency over each workload's batches, {device_text(df)}"
    if rows.empty:
        return placeholder(title, "no timed ragged-batch rows")
    rows = rows.assign(panel=rows["workload"] + " " + rows["kind"])
    grid = sns.catplot(data=rows, kind="box", x="backend", y="ms_median", col="panel", col_wrap=3, height=3.2,
                       aspect=1.2, sharey=False)
    grid.set(yscale="log")
    grid.set_axis_labels("", "ms per batch")
    for ax in grid.axes.flat:
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    grid.figure.suptitle(title, y=1.02, fontsize=10)
    return grid.figure
