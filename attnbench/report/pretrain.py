"""Paper-style tables and figures of the four pretraining experiments, from the frames
:func:`attnbench.train.experiments.run_experiment` wrote (``results/<sweep>/pretrain/<experiment>/``).

:func:`build` returns the tables (:data:`OUTPUTS`, grouped by experiment) and one figure per
experiment, named after it, for :func:`attnbench.report.artifacts.write_stage`; a figure with nothing
to show says so instead of failing, so a rule's declared outputs always exist.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.files import read_parquet  # noqa: E402
from attnbench.report.artifacts import Figure, StageOutputs, Table, fmt  # noqa: E402
from attnbench.report.figures import placeholder  # noqa: E402
from attnbench.train import experiments as ex  # noqa: E402

# Tables each experiment writes (always, so workflow rules can declare them); its figure is named after it.
OUTPUTS = {"divergence": ("divergence", "divergence_loss", "divergence_numerics"),
           "lr_sensitivity": ("lr_sensitivity_grid", "lr_sensitivity"),
           "fp8": ("fp8", "fp8_scales"), "layouts": ("layouts",)}
FIGURE_CAPTIONS = {
    "divergence": "Weight divergence from the reference run over training (max abs, relative L2, W1) for runs that "
                  "differ only in attention backend, seed or precision (Golden et al. 2024); without weight "
                  "snapshots, each swap's per-step training-loss gap to the reference.",
    "lr_sensitivity": "Final validation loss against learning rate per variant, and the largest attention logit over "
                      "the steps at the highest learning rate (Wortsman et al. 2023).",
    "fp8": "Training loss per FP8 recipe against bf16, and the share of gradient elements that round to 0 in FP8.",
    "layouts": "Head layouts at matched parameters: final validation loss against tokens/s (marker size: KV-cache "
               "bytes per token), and KV-cache bytes per token (bf16).",
}


def _table(name: str, caption: str, values: pd.DataFrame) -> Table:
    return Table(name, caption, values, values.map(fmt))


def _device(runs: pd.DataFrame) -> str:
    if "device_name" not in runs or runs["device_name"].dropna().empty:
        return "unknown device"
    row = runs.dropna(subset=["device_name"]).iloc[0]
    return f"{row['device_name']}, torch {row.get('torch_version', '?')}, corpus {row.get('corpus', '?')} " \
           f"(sha256 {str(row.get('corpus_sha256', ''))[:12]})"


def _spike_note(runs: pd.DataFrame) -> str:
    if "spike_window" not in runs or runs["spike_window"].dropna().empty:
        return ""
    windows = sorted({int(w) for w in runs["spike_window"].dropna()})
    return (f"Spike score: share of steps > 7 sigma above the mean of the previous {'/'.join(map(str, windows))} "
            "steps (OLMo 2 uses 1000; shortened for short runs).")


def _nothing(note: str) -> pd.DataFrame:
    """A one-cell table that says why it is empty (declared outputs always exist)."""
    return pd.DataFrame({"note": [note]})


def divergence_outputs(runs, steps, div, num) -> tuple[list[Table], plt.Figure]:
    final = div.sort_values("step").groupby("run").tail(1) if len(div) else div
    kernel = final.loc[final["swap"] == "backend", "rel_l2"].max() if len(final) else float("nan")
    if len(final) and kernel > 0:  # how many times the largest kernel-swap divergence
        final = final.assign(rel_l2_over_kernel_swap=final["rel_l2"] / kernel)
    caption = ("Weight divergence from the reference run at the last snapshot, for runs that differ only in "
               "attention backend, only in seed, or only in precision (Golden et al. 2024). rel_l2 = ||a-b||/||a||; "
               "wasserstein = W1 of the weight distributions; rel_l2_over_kernel_swap = rel_l2 over the largest "
               f"kernel-swap rel_l2. {_device(runs)}.")
    loss = ex.loss_divergence_frame(runs, steps)
    tables = [_table("divergence", caption, final.set_index(["swap", "variant"]).drop(columns=["run"], errors="ignore")
                     if len(final) else _nothing("no weight snapshots to compare")),
              _table("divergence_loss", "The same swaps seen in the loss: each run's final validation loss, its gap to "
                     "the reference's, and the RMS and largest per-step difference of the training loss from the "
                     "reference's over the steps both logged (one batch order, except in the seed swap, whose seed sets both "
                     "the initial weights and the batch order). A truncated run's final "
                     "validation loss is its last evaluation, before its learning-rate schedule ended.",
                     loss.set_index(["swap", "variant"]) if len(loss) else _nothing("no reference run"))]
    keep = [c for c in ("backend", "dtype", "status", "out_rel_err", "out_max_abs", "dq_rel_err", "dk_rel_err",
                        "dv_rel_err", "reason") if c in num]
    dtypes = set(num["dtype"]) if len(num) else set()
    shape = " ".join(word for word in num["case"].iloc[0].split() if word not in dtypes) if len(num) else "none ran"
    tables.append(_table("divergence_numerics", "Attention output and gradient error against fp64 at the model's "
                         f"attention shape ({shape}), in each precision the runs used; same inputs for every backend.",
                         num[keep].set_index(["backend", "dtype"]) if len(num) else _nothing("no backend ran")))
    if div.empty:
        return tables, _loss_gap_figure(runs, steps)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, metric in zip(axes, ("max_abs", "rel_l2", "wasserstein")):
        data = div[div[metric] > 0]
        if len(data):
            sns.lineplot(data=data, x="step", y=metric, hue="variant", style="swap", marker="o", ax=ax)
        ax.set_yscale("log")
        ax.set_title(metric)
        if ax.get_legend() is not None:  # one legend, beside the last panel, covering no data
            if ax is axes[-1]:
                sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1))
            else:
                ax.get_legend().remove()
    zero = sorted(set(div["variant"]) - set(div.loc[div[["max_abs", "rel_l2"]].gt(0).any(axis=1), "variant"]))
    note = f" (bitwise identical to the reference, not drawn on log axes: {', '.join(zero)})" if zero else ""
    fig.suptitle("Weight divergence from the reference: kernel vs seed vs precision swap" + note)
    fig.tight_layout()
    return tables, fig


def _loss_gap_figure(runs, steps) -> plt.Figure:
    """Without weight snapshots: each swap run's per-step |train loss - reference's|, a 50-step rolling mean."""
    ref_run, gaps = ex.loss_gaps(runs, steps)
    if ref_run is None or steps.empty:
        return placeholder("Weight divergence", "no snapshots to compare")
    fig, ax = plt.subplots(figsize=(8, 4))
    for run, gap in gaps:
        gap = gap.abs()
        ax.plot(gap.index, gap.rolling(50, min_periods=1).mean(), label=f"{run['swap']}: {run['variant']}")
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="|train loss - reference| (50-step mean)")
    ax.legend(fontsize=8)
    ax.set_title("Loss divergence from the reference (no weight snapshots in these rows)")
    fig.tight_layout()
    return fig


def lr_outputs(runs, steps) -> tuple[list[Table], plt.Figure]:
    grid, sens = ex.lr_frame(runs)
    tables = [_table("lr_sensitivity_grid", f"Final validation loss per learning rate. {_device(runs)}.", grid),
              _table("lr_sensitivity", "LR sensitivity (Wortsman et al. 2023): mean over LRs of "
                     "min(final, initial loss) - best final loss; lower is more robust. " + _spike_note(runs),
                     sens.set_index("variant"))]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    ok = runs[runs["status"].isin(["ok", "diverged"])]
    if len(ok):
        sns.lineplot(data=ok, x="lr", y="final_val_loss", hue="variant", marker="o", ax=a)
        a.set_xscale("log")
    a.set_title("final validation loss vs learning rate")
    logit_cols = [c for c in steps.columns if c.startswith("max_logit_l")]
    if logit_cols and len(steps):
        top = steps.assign(max_logit=steps[logit_cols].max(axis=1)).dropna(subset=["max_logit"])
        top = top.merge(runs[["run", "lr"]].rename(columns={"lr": "peak_lr"}), on="run")
        top = top[top["peak_lr"] == top["peak_lr"].max()]
        sns.lineplot(data=top, x="step", y="max_logit", hue="variant", ax=b)
        b.set_title(f"max attention logit over steps at LR {top['peak_lr'].max():g}")
    fig.tight_layout()
    return tables, fig


_SPEED_NOTE = ("tokens_per_s: median of the per-step rate after the first 10% of steps, tokens_per_s_iqr its "
               "interquartile range.")


def fp8_outputs(runs, steps) -> tuple[list[Table], plt.Figure]:
    frame = ex.fp8_frame(runs, steps)
    main = [c for c in frame.columns if not c.startswith("fp8_")]
    stats = frame.set_index("precision")[[c for c in frame.columns if c.startswith("fp8_")]]
    long = stats.T.reset_index().rename(columns={"index": "column"}) if len(stats.columns) else pd.DataFrame()
    tables = [_table("fp8", "FP8 recipes against bf16: loss gap (final val loss minus the first row's), spike "
                     "scores; emulated runs claim no speed. " + _SPEED_NOTE + " " + _spike_note(runs) +
                     f" {_device(runs)}.",
                     frame[main].set_index("precision"))]
    if long.empty:
        long = _nothing("no run logged FP8 statistics").reset_index().rename(columns={"index": "column"})
    tables.append(_table("fp8_scales", "Mean over logged steps of FP8 scale statistics per recipe and tensor "
                         "(fp8_<recipe>_<act|weight|grad>_<amax|scale_log2|overflow|underflow>), measured on "
                         "each run's own tensors (attnbench.train.precision).", long.set_index("column")))
    ok = steps.dropna(subset=["loss"]) if len(steps) else steps
    if ok.empty:
        return tables, placeholder("FP8 recipes", "no run trained")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    sns.lineplot(data=ok, x="step", y="loss", hue="variant", ax=a)
    a.set_title("training loss")
    under = [c for c in ok.columns if c.endswith("_grad_underflow")]
    if under:
        melted = ok.dropna(subset=under).melt(id_vars=["step", "variant"], value_vars=under, var_name="recipe",
                                              value_name="underflow")
        melted["recipe"] = melted["recipe"].str.removeprefix("fp8_").str.removesuffix("_grad_underflow")
        sns.lineplot(data=melted, x="step", y="underflow", hue="recipe", style="variant", ax=b)
        b.set_title("gradient underflow share (rounds to 0 in FP8)")
    fig.tight_layout()
    return tables, fig


def layouts_outputs(runs, steps) -> tuple[list[Table], plt.Figure]:
    frame = ex.layouts_frame(runs)
    tables = [_table("layouts", "Head layouts at matched parameters (MLP width absorbs the difference): final "
                     "validation loss, throughput and decode KV-cache bytes per token (bf16, all layers; "
                     f"DeepSeek-V2 Table 1). {_SPEED_NOTE} {_device(runs)}.", frame.set_index("variant"))]
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return tables, placeholder("Layouts", "no layout trained")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    sns.scatterplot(data=ok, x="tokens_per_s", y="final_val_loss", hue="variant", size="kv_bytes_per_token_bf16",
                    sizes=(60, 400), ax=a)
    a.set_title("final val loss vs tokens/s (size: KV bytes/token)")
    sns.barplot(data=ok, x="variant", y="kv_bytes_per_token_bf16", ax=b)
    b.set_title("KV-cache bytes per token (bf16)")
    fig.tight_layout()
    return tables, fig


def experiment_outputs(name: str, exp_dir: str | Path) -> tuple[list[Table], Figure]:
    """The tables and the figure of experiment ``name`` from ``exp_dir``'s parquet files."""
    exp_dir = Path(exp_dir)
    runs = read_parquet(exp_dir / "runs.parquet")
    steps = read_parquet(exp_dir / "steps.parquet")
    if name == "divergence":
        tables, fig = divergence_outputs(runs, steps, read_parquet(exp_dir / "divergence.parquet"),
                                         read_parquet(exp_dir / "numerics.parquet"))
    else:
        tables, fig = {"lr_sensitivity": lr_outputs, "fp8": fp8_outputs, "layouts": layouts_outputs}[name](runs, steps)
    for table in tables:
        table.group = name
    return tables, Figure(name, FIGURE_CAPTIONS[name], fig, group=name)


def build(experiments: dict[str, Path]) -> StageOutputs:
    """Every experiment's tables and figure (experiment name -> the folder ``attnbench experiment run`` wrote)."""
    outputs = StageOutputs()
    for name, exp_dir in experiments.items():
        tables, figure = experiment_outputs(name, exp_dir)
        outputs.tables += tables
        outputs.figures.append(figure)
    return outputs
