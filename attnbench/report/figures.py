"""The microbench stage's figures from the joined results (seaborn on matplotlib's Agg backend).

Figures
  roofline               achieved FLOP/s against intensity (flops / bytes_model), under the roofs of the
                         ceilings measured on the host (Williams et al. 2009)
  throughput_vs_context  TFLOP/s against context length per backend (the ``tflops`` table's shape)
  decode_bandwidth       decode GB/s against KV length per layout, with the measured copy bandwidth
  error_ratio            the numerics gate: error over eager's in the same dtype per backend and dtype, with
                         the gate's line (max_err_ratio); fp8 backends beside it against their fp8 bound

Timed points carry error bars, the 95% interval of their median (:mod:`attnbench.bench.stats`;
a rate's interval is its time's, inverted), and points of a drift-flagged job a black cross.

Every function takes the joined results frame and returns a matplotlib Figure;
a figure with nothing to show says so instead of failing, so the pipeline's
declared outputs always exist.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.bench.numerics import FP8_REL_ERR_BOUND  # noqa: E402
from attnbench.bench.results import MEASURED  # noqa: E402
from attnbench.report.artifacts import Figure  # noqa: E402
from attnbench.report.tables import FLOP_CONVENTION, PREFILL, device_text, rate_interval, reference_slice  # noqa: E402

FIGURE_NAMES = ("roofline", "throughput_vs_context", "decode_bandwidth", "error_ratio")


def _label_lengths(ax: plt.Axes, lengths: pd.Series) -> None:
    """Tick a log-scaled length axis at the measured lengths, written out in full."""
    ticks = sorted(lengths.unique())
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])
    ax.minorticks_off()


def placeholder(title: str, note: str) -> plt.Figure:
    """A small figure that says why it has no data (declared outputs always exist)."""
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, note, ha="center", va="center")
    ax.set_title(title)
    return fig


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"].dropna(subset=["ms_median"])


def _palette(df: pd.DataFrame) -> dict:
    """One colour per backend, the same in every panel (so error bars match their lines)."""
    backends = list(dict.fromkeys(df["backend"]))
    return dict(zip(backends, sns.color_palette(n_colors=len(backends))))


def _intervals(ax: plt.Axes, data: pd.DataFrame, x: str, y: str, palette: dict, scale: float = 1.0) -> None:
    """Error bars at each point's 95% interval, and a black cross on points of a drift-flagged job."""
    low, high = rate_interval(data, y)
    for backend, rows in data.assign(_lo=low * scale, _hi=high * scale, _y=data[y] * scale).groupby(
            "backend", observed=True):
        rows = rows.dropna(subset=["_lo", "_hi"])
        if len(rows):
            ax.errorbar(rows[x], rows["_y"], yerr=[(rows["_y"] - rows["_lo"]).clip(lower=0),
                                                     (rows["_hi"] - rows["_y"]).clip(lower=0)],
                        fmt="none", ecolor=palette.get(backend, "black"), elinewidth=1, capsize=2)
    drifted = data[data["drift_flag"].fillna(False).astype(bool)]
    if len(drifted):
        ax.scatter(drifted[x], drifted[y] * scale, marker="x", color="black", s=30, zorder=5,
                   label="drift-flagged job")


def _facet_intervals(grid, data: pd.DataFrame, x: str, y: str, palette: dict, row: str, col: str) -> None:
    """:func:`_intervals` in every panel of a relplot faceted by ``row`` x ``col``."""
    for (row_value, col_value), ax in grid.axes_dict.items():
        _intervals(ax, data[(data[row] == row_value) & (data[col] == col_value)], x, y, palette)


def roofline(df: pd.DataFrame) -> plt.Figure:
    """Measured points under min(peak_flops, I x bandwidth) for each dtype's measured matmul ceiling."""
    ok = _measured(df).dropna(subset=["intensity", "tflops"])
    title = f"Roofline, {device_text(df)}"
    if ok.empty:
        return placeholder(title, "no measured rows")
    ok = ok.assign(flops_per_s=ok["tflops"] * 1e12)
    palette = _palette(ok)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    sns.scatterplot(data=ok, x="intensity", y="flops_per_s", hue="backend", style="mode", s=45, alpha=0.85, ax=ax,
                    palette=palette)
    _intervals(ax, ok, "intensity", "tflops", palette, scale=1e12)
    ceilings = ok.dropna(subset=["peak_flops", "peak_bytes_per_s"])
    if len(ceilings):
        bw = ceilings["peak_bytes_per_s"].median()
        lo = min(ok["intensity"].min(), 1.0) / 2
        hi = max(ok["intensity"].max(), (ceilings["peak_flops"].max() / bw)) * 2
        xs = np.geomspace(lo, hi, 200)
        for (dtype, peak), style in zip(ceilings.groupby("dtype", observed=True)["peak_flops"].max().items(),
                                        ("-", "--", ":", "-.")):
            ax.plot(xs, np.minimum(peak, xs * bw), color="black", lw=1.2, ls=style,
                    label=f"roof {dtype}: {peak / 1e12:.3g} TFLOP/s, ridge {peak / bw:.3g} FLOP/B")
        ax.text(lo * 1.1, lo * bw * 1.3, f"copy {bw / 1e9:.3g} GB/s", rotation=0, fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte, bytes_model)",
           ylabel="achieved FLOP/s", title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def throughput_vs_context(df: pd.DataFrame) -> plt.Figure:
    sub, shape = reference_slice(df, PREFILL, by_layout=False)
    sub = _measured(sub)
    title = f"Throughput vs context ({shape}), {device_text(df)}"
    if sub.empty:
        return placeholder(title, "no measured fwd/fwd_bwd rows")
    sub = sub.assign(causal=sub["causal"].map({True: "causal", False: "full"}))
    palette = _palette(sub)
    grid = sns.relplot(data=sub, kind="line", x="seq_kv", y="tflops", hue="backend", style="causal",
                       col="mode", row="dtype", markers=True, height=3.2, aspect=1.3, palette=palette,
                       facet_kws={"sharey": False}, errorbar=None)
    _facet_intervals(grid, sub, "seq_kv", "tflops", palette, "dtype", "mode")
    grid.set(xscale="log", yscale="log")  # fused and unfused backends differ by 10-100x
    for ax in grid.axes.flat:
        _label_lengths(ax, sub["seq_kv"])
    grid.set_axis_labels("context length S", "TFLOP/s")
    grid.figure.suptitle(title, y=1.02, fontsize=10)
    return grid.figure


