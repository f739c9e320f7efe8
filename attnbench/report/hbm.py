"""Tables and figures of the hbm stage: measured against modelled and minimum bytes, the roofline at
measured intensity, and the KV-cache and training-step byte ledgers.

:func:`build` reads ``results/<sweep>/hbm/{hbm,ledger}.parquet`` and returns every table and figure;
with no measured rows (a CPU run) the tables and axes say so and why, so every run writes the same set.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.report.artifacts import Figure, StageOutputs, Table, frame_table, note_table  # noqa: E402

TABLE_NAMES = ("bytes", "kv_cache", "kv_measured", "train_step")
FIGURE_NAMES = ("hbm-ratios", "roofline", "kv-ledger")


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def case_label(row) -> str:
    """Short x-axis label: 'fwd B4 S4k causal', 'decode gqa B16 Skv64k'."""
    if row["mode"] == "decode":
        return f"decode {row['layout']} B{row['batch']} Skv{_tokens(row['seq_kv'])}"
    return f"{row['mode']} B{row['batch']} S{_tokens(row['seq_q'])}{' causal' if row['causal'] else ''}"


def _empty(ax, what: str, df: pd.DataFrame) -> None:
    reasons = df["reason"].dropna().astype(str) if "reason" in df else pd.Series(dtype=str)
    why = reasons.value_counts().index[0][:110] if len(reasons) else "no rows"
    ax.text(0.5, 0.5, f"no {what}\n{why}", ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=9)
    ax.set_axis_off()


def _measured(hbm: pd.DataFrame) -> pd.DataFrame:
    ok = hbm[hbm["status"] == "ok"].copy() if len(hbm) else hbm.copy()
    if len(ok):
        ok["case"] = ok.apply(case_label, axis=1)
    return ok


def ratio_figure(hbm: pd.DataFrame) -> plt.Figure:
    """Bars of bytes_measured over bytes_model and over bytes_min per (case, backend); 1 is the model."""
    ok = _measured(hbm)
    if not len(ok):
        fig, ax = plt.subplots(figsize=(7, 3))
        _empty(ax, "measured HBM bytes", hbm)
    else:
        long = ok.melt(id_vars=["case", "backend"], value_vars=["ratio_measured_model", "ratio_measured_min"],
                       var_name="ratio", value_name="value")
        long["ratio"] = long["ratio"].map({"ratio_measured_model": "measured / modelled",
                                           "ratio_measured_min": "measured / minimum"})
        grid = sns.catplot(data=long, x="case", y="value", hue="backend", row="ratio", kind="bar", sharey=False,
                           height=3.0, aspect=max(2.5, ok["case"].nunique() / 3))
        for ax in grid.axes.flat:
            ax.set_yscale("log")
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.tick_params(axis="x", rotation=30)
            ax.set_ylabel("ratio (log)")
        grid.set_titles("{row_name}")
        grid.figure.suptitle("DRAM bytes (Nsight Compute) against the byte model", y=1.02)
        fig = grid.figure
    return fig


def roofline_figure(hbm: pd.DataFrame) -> plt.Figure:
    """Each (case, backend) at its measured intensity and achieved FLOP/s, under the host's measured ceilings."""
    ok = _measured(hbm)
    timed = ok[ok["gbps_measured"].notna() & ok["peak_flops"].notna()] if len(ok) else ok
    fig, ax = plt.subplots(figsize=(7.5, 5))
    if not len(timed):
        _empty(ax, "timed rows with measured bytes and ceilings", hbm)
    else:
        timed = timed.assign(achieved=timed["flops"] / (timed["ms_median"] / 1e3),
                             bound=timed["bound_measured"].fillna("unknown"))
        lo = min(timed["intensity_measured"].min() / 3, 0.3)
        hi = max(timed["intensity_measured"].max() * 3, 3e3)
        x = np.logspace(np.log10(lo), np.log10(hi), 200)
        for dtype, rows in timed.groupby("dtype"):
            peak, bw = rows["peak_flops"].median(), rows["peak_bytes_per_s"].median()
            ax.plot(x, np.minimum(peak, x * bw), lw=1.2, label=f"roof {dtype}: {peak / 1e12:.0f} TFLOP/s, "
                                                                 f"{bw / 1e12:.2f} TB/s, ridge {peak / bw:.0f}")
        sns.scatterplot(data=timed, x="intensity_measured", y="achieved", hue="backend", style="bound", s=60, ax=ax)
        ax.set(xscale="log", yscale="log", xlabel="FLOP per DRAM byte (measured)", ylabel="achieved FLOP/s",
               title="Roofline at measured intensity (ceilings measured on this host)")
        ax.legend(fontsize=7, loc="lower right")
    return fig


def ledger_figure(ledger: pd.DataFrame) -> plt.Figure:
    """KV bytes/token/layer per layout and dtype; decode time per step vs context; attention bytes per step."""
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    kv = ledger[ledger["table"] == "kv_cache"].drop_duplicates(["name", "dtype"])
    sns.barplot(data=kv, x="name", y="bytes_per_token_layer", hue="dtype", ax=axes[0])
    axes[0].set(yscale="log", xlabel="", ylabel="KV bytes / token / layer",
                title="KV cache per token (DeepSeek-V2 Table 1 formulas)")
    axes[0].tick_params(axis="x", rotation=30)

    measured = ledger[(ledger["table"] == "kv_measured") & ledger["decode_ms_per_step"].notna()]
    if len(measured):
        sns.lineplot(data=measured, x="seq_kv", y="decode_ms_per_step", hue="backend", style="name", marker="o",
                     ax=axes[1])
        axes[1].set(xscale="log", yscale="log", xlabel="context (KV tokens)", ylabel="ms per decode step",
                    title="Decode time per step (one layer, whole batch)")
        axes[1].legend(fontsize=7)
    else:
        _empty(axes[1], "timed decode rows", ledger[ledger["table"] == "kv_measured"])

    train = ledger[ledger["table"] == "pretrain"]
    sns.barplot(data=train, x="name", y="bytes_per_step", hue="family", ax=axes[2])
    first = train.iloc[0] if len(train) else None
    sub = f"B{int(first['batch'])} S{int(first['seq'])} x{int(first['layers'])} layers" if first is not None else ""
    axes[2].set(yscale="log", xlabel="", ylabel="attention HBM bytes / training step",
                title=f"Attention bytes per training step ({sub})")
    axes[2].tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig


def _why(df: pd.DataFrame) -> str:
    reasons = df["reason"].dropna().astype(str) if "reason" in df else pd.Series(dtype=str)
    return reasons.value_counts().index[0][:160] if len(reasons) else "no rows"


BYTES_COLUMNS = ["status", "bytes_min", "bytes_model", "bytes_measured", "ratio_measured_model", "ratio_measured_min",
                 "ratio_read_min", "ratio_written_min", "ms_median", "intensity_measured", "bound_measured"]


def bytes_table(hbm: pd.DataFrame) -> Table:
    caption = ("DRAM bytes per call measured by Nsight Compute (dram__bytes_read.sum + dram__bytes_write.sum over "
               "the call's kernels) against the byte model (bytes_model: what the backend's algorithm moves) and "
               "the minimum (bytes_min: each input read once, each output written once), per case and backend.")
    ok = _measured(hbm)
    if not len(ok):
        return note_table("bytes", caption, f"no measured HBM bytes: {_why(hbm)}")
    columns = [c for c in BYTES_COLUMNS if c in ok]
    return frame_table("bytes", caption, ok.set_index(["case", "backend"])[columns])


KV_COLUMNS = ["name", "dtype", "formula", "elements_per_token_layer", "bytes_per_token_layer", "bytes_per_token_model",
              "vs_mha", "gqa_equivalent_groups"]


def kv_cache_table(ledger: pd.DataFrame) -> Table:
    kv = ledger[ledger["table"] == "kv_cache"]
    caption = ("KV-cache bytes per token per layer and per token of the whole model, per head layout and cache dtype "
               "(DeepSeek-V2 Table 1: MHA 2·n_h·d_h, GQA 2·n_g·d_h, MQA 2·d_h, MLA d_c + d_h^R elements), against "
               "MHA's, and MLA as GQA-equivalent groups.")
    if kv.empty:
        return note_table("kv_cache", caption, "no KV-cache rows in the ledger")
    return frame_table("kv_cache", caption, kv[[c for c in KV_COLUMNS if c in kv]].set_index(["name", "dtype"]))


def kv_measured_table(ledger: pd.DataFrame) -> Table:
    rows = ledger[ledger["table"] == "kv_measured"]
    caption = ("The KV formulas checked on decode kernels: measured DRAM bytes read per cached token per layer "
               "over the formula's bytes, the decode time per step and its fraction of the measured copy bandwidth.")
    ok = rows[rows["status"] == "ok"] if len(rows) else rows
    if ok.empty:
        return note_table("kv_measured", caption, f"no measured decode rows: {_why(rows)}")
    columns = [c for c in ("status", "measured_bytes_per_token_layer", "bytes_per_token_layer", "ratio_measured_formula",
                           "decode_ms_per_step", "decode_us_per_token", "frac_of_bw") if c in ok]
    return frame_table("kv_measured", caption, ok.set_index(["name", "backend", "seq_kv"])[columns])


def train_step_table(ledger: pd.DataFrame) -> Table:
    train = ledger[ledger["table"] == "pretrain"]
    caption = ("Attention HBM bytes per training step of the ledger's model shape (forward and forward+backward per "
               "layer, per step over every layer, per token), per head layout and backend family (fused kernels "
               "move Q, K, V, O; eager and math add their passes over the scores).")
    if train.empty:
        return note_table("train_step", caption, "no training-step rows in the ledger")
    columns = [c for c in ("batch", "seq", "layers", "bytes_fwd_layer", "bytes_fwd_bwd_layer", "bytes_per_step",
                           "bytes_per_token_step", "flops_per_step", "intensity") if c in train]
    return frame_table("train_step", caption, train.set_index(["name", "family"])[columns])


FIGURE_CAPTIONS = {
    "hbm-ratios": "Measured DRAM bytes over modelled and over minimum bytes per (case, backend), log scale; 1 is "
                  "the model.",
    "roofline": "Each (case, backend) at its measured intensity (FLOPs per measured DRAM byte) and achieved FLOP/s, "
                "under the ceilings measured on this host.",
    "kv-ledger": "KV-cache bytes per token per layer by layout and dtype; decode time per step against context; "
                 "attention bytes per training step by layout and backend family.",
}


def build(hbm: pd.DataFrame, ledger: pd.DataFrame) -> StageOutputs:
    """Every table and figure of the hbm stage, from the merged hbm rows and the ledger."""
    tables = [bytes_table(hbm), kv_cache_table(ledger), kv_measured_table(ledger), train_step_table(ledger)]
    figures = [Figure("hbm-ratios", FIGURE_CAPTIONS["hbm-ratios"], ratio_figure(hbm)),
               Figure("roofline", FIGURE_CAPTIONS["roofline"], roofline_figure(hbm)),
               Figure("kv-ledger", FIGURE_CAPTIONS["kv-ledger"], ledger_figure(ledger))]
    return StageOutputs(tables, figures)
