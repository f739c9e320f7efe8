"""The microbench stage's figures from the joined results (seaborn on matplotlib's Agg backend).

Figures
  roofline               achieved FLOP/s against intensity (flops / bytes_model), under the roofs of the
                         ceilings measured on the host (Williams et al. 2009)
  throughput_vs_context  TFLOP/s against context length per backend (the ``tflops`` table's shape)
  decode_bandwidth       decode GB/s against KV length per layout, with the measured copy bandwidth
  error_ratio            error against fp64 relative to sdpa-math's, per backend and dtype

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

from attnbench.report.artifacts import Figure  # noqa: E402
from attnbench.report.tables import FLOP_CONVENTION, PREFILL, device_text, reference_slice  # noqa: E402

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


def roofline(df: pd.DataFrame) -> plt.Figure:
    """Measured points under min(peak_flops, I x bandwidth) for each dtype's measured matmul ceiling."""
    ok = _measured(df).dropna(subset=["intensity", "tflops"])
    title = f"Roofline, {device_text(df)}"
    if ok.empty:
        return placeholder(title, "no measured rows")
    ok = ok.assign(flops_per_s=ok["tflops"] * 1e12)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    sns.scatterplot(data=ok, x="intensity", y="flops_per_s", hue="backend", style="mode", s=45, alpha=0.85, ax=ax)
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
    grid = sns.relplot(data=sub, kind="line", x="seq_kv", y="tflops", hue="backend", style="causal",
                       col="mode", row="dtype", markers=True, height=3.2, aspect=1.3,
                       facet_kws={"sharey": False})
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
    grid = sns.relplot(data=sub, kind="line", x="seq_kv", y="gbps", hue="backend", col="layout", row="dtype",
                       markers=True, height=3.2, aspect=1.1, facet_kws={"sharey": False})
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
    sub = df[df["status"].isin(("ok", "numerics_fail"))].dropna(subset=["err_ratio_vs_math"])
    title = f"Error vs fp64, relative to sdpa-math in the same dtype, {device_text(df)}"
    if sub.empty:
        return placeholder(title, "no rows with numerics")
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.stripplot(data=sub, x="backend", y="err_ratio_vs_math", hue="dtype", dodge=True, alpha=0.7, ax=ax)
    ax.set_yscale("log")
    ax.axhline(1, color="black", lw=1)
    ax.axhline(2, color="red", lw=1, ls="--", label="2x (flash-attention's test rule)")
    ax.set(ylabel="error ratio vs sdpa-math", title=title)
    ax.legend(fontsize=8)
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