def decode_bandwidth(df: pd.DataFrame) -> plt.Figure:
    sub, shape = reference_slice(df, ("decode",), by_layout=True)
    sub = _measured(sub)
    title = f"Decode bandwidth ({shape}), {device_text(df)}"
    if sub.empty:
        return placeholder(title, "no measured decode rows")
    palette = _palette(sub)
    grid = sns.relplot(data=sub, kind="line", x="seq_kv", y="gbps", hue="backend", col="layout", row="dtype",
                       markers=True, height=3.2, aspect=1.1, palette=palette, facet_kws={"sharey": False},
                       errorbar=None)
    _facet_intervals(grid, sub, "seq_kv", "gbps", palette, "dtype", "layout")
    grid.set(xscale="log", yscale="log")
    bw = sub["peak_bytes_per_s"].median()
    for ax in grid.axes.flat:
        if bw == bw:
            ax.axhline(bw / 1e9, color="black", lw=1, ls="--")
            ax.text(ax.get_xlim()[0], bw / 1e9, " measured copy bandwidth", va="bottom", fontsize=7)
        _label_lengths(ax, sub["seq_kv"])
    grid.set_axis_labels("KV length", "GB/s (bytes_model / time)")
    grid.figure.suptitle(title, y=1.02, fontsize=10)
    return grid.figure


def error_ratio(df: pd.DataFrame) -> plt.Figure:
    """The numerics gate as the rows were held to it: err_ratio_vs_eager against max_err_ratio, and for
    fp8 backends their error against fp64 beside the fp8 bound (attnbench.bench.numerics)."""
    sub = df[df["status"].isin(MEASURED)].dropna(subset=["err_ratio_vs_eager"])
    title = f"Numerics gate: error vs fp64 over eager's in the same dtype, {device_text(df)}"
    if sub.empty:
        return placeholder(title, "no rows with numerics")
    fp8 = sub["compute_dtype"] == "fp8"
    panels = [("ratio", sub[~fp8])] + ([("fp8", sub[fp8])] if fp8.any() else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(8 + 3 * (len(panels) - 1), 4), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1][:len(panels)]})
    for ax, (kind, rows) in zip(axes[0], panels):
        if kind == "ratio":
            sns.stripplot(data=rows, x="backend", y="err_ratio_vs_eager", hue="dtype", dodge=True, alpha=0.7, ax=ax)
            limits = pd.to_numeric(rows["max_err_ratio"], errors="coerce").dropna()
            limit = limits.max() if len(limits) else 2.0
            ax.axhline(1, color="black", lw=1)
            ax.axhline(limit, color="red", lw=1, ls="--",
                       label=f"gate: {limit:g}x eager (max_err_ratio, flash-attention's test rule)")
            ax.set(ylabel="error over eager's, same dtype", title=title)
        else:
            sns.stripplot(data=rows, x="backend", y="rel_err", hue="dtype", dodge=True, alpha=0.7, ax=ax)
            ax.axhline(FP8_REL_ERR_BOUND, color="red", lw=1, ls="--",
                       label=f"gate: {FP8_REL_ERR_BOUND:g} (2 x e4m3 unit roundoff)")
            ax.set(ylabel="error vs fp64 (relative)", title="fp8 backends")
        ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


BUILDERS = {"roofline": roofline, "throughput_vs_context": throughput_vs_context,
            "decode_bandwidth": decode_bandwidth, "error_ratio": error_ratio}


CAPTIONS = {
    "roofline": "Achieved FLOP/s against arithmetic intensity (FLOPs over the bytes the backend's algorithm moves, "
                "bytes_model), one point per (case, backend), under the roofs of the ceilings measured on this host "
                "at the start of the sweep (Williams et al. 2009). " + FLOP_CONVENTION + ".",
    "throughput_vs_context": "TFLOP/s against context length per backend at the reference prefill shape (the "
                             "tflops table's cells), log axes.",
    "decode_bandwidth": "Decode bandwidth (bytes_model / median time) against KV length per head layout; the "
                        "dashed line is the measured copy bandwidth.",
    "error_ratio": "Output error against an fp64 reference relative to sdpa-math's in the same dtype, per backend "
                   "and dtype; the dashed line is flash-attention's test rule (2x).",
}


def build_figures(df: pd.DataFrame) -> list[Figure]:
    return [Figure(name, CAPTIONS[name], BUILDERS[name](df)) for name in FIGURE_NAMES]
