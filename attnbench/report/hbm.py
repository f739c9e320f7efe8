"""Figures of the hbm stage (seaborn): measured/modelled/minimum bytes, roofline, KV and training-step ledgers.

Each function draws from the tables alone and always writes its file; with no
measured rows the axes say so (and why), so a CPU run renders the same set.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

FIGURES = ("hbm-ratios.png", "roofline.png", "kv-ledger.png")


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


def ratio_figure(hbm: pd.DataFrame, path: Path) -> None:
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
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def roofline_figure(hbm: pd.DataFrame, path: Path) -> None:
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
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def ledger_figure(ledger: pd.DataFrame, path: Path) -> None:
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
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def write_figures(hbm: pd.DataFrame, ledger: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FIGURES]
    ratio_figure(hbm, paths[0])
    roofline_figure(hbm, paths[1])
    ledger_figure(ledger, paths[2])
    return paths
