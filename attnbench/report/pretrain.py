"""Paper-style tables and figures of the four pretraining experiments, from the frames
:func:`attnbench.train.experiments.run_experiment` wrote (``results/<sweep>/pretrain/<experiment>/``).

:func:`build` returns the tables (:data:`OUTPUTS`, grouped by experiment) and the figures
(:data:`FIGURES`) of each experiment, for :func:`attnbench.report.artifacts.write_stage`; a table or figure with nothing
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
from attnbench.train import intervals, stability  # noqa: E402

# Tables each experiment writes (always, so workflow rules can declare them), and its figures.
OUTPUTS = {"divergence": ("divergence", "divergence_pairs", "divergence_numerics", "divergence_kernels",
                          "divergence_spikes"),
           "lr_sensitivity": ("lr_sensitivity_grid", "lr_sensitivity", "lr_sensitivity_spikes"),
           "fp8": ("fp8", "fp8_seeds", "fp8_contrasts", "fp8_scales", "fp8_layers", "fp8_spikes"),
           "layouts": ("layouts", "layouts_spikes")}
FIGURES = {"divergence": ("divergence",), "lr_sensitivity": ("lr_sensitivity",), "fp8": ("fp8", "fp8_layers"),
           "layouts": ("layouts",)}
FIGURE_CAPTIONS = {
    "divergence": "Weight divergence from each arm's reference over training (max abs, relative L2, W1) for runs "
                  "that differ only in attention backend, precision, initial weights or batch order (Golden et al. "
                  "2024), mean over seeds.",
    "lr_sensitivity": "Final validation loss against learning rate per variant, and the largest attention logit over "
                      "the steps at the highest learning rate (Wortsman et al. 2023).",
    "fp8": "FP8 recipes' validation-loss gap (left) and training-loss gap (right) to the same-seed baseline run over "
           "steps, against the baseline seeds' noise band.",
    "fp8_layers": "FP8 scale statistics per layer (amax, share of elements that underflow) for each recipe; a "
                  "recipe with several seeds is their mean, its band their range.",
    "layouts": "Head layouts at matched parameters: final validation loss against tokens/s (marker size: KV-cache "
               "bytes per token), and KV-cache bytes per token (bf16).",
}
CI_NOTE = (f"Intervals: mean over seeds with a two-sided {intervals.LEVEL:.0%} Student-t interval "
           "(mean +- t s / sqrt(n); attnbench.train.intervals), n = seeds that trained.")


def _table(name: str, caption: str, values: pd.DataFrame) -> Table:
    return Table(name, caption, values, values.map(fmt))


def _nothing(note: str) -> pd.DataFrame:
    """A one-cell table that says why it is empty (declared outputs always exist)."""
    return pd.DataFrame({"note": [note]})


def _or_note(frame: pd.DataFrame, index: list[str], note: str) -> pd.DataFrame:
    return frame.set_index(index) if len(frame) else _nothing(note)


def _device(runs: pd.DataFrame) -> str:
    """Where the runs trained and on what data; runs from more than one device or torch (an experiment continued
    in a later session from restored rows: attnbench.train.restore) are counted per each."""
    if "device_name" not in runs or runs["device_name"].dropna().empty:
        return "unknown device"
    trained = runs.dropna(subset=["device_name"])
    row = trained.iloc[0]
    versions = trained["torch_version"] if "torch_version" in trained else pd.Series("?", index=trained.index)
    where = trained.groupby([trained["device_name"], versions], sort=False, dropna=False).size()
    devices = "; ".join(f"{n} runs on {d}, torch {v}" for (d, v), n in where.items()) if len(where) > 1 else \
        f"{row['device_name']}, torch {versions.iloc[0]}"
    data = f"corpus {row.get('corpus', '?')} (sha256 {str(row.get('corpus_sha256', ''))[:12]})"
    floor = row.get("loss_floor")
    if floor is not None and pd.notna(floor):
        data += (f", loss floor {floor:.4f} (the synthetic chain's entropy over the validation targets: the loss of "
                 "the chain itself)")
    return f"{devices}, {data}"


SPIKE_NOTE = ("Spike scores at their sources' definitions: olmo2_paper = percent of points at least "
              f"{stability.OLMO2_PAPER.sigma:g} sample std from the mean of the previous "
              f"{stability.OLMO2_PAPER.window} points, two-sided (OLMo 2 paper; runs of at most "
              f"{stability.OLMO2_PAPER.window} steps score nothing); olmo_core = fraction of the last min(steps, "
              f"{stability.OLMO_CORE.span}) steps more than {stability.OLMO_CORE.sigma:g} population std above the "
              f"mean of the previous {stability.OLMO_CORE.window}, one-sided, any = loss or grad norm "
              "(allenai/OLMo-core StabilityMonitorCallback). min_jump = the smallest one-step rise above the trailing "
              "mean, relative to it, that each would flag at the run's end: what a zero score rules out.")


def spikes_table(name: str, runs: pd.DataFrame) -> Table:
    frame = ex.spike_frame(runs)
    return _table(name, SPIKE_NOTE + f" {_device(runs)}.", _or_note(frame, ["run"], "no run trained"))


def _runs_note(runs: pd.DataFrame) -> str:
    """How many runs trained, and which did not (and why), for captions."""
    if runs.empty:
        return "No runs."
    counts = runs["status"].value_counts()
    return "Runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "."


# ---------------------------------------------------------------- divergence

DIVERGENCE_DISPLAY = ["arm", "label", "status", "seeds_ok", "step", "max_abs_mean", "max_abs_ci_low", "max_abs_ci_high",
                      "max_abs_over_steps_mean", "rel_l2_mean", "rel_l2_ci_low", "rel_l2_ci_high", "w1_mean_mean",
                      "w1_mean_ci_low", "w1_mean_ci_high", "replicate_rel_l2", "over_replicate", "val_loss_gap_mean",
                      "val_loss_gap_ci_low", "val_loss_gap_ci_high", "train_loss_gap_rms_mean", "identical", "reason"]


def divergence_outputs(runs, steps, div, num) -> tuple[list[Table], list[plt.Figure]]:
    loss = ex.loss_divergence_frame(runs, steps)
    summary = ex.divergence_summary(div, loss)
    precision = runs.loc[runs.get("role", pd.Series(dtype=str)) == "reference", "precision"]
    precision = precision.iloc[0] if len(precision) else ""
    caption = ("Weight divergence from the reference at the last snapshot every seed reached, per arm (Golden et al. "
               "2024): replicate = the reference's configuration again (the nondeterminism floor; 0 where runs are "
               "deterministic), kernel = another attention backend at the same precision, precision = the first "
               "reference at another precision, init_seed / data_order = only the initial weights / only the batch "
               "order changed. max_abs = max |W - W_ref| over all weights (the paper's metric; max_abs_over_steps its "
               "largest over snapshots); rel_l2 = ||W - W_ref|| / ||W_ref||; w1_mean = per-tensor Wasserstein-1 "
               "between value distributions, averaged with element-count weights (this project's convention); "
               "over_replicate = rel_l2 over the same reference's replicate floor; val_loss_gap = final validation "
               f"loss minus the reference's; train_loss_gap_rms = RMS per-step training-loss difference. {CI_NOTE} "
               f"Precision of the references: {precision}. {_runs_note(runs)} {_device(runs)}.")
    shown = summary.reindex(columns=[c for c in DIVERGENCE_DISPLAY if c in summary]) if len(summary) else summary
    tables = [_table("divergence", caption, _or_note(shown, ["arm", "label"], "no divergence pairs")),
              _table("divergence_pairs", "Every pair and seed behind the divergence table: its status, the steps "
                     "both runs logged, the final validation loss gap and the RMS and largest per-step train-loss "
                     "difference. A truncated run's final validation loss is its last evaluation.",
                     _or_note(loss, ["arm", "label", "seed"], "no reference runs"))]
    keep = [c for c in ("backend", "dtype", "status", "out_rel_err", "out_max_abs", "dq_rel_err", "dk_rel_err",
                        "dv_rel_err", "reason") if c in num]
    dtypes = set(num["dtype"]) if len(num) else set()
    shape = " ".join(word for word in num["case"].iloc[0].split() if word not in dtypes) if len(num) else "none ran"
    tables.append(_table("divergence_numerics", "Attention output and gradient error against fp64 at the model's "
                         f"attention shape ({shape}), in each precision the runs used; same inputs for every backend.",
                         num[keep].set_index(["backend", "dtype"]) if len(num) else _nothing("no backend ran")))
    joined = ex.kernel_training_frame(summary, num, precision)
    tables.append(_table("divergence_kernels", "Kernel numerics joined to training: per kernel arm, the backend's and "
                         f"its reference's per-call error against fp64 at the model's attention shape ({shape}, "
                         f"{precision}), their ratio, the arm's weight divergence (rel_l2) and final val-loss gap "
                         f"with their intervals, and the reference's replicate floor. {CI_NOTE}",
                         _or_note(joined, ["backend", "reference"], "no kernel arms")))
    tables.append(spikes_table("divergence_spikes", runs))
    return tables, [_divergence_figure(div)]


def _divergence_figure(div: pd.DataFrame) -> plt.Figure:
    if div.empty:
        return placeholder("Weight divergence", "no weight snapshots to compare")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, metric in zip(axes, ("max_abs", "rel_l2", "w1_mean")):
        data = div[div[metric] > 0]
        if len(data):  # the line is the mean over seeds, the band their range
            sns.lineplot(data=data, x="step", y=metric, hue="label", style="arm", marker="o", errorbar=("pi", 100),
                         ax=ax)
            ax.set_yscale("log")
        ax.set_title(metric)
        if ax.get_legend() is not None:  # one legend, beside the last panel, covering no data
            if ax is axes[-1]:
                sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
            else:
                ax.get_legend().remove()
    positive = div.loc[div[list(stability.DIVERGENCE_METRICS)].gt(0).any(axis=1), "label"]
    zero = sorted(set(div["label"]) - set(positive))
    note = f"\nbitwise identical to the reference at every snapshot and seed (not on log axes): {', '.join(zero)}" \
        if zero else ""
    fig.suptitle("Weight divergence from the reference per arm (line: mean over seeds; band: their range)" + note,
                 fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- LR sensitivity


def lr_outputs(runs, steps) -> tuple[list[Table], list[plt.Figure]]:
    grid, sens = ex.lr_frame(runs)
    tables = [_table("lr_sensitivity_grid", "Final validation loss per variant and learning rate, mean over seeds "
                     f"(runs that diverged have none). {_runs_note(runs)} {_device(runs)}.",
                     grid if len(grid) else _nothing("no run trained")),
              _table("lr_sensitivity", "LR sensitivity (Wortsman et al. 2023, §2.2): per seed, the mean over the "
                     "learning-rate grid of min(final val loss, initial val loss) minus the best final val loss "
                     "(a diverged run counts as its initial loss, a truncated run with its last evaluation); lower "
                     f"is more robust. {CI_NOTE} A seed with runs that did not train is listed as incomplete and "
                     "left out.", _or_note(sens, ["variant"], "no run trained"))]
    tables.append(spikes_table("lr_sensitivity_spikes", runs))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    ok = runs[runs["status"].isin(ex.TRAINED)] if len(runs) else runs
    if len(ok):
        sns.lineplot(data=ok, x="lr", y="final_val_loss", hue="variant", marker="o", errorbar=("pi", 100), ax=a)
        a.set_xscale("log")
    a.set_title("final validation loss vs learning rate (band: range over seeds)")
    logit_cols = [c for c in steps.columns if c.startswith("max_logit_l")]
    if logit_cols and len(steps) and len(ok):
        top = steps.assign(max_logit=steps[logit_cols].max(axis=1)).dropna(subset=["max_logit"])
        top = top.merge(ok[["run", "lr"]].rename(columns={"lr": "peak_lr"}), on="run")
        top = top[top["peak_lr"] == top["peak_lr"].max()]
        sns.lineplot(data=top, x="step", y="max_logit", hue="variant", errorbar=("pi", 100), ax=b)
        b.set_yscale("log")
        b.set_title(f"max attention logit over steps at LR {top['peak_lr'].max():g}")
    fig.tight_layout()
    return tables, [fig]


# ---------------------------------------------------------------- FP8

_SPEED_NOTE = ("tokens_per_s: median of the per-step rate after the first 10% of steps, tokens_per_s_iqr its "
               "interquartile range; mfu against the matmul ceiling in peak_flops_source; gpu_sharing: alone / "
               "shared / unchecked (attnbench.train.sharing). Emulated runs claim no speed.")


def fp8_outputs(runs, steps, layers) -> tuple[list[Table], list[plt.Figure]]:
    frame = ex.fp8_frame(runs, steps)
    stats = ex.fp8_stats_frame(runs, steps)
    long = stats.set_index(["variant", "seed"]).T if len(stats) and len(stats.columns) > 2 else pd.DataFrame()
    if len(long):
        long.columns = [f"{v}/s{s}" for v, s in long.columns]
    per_layer = ex.fp8_layers_frame(runs, layers)
    tables = [_table("fp8", "FP8 recipes and a SwiGLU MLP with and without Smooth-SwiGLU (Fishman et al. 2024) "
                     "against the baseline: gap = val loss minus that of the baseline precision's run with the same "
                     "MLP and seed (same initial weights and batches) at the last eval step; band = +- the largest "
                     "distance of a baseline seed from the seeds' mean there (how far another seed moves the loss); "
                     "gap_opens_at_step = the first eval step from which the gap stays outside the band (empty: it "
                     "never does); best_val_loss and best_val_step = the lowest val loss and its step (a later rise "
                     "is memorisation of a corpus seen many times over); train_loss = mean training loss over the "
                     f"last {ex.FP8_TRAIN_WINDOW} steps both runs of a pair logged, train_gap = that minus the "
                     "baseline's (same batches), train_band_high = the largest distance of a baseline seed's mean there "
                     "from the seeds' mean; train_gap_opens_at_step = the last step of the first window of "
                     f"{ex.FP8_TRAIN_WINDOW} steps from which the training-loss gap stays outside the seeds' band over "
                     "the same window (empty: it never does). " + _SPEED_NOTE +
                     f" {_runs_note(runs)} {_device(runs)}.",
                     _or_note(frame, ["variant", "seed"], "no run")),
              _table("fp8_seeds", "Each FP8 variant's gap over the seeds that finished: gap = validation loss at the "
                     "last eval step minus the same-seed baseline's, train_gap = the same over the last "
                     f"{ex.FP8_TRAIN_WINDOW} steps of training loss (both as in fp8); band_high and train_band_high = "
                     "the baseline seeds' spread, the noise a gap is read against; opened = how many seeds' "
                     "validation gap left the band for good, at steps opens_first to opens_last. " + CI_NOTE,
                     _or_note(ex.fp8_seeds_frame(frame), ["variant"], "no FP8 run finished")),
              _table("fp8_contrasts", "Every two FP8 variants of one MLP family (Smooth-SwiGLU with SwiGLU), paired "
                     "by seed (the same initial weights and batches): diff = variant's validation loss at the last "
                     "eval step minus against's, train_diff = the same for the training loss over the last "
                     f"{ex.FP8_TRAIN_WINDOW} steps; an interval that holds zero says these seeds do not tell the two "
                     "recipes apart. " + CI_NOTE,
                     _or_note(ex.fp8_contrasts_frame(frame), ["variant", "against"],
                              "no two FP8 variants of one MLP finished at a common seed")),
              _table("fp8_scales", "Mean over logged steps of FP8 scale statistics per recipe and tensor, summed over "
                     "layers (fp8_<recipe>_<act|weight|grad>_<amax|scale_log2|overflow|underflow>), measured on "
                     "each run's own tensors (attnbench.train.precision); per layer in fp8_layers.",
                     long if len(long) else _nothing("no run logged FP8 statistics")),
              _table("fp8_layers", "Per layer, the input of the MLP's down projection (mlp.proj, where SwiGLU's "
                     "outliers reach an FP8 cast) under each run's own recipe (tensorwise for bf16): amax at the first "
                     "and last record and its largest, the last scale (log2), the largest overflow share and the mean "
                     "underflow share over the run. Every layer and tensor is in fp8_layers.parquet.",
                     _or_note(per_layer, ["variant", "layer"], "no per-layer statistics"))]
    tables.append(spikes_table("fp8_spikes", runs))
    return tables, [_fp8_gap_figure(runs, steps), _fp8_layers_figure(runs, layers)]


def _fp8_gap_figure(runs, steps) -> plt.Figure:
    gaps = ex.fp8_gap_frame(runs, steps)
    if gaps.empty:
        return placeholder("FP8 loss gap", "no run trained")
    seed = runs.set_index("run")["seed"]  # a line style per seed, so a recipe's replicates are told apart
    fig, (val, train) = plt.subplots(1, 2, figsize=(14, 4.5))
    _gap_panel(val, gaps.assign(seed=gaps["run"].map(seed)), "val loss - baseline at the same seed",
               "validation loss, at each eval step", legend=False)
    curve = ex.fp8_train_gap_curve(runs, steps)
    _gap_panel(train, curve.assign(seed=curve["run"].map(seed)), "training loss - baseline at the same seed",
               f"training loss, mean over windows of {ex.FP8_TRAIN_WINDOW} steps", legend=True)
    fig.suptitle("FP8 loss gap over steps against the baseline seeds' noise band")
    fig.tight_layout()
    return fig


def _gap_panel(ax, gaps, ylabel: str, title: str, legend: bool) -> None:
    band = gaps.groupby("step")[["band_low", "band_high"]].first().dropna()
    if len(band):
        ax.fill_between(band.index, band["band_low"], band["band_high"], color="grey", alpha=0.3,
                        label="+- the baseline seeds' largest distance from their mean")
    sns.lineplot(data=gaps, x="step", y="gap", hue="variant", style="seed", units="run", estimator=None, ax=ax,
                 legend=legend)
    ax.axhline(0, color="black", lw=0.5)
    ax.set(ylabel=ylabel, title=title)
    if legend and ax.get_legend():  # none where no pair has a step in common
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1), fontsize=8)


def _fp8_layers_figure(runs, layers) -> plt.Figure:
    if layers.empty:
        return placeholder("FP8 per-layer amax", "no per-layer statistics")
    precision = runs.set_index("run")["precision"]
    sub = layers[layers["layer"].str.endswith("mlp.proj") & (layers["kind"] == "act")]
    sub = sub[sub["recipe"] == sub["run"].map(lambda r: ex.own_recipe(precision.get(r, "bf16")))]
    if sub.empty:
        return placeholder("FP8 per-layer amax", "no mlp.proj statistics")
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.5))
    # a variant with several seeds: their mean, the band their range (errorbar pi 100: no bootstrap, so the same
    # rows draw the same figure)
    sns.lineplot(data=sub, x="step", y="amax", hue="variant", style="layer", errorbar=("pi", 100), ax=a, legend=False)
    a.set_yscale("log")
    a.set_title("amax of the down projection's input per layer")
    sns.lineplot(data=sub, x="step", y="underflow", hue="variant", style="layer", errorbar=("pi", 100), ax=b)
    b.set_title("its underflow share (nonzero values that round to 0)")
    sns.move_legend(b, "upper left", bbox_to_anchor=(1.02, 1), fontsize=7)  # beside both panels, not between
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- layouts


def layouts_outputs(runs, steps) -> tuple[list[Table], list[plt.Figure]]:
    frame = ex.layouts_frame(runs)
    tables = [_table("layouts", "Head layouts at matched parameters (MLP width absorbs the difference): final "
                     "validation loss, throughput and decode KV-cache bytes per token (bf16, all layers; "
                     f"DeepSeek-V2 Table 1). {_SPEED_NOTE} {_device(runs)}.", frame.set_index("variant")),
              spikes_table("layouts_spikes", runs)]
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return tables, [placeholder("Layouts", "no layout trained")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    sns.scatterplot(data=ok, x="tokens_per_s", y="final_val_loss", hue="variant", size="kv_bytes_per_token_bf16",
                    sizes=(60, 400), ax=a)
    a.set_title("final val loss vs tokens/s (size: KV bytes/token)")
    sns.barplot(data=ok, x="variant", y="kv_bytes_per_token_bf16", ax=b)
    b.set_title("KV-cache bytes per token (bf16)")
    fig.tight_layout()
    return tables, [fig]


def _optional(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def experiment_outputs(name: str, exp_dir: str | Path) -> tuple[list[Table], list[Figure]]:
    """The tables and figures of experiment ``name`` from ``exp_dir``'s parquet files."""
    exp_dir = Path(exp_dir)
    runs = read_parquet(exp_dir / "runs.parquet")
    steps = read_parquet(exp_dir / "steps.parquet")
    if name == "divergence":
        tables, figs = divergence_outputs(runs, steps, read_parquet(exp_dir / "divergence.parquet"),
                                          read_parquet(exp_dir / "numerics.parquet"))
    elif name == "fp8":
        tables, figs = fp8_outputs(runs, steps, _optional(exp_dir / "fp8_layers.parquet"))
    else:
        tables, figs = {"lr_sensitivity": lr_outputs, "layouts": layouts_outputs}[name](runs, steps)
    for table in tables:
        table.group = name
    return tables, [Figure(figure, FIGURE_CAPTIONS[figure], fig, group=name) for figure, fig in zip(FIGURES[name], figs)]


def build(experiments: dict[str, Path]) -> StageOutputs:
    """Every experiment's tables and figures (experiment name -> the folder ``attnbench experiment run`` wrote)."""
    outputs = StageOutputs()
    for name, exp_dir in experiments.items():
        tables, figures = experiment_outputs(name, exp_dir)
        outputs.tables += tables
        outputs.figures += figures
    return outputs
