"""The four pretraining experiments: plans (lists of runs), running them, and their result frames.

* ``divergence`` (Golden et al. 2024, "Is Flash Attention Stable?"): runs that differ
  from a reference only in the attention backend, only in the seed, or only in the
  precision (fp16 vs fp32 by default); weight divergence to the reference (max abs,
  relative L2, 1-Wasserstein) at snapshot steps; plus each backend's attention-output
  and gradient error against fp64 at the model's own attention shape
  (:mod:`attnbench.bench.numerics`).
* ``lr_sensitivity`` (Wortsman et al. 2023): final loss against learning rate for each
  variant (default: baseline, and qk-layernorm with z-loss 1e-4), the LR-sensitivity
  score, and the max attention logit over steps.
* ``fp8``: bf16 against the FP8 recipes (torchao tensorwise, rowwise; MXFP8, emulated by
  attnbench where torchao cannot run it): loss gap, spike score, and scale statistics of
  every recipe on every run's tensors.
* ``layouts``: mha/gqa/mqa/mla at matched parameter counts (the MLP width absorbs the
  difference, Shazeer 2019): loss vs tokens/s vs KV bytes/token.

Every experiment is a list of :class:`~attnbench.train.loop.RunSpec` derived from
``pretrain.model`` / ``pretrain.train`` (with ``pretrain.cuda`` merged over them on a
GPU), so one config describes both the CPU default and the GPU scale.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnbench.case import LAYOUTS
from attnbench.failures import classify, first_line
from attnbench.bench.results import write_atomic
from attnbench.errors import ConfigError
from attnbench.models.gpt import GPTConfig, count_params, match_params
from attnbench.train import stability
from attnbench.train.checkpoint import load_weights
from attnbench.train.data import DataConfig
from attnbench.train.loop import RunSpec, TrainConfig, train
from attnbench.train.precision import get_precision

EXPERIMENTS = ("divergence", "lr_sensitivity", "fp8", "layouts")


def base_configs(pre: dict) -> tuple[GPTConfig, TrainConfig, DataConfig]:
    train_cfg = TrainConfig.from_dict(pre["train"])
    model = GPTConfig.from_dict(pre["model"])
    if model.max_seq_len < train_cfg.seq_len:  # precompute RoPE tables for the training length
        model = dataclasses.replace(model, max_seq_len=train_cfg.seq_len)
    return model, train_cfg, DataConfig.from_dict(pre["data"])


def _snapshot_steps(steps: int, count: int) -> tuple[int, ...]:
    return tuple(sorted({int(round(x)) for x in np.linspace(0, steps, count + 1)}))


def plan_runs(pre: dict, name: str) -> list[RunSpec]:
    """The runs of experiment ``name``, from the pretrain section as the run's device sees it
    (:func:`attnbench.plan.device_view`)."""
    if name not in EXPERIMENTS:
        raise ConfigError(f"experiment={name!r} is not known; allowed: {', '.join(EXPERIMENTS)}")
    model, tcfg, data = base_configs(pre)
    exp = pre["experiments"][name]
    return {"divergence": _plan_divergence, "lr_sensitivity": _plan_lr, "fp8": _plan_fp8,
            "layouts": _plan_layouts}[name](model, tcfg, data, exp)


def plan_experiments(pre: dict) -> dict[str, list[RunSpec]]:
    """``pretrain.select``: the chosen experiments, each with its chosen runs; every backend name checked.

    Errors name the key under ``pretrain``. Backends are checked against the registry here, at
    planning time, not when a run starts.
    """
    from attnbench.kernels.registry import backend_names

    known = backend_names()
    try:
        plans = {name: plan_runs(pre, name) for name in pre["select"]["experiments"]}
    except ConfigError as err:
        raise ConfigError(str(err) if str(err).startswith("pretrain.") else f"pretrain.{err}") from None
    names = [s.name for runs in plans.values() for s in runs]
    unknown = sorted(set(pre["select"]["runs"]) - set(names))
    if unknown:
        raise ConfigError(f"pretrain.select.runs: {unknown[0]!r} is not a planned run; allowed: {', '.join(names)}")
    for runs in plans.values():
        for spec in runs:
            for backend in [spec.model.backend, *spec.train.backend_candidates]:
                if backend != "auto" and backend not in known:
                    raise ConfigError(f"pretrain: run {spec.name} names backend={backend!r}, which is not known; "
                                      f"allowed: auto, {', '.join(known)}")
    if pre["select"]["runs"]:
        keep = set(pre["select"]["runs"])
        plans = {name: [s for s in runs if s.name in keep] for name, runs in plans.items()}
        plans = {name: runs for name, runs in plans.items() if runs}
    return plans


def _spec(name: str, model: GPTConfig, tcfg: TrainConfig, data: DataConfig, experiment: str, **tags) -> RunSpec:
    return RunSpec(f"{experiment}/{name}", model, tcfg, data, {"experiment": experiment, **tags})


def _plan_divergence(model, tcfg, data, exp) -> list[RunSpec]:
    ref_backend, *others = exp["backends"]
    seed, swap_seed = exp["seeds"]
    # Uncompiled: Inductor rewrites eager attention into SDPA patterns, which would blur the kernel swap.
    ref_train = dataclasses.replace(tcfg, precision=exp["precision"], seed=seed, compile=False,
                                    snapshot_steps=_snapshot_steps(tcfg.steps, exp["snapshots"]))
    ref_model = dataclasses.replace(model, backend=ref_backend)
    runs = [_spec("reference", ref_model, ref_train, data, "divergence", swap="reference", variant=ref_backend)]
    runs += [_spec(f"backend-{b}", dataclasses.replace(ref_model, backend=b), ref_train, data, "divergence",
                   swap="backend", variant=b) for b in others]
    runs.append(_spec(f"seed-{swap_seed}", ref_model, dataclasses.replace(ref_train, seed=swap_seed), data,
                      "divergence", swap="seed", variant=f"seed {swap_seed}"))
    runs.append(_spec(f"precision-{exp['swap_precision']}", ref_model,
                      dataclasses.replace(ref_train, precision=exp["swap_precision"]), data, "divergence",
                      swap="precision", variant=f"{exp['swap_precision']} vs {exp['precision']}"))
    return runs


def _plan_lr(model, tcfg, data, exp) -> list[RunSpec]:
    runs = []
    for variant, over in exp["variants"].items():
        vmodel = GPTConfig.from_dict({**model.to_dict(), **over.get("model", {})})
        vtrain = TrainConfig.from_dict({**dataclasses.asdict(tcfg), **over.get("train", {})})
        for lr in exp["lrs"]:
            runs.append(_spec(f"{variant}/lr{lr:g}", vmodel, dataclasses.replace(vtrain, lr=float(lr)), data,
                              "lr_sensitivity", variant=variant))
    return runs


def _plan_fp8(model, tcfg, data, exp) -> list[RunSpec]:
    stats = tuple(exp["stats"])
    return [_spec(p, model, dataclasses.replace(tcfg, precision=p, fp8_stats=stats), data, "fp8", variant=p)
            for p in exp["precisions"]]


def _plan_layouts(model, tcfg, data, exp) -> list[RunSpec]:
    configs = {}
    for name, over in exp["layouts"].items():
        values = {**model.to_dict(), "layout": over.get("layout", name), "n_kv_heads": None, "d_ff": model.d_ff,
                  "backend": exp["backend"], **over}
        configs[name] = GPTConfig.from_dict(values)
    if exp["match_params"]:  # a named reference: config mappings may come back key-sorted
        if exp["reference"] not in configs:
            raise ConfigError(f"pretrain.experiments.layouts.reference={exp['reference']!r} is not one of the "
                              f"layouts; allowed: {', '.join(configs)}")
        target = count_params(configs[exp["reference"]])
        configs = {n: match_params(c, target) for n, c in configs.items()}
    return [_spec(n, c, tcfg, data, "layouts", variant=n) for n, c in configs.items()]


# ---------------------------------------------------------------- running


def run_dir(out_dir: str | Path, spec: RunSpec) -> Path:
    return Path(out_dir) / "runs" / spec.name.split("/", 1)[1].replace("/", "__")


def peak_flops_for(device: str, matmul_dtype: str, cache: dict) -> float:
    """The measured matmul ceiling of ``matmul_dtype`` here (:mod:`attnbench.bench.ceilings`), measured once."""
    if matmul_dtype not in cache:
        from attnbench.bench.ceilings import Ceilings, measure_matmul

        rates = {d: measure_matmul(device, d) for d in {matmul_dtype, "fp32"}}
        cache[matmul_dtype] = Ceilings(device, "", math.nan, {k: v for k, v in rates.items() if v == v}
                                       ).peak_flops(matmul_dtype)
    return cache[matmul_dtype]


def run_experiment(job: dict, out_dir: str | Path, *, progress: bool = True,
                   peak_cache: dict | None = None) -> dict[str, pd.DataFrame]:
    """Train every run of an experiment job (``plan/pretrain/<experiment>.json``; finished runs are kept,
    killed ones resume), then write the frames.

    Writes ``steps.parquet`` (every run's step log), ``runs.parquet`` (one summary per
    run) and, for divergence, ``divergence.parquet`` and ``numerics.parquet``. With the job's
    ``time_limit_s``, runs still going at the limit end ``truncated`` (and resume next time);
    runs not started by then are ``skipped`` rows. With ``compile_fallback``, a compiled run that
    raises is run again uncompiled.
    """
    out = Path(out_dir)
    name, device = job["experiment"], job["device"]
    specs = [RunSpec.from_dict(d) for d in job["runs"]]
    cache = {} if peak_cache is None else peak_cache  # matmul ceilings, measured once per process
    limit = job.get("time_limit_s")
    deadline = time.monotonic() + limit if limit else None
    summaries, steps = [], []
    for spec in specs:
        if deadline is not None and time.monotonic() > deadline:
            summaries.append({"run": spec.name, **spec.tags, "status": "skipped",
                              "reason": f"not started: the experiment's time_limit_s={limit:g} had passed"})
            continue
        precision = get_precision(spec.train.precision)
        peak = peak_flops_for(device, precision.matmul_dtype, cache)
        print(f"attnbench experiment {name}: {spec.name}", file=sys.stderr, flush=True)
        summaries.append(_train_guarded(spec, run_dir(out, spec), device, peak, progress, deadline,
                                        job.get("compile_fallback", False)))
        path = run_dir(out, spec) / "steps.parquet"
        if path.is_file():
            steps.append(pd.read_parquet(path).assign(**{k: str(v) for k, v in spec.tags.items()}))
    frames = {"runs": pd.DataFrame(summaries),
              "steps": pd.concat(steps, ignore_index=True) if steps else pd.DataFrame()}
    if name == "divergence":
        frames["divergence"] = divergence_frame(specs, out, device)
        frames["numerics"] = numerics_frame(specs, device)
    for key, frame in frames.items():
        write_atomic(frame, out / f"{key}.parquet")
    return frames


def _train_guarded(spec: RunSpec, folder: Path, device: str, peak: float, progress: bool, deadline: float | None,
                   compile_fallback: bool) -> dict:
    """One run; an exception is a summary row (a failing run never ends the experiment)."""
    try:
        try:
            return train(spec, folder, device, peak_flops=peak, progress=progress, deadline=deadline)
        except Exception as err:
            if not (compile_fallback and spec.train.compile):
                raise
            traceback.print_exc()
            note = f"compiled run failed ({first_line(err)}); ran uncompiled"
            print(f"{spec.name}: {note}", file=sys.stderr, flush=True)
            uncompiled = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=False))
            summary = train(uncompiled, folder, device, peak_flops=peak, progress=progress, deadline=deadline)
            return {**summary, "reason": "; ".join(r for r in (summary.get("reason"), note) if r)}
    except Exception as err:  # one failing run (OOM, a compile error) is a row, not the end of the sweep
        traceback.print_exc()
        return {"run": spec.name, **spec.tags, "status": "error", "reason": first_line(err)}


def divergence_frame(specs: list[RunSpec], out: Path, device: str = "cpu") -> pd.DataFrame:
    """Weight divergence of every swap run to the reference at each snapshot both runs saved (computed on ``device``)."""
    ref = specs[0]
    rows = []
    for spec in specs[1:]:
        for step in ref.train.snapshot_steps:
            a, b = (run_dir(out, s) / "snapshots" / f"{step}.pt" for s in (ref, spec))
            if not (a.is_file() and b.is_file()):
                continue
            div = stability.weight_divergence(load_weights(a), load_weights(b), device)
            rows.append({"run": spec.name, "swap": spec.tags["swap"], "variant": spec.tags["variant"],
                         "step": step, **div})
    return pd.DataFrame(rows, columns=["run", "swap", "variant", "step", "max_abs", "rel_l2", "wasserstein"])


def loss_gaps(runs: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.Series | None, list[tuple[pd.Series, pd.Series]]]:
    """The reference run's summary row, and each swap run's (summary row, per-step train loss minus the reference's).

    The backend and precision swaps see the reference's batches in the reference's order (the training seed sets
    both the initial weights and the batch order; the seed swap changes both), so their per-step difference of
    training loss isolates what the swap changed, at the resolution of the loss rather than the weights (which
    :func:`divergence_frame` compares at snapshots). Steps only one of the two runs logged are left out.
    """
    ref = runs[runs["swap"] == "reference"]
    if ref.empty:
        return None, []
    ref_run = ref.iloc[0]

    def loss(run: pd.Series) -> pd.Series:
        return steps.loc[steps["run"] == run["run"], ["step", "loss"]].set_index("step")["loss"]

    ref_loss = loss(ref_run)
    return ref_run, [(run, (loss(run) - ref_loss).dropna()) for _, run in runs[runs["swap"] != "reference"].iterrows()]


def loss_divergence_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Each swap run's loss against the reference run's (:func:`loss_gaps`): final val-loss gap, RMS and max
    per-step train-loss gap."""
    ref_run, gaps = loss_gaps(runs, steps)
    rows = [{"swap": run["swap"], "variant": run["variant"], "status": run["status"],
             "steps_compared": len(gap), "final_val_loss": run["final_val_loss"],
             "val_loss_gap": run["final_val_loss"] - ref_run["final_val_loss"],
             "train_loss_gap_rms": float((gap ** 2).mean() ** 0.5) if len(gap) else float("nan"),
             "train_loss_gap_max": float(gap.abs().max()) if len(gap) else float("nan")} for run, gap in gaps]
    return pd.DataFrame(rows)


def numerics_frame(specs: list[RunSpec], device: str) -> pd.DataFrame:
    """Each divergence backend's output and gradient error against fp64 at the model's attention shape."""
    from attnbench.bench.numerics import baselines, check_numerics
    from attnbench.kernels.registry import get_backend
    from attnbench.models.gpt import GPT

    ref = specs[0]
    with torch.device("meta"):
        attn = GPT(ref.model).blocks[0].attn
    backends = [s.model.backend for s in specs if s.tags["swap"] in ("reference", "backend")]
    precisions = sorted({s.train.precision for s in specs} & {"fp32", "fp16", "bf16"})
    rows = []
    for precision in precisions:
        case = attn.case(ref.train.batch_size, ref.train.seq_len, precision, "fwd_bwd")
        base = baselines(case, device, seed=ref.train.seed)
        for name in backends:
            backend = get_backend(name)
            row = {"backend": name, "dtype": case.dtype, "case": case.label()}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    res = check_numerics(case, lambda q, k, v: backend.attention(q, k, v, causal=True, scale=case.scale),
                                         device, ref.train.seed, base)
                except Exception as err:  # a backend that cannot run this case is a row with the reason
                    status, reason = classify(err, caught)
                    rows.append({**row, "status": status, "reason": reason})
                    continue
            row.update({"status": "ok", "reason": "", "out_rel_err": res.out.rel_err, "out_max_abs": res.out.max_abs_err})
            for g, e in zip(("dq", "dk", "dv"), res.grads or ()):
                row.update({f"{g}_rel_err": e.rel_err, f"{g}_max_abs": e.max_abs_err})
            rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- result frames for tables


def lr_frame(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(final val loss per variant x LR, LR sensitivity per variant) from the lr_sensitivity summaries."""
    ok = runs[runs["status"].isin(["ok", "diverged"])]
    grid = ok.pivot_table(index="variant", columns="lr", values="final_val_loss", aggfunc="first")
    rows = []
    for variant, sub in ok.groupby("variant"):
        finals = dict(zip(sub["lr"], sub["final_val_loss"]))
        initial = float(sub["initial_val_loss"].median())
        rows.append({"variant": variant, "lr_sensitivity": stability.lr_sensitivity(finals, initial),
                     "best_lr": float(sub.loc[sub["final_val_loss"].idxmin(), "lr"]) if sub["final_val_loss"].notna().any() else math.nan,
                     "best_final_val_loss": float(sub["final_val_loss"].min()),
                     "max_attention_logit": float(sub["max_attention_logit"].max()),
                     "diverged_runs": int((sub["status"] == "diverged").sum())})
    return grid, pd.DataFrame(rows)


def fp8_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per precision: status, loss gap to the first (bf16) run, spike scores, mean scale statistics."""
    base = runs.iloc[0]
    rows = []
    for _, r in runs.iterrows():
        row = {"precision": r["precision"], "status": r["status"], "emulated": r.get("emulated", False),
               "final_val_loss": r.get("final_val_loss", math.nan),
               "loss_gap": r.get("final_val_loss", math.nan) - base.get("final_val_loss", math.nan),
               "spike_score_loss": r.get("spike_score_loss", math.nan),
               "spike_score_grad": r.get("spike_score_grad", math.nan), "tokens_per_s": r.get("tokens_per_s", math.nan),
               "tokens_per_s_iqr": r.get("tokens_per_s_iqr", math.nan),
               "reason": r.get("reason", "")}
        sub = steps[steps["run"] == r["run"]] if len(steps) else steps
        for col in [c for c in sub.columns if c.startswith("fp8_")]:
            row[col] = float(sub[col].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def layouts_frame(runs: pd.DataFrame) -> pd.DataFrame:
    cols = ["variant", "layout", "status", "backend", "params", "kv_cache_elements_per_token",
            "kv_bytes_per_token_bf16", "final_val_loss", "best_val_loss", "tokens_per_s", "tokens_per_s_iqr", "mfu",
            "reason"]
    frame = runs.reindex(columns=cols)
    order = frame["layout"].map({name: i for i, name in enumerate(LAYOUTS)}).fillna(len(LAYOUTS))
    return frame.assign(_order=order).sort_values(["_order", "variant"]).drop(columns="_order")
