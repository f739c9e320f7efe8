"""The four pretraining experiments: plans (lists of runs), running them, and their result frames.

* ``divergence`` (Golden et al. 2024, "Is Flash Attention Stable?"): at every seed, runs that
  differ from a reference in one thing each, and their weight divergence to it at snapshot steps
  (max |W - W_ref|, relative L2, per-tensor W1: :func:`attnbench.train.stability.weight_divergence`)
  and per-step loss gap. Arms (the ``arm`` column):

  - ``replicate``: the reference's own configuration again (the nondeterminism floor; exactly 0
    where the run is deterministic, as on a CPU);
  - ``kernel``: another attention backend at the same precision, against every reference listed
    before it (``references``: sdpa-math, which upcasts fp16/bf16 to fp32 inside, and eager, which
    computes its scores in the input dtype, so a kernel swap is not also a precision swap);
  - ``precision``: the first reference at each of ``swap_precisions`` instead of ``precision``;
  - ``init_seed``: the first reference with ``init_seed + seed_offset`` (same data order);
  - ``data_order``: the first reference with ``data_seed + seed_offset`` (same initial weights).

  Plus each backend's attention-output and gradient error against fp64 at the model's own
  attention shape (:mod:`attnbench.bench.numerics`), joined to its arms.
* ``lr_sensitivity`` (Wortsman et al. 2023, §2.2): final loss against learning rate for each
  variant (default: baseline, and qk-layernorm with z-loss 1e-4) at every seed; the LR sensitivity
  per seed over the whole grid (diverged and truncated runs included) and its interval.
* ``fp8``: bf16 (at every seed: the noise band) against the FP8 recipes (torchao tensorwise, rowwise;
  MXFP8, emulated by attnbench where torchao cannot run it), and a SwiGLU MLP with and without
  Smooth-SwiGLU (Fishman et al. 2024) at ``swiglu_precisions``: loss gap over steps against the
  band, spike scores, and FP8 scale statistics per layer.
* ``layouts``: mha/gqa/mqa/mla at matched parameter counts (the MLP width absorbs the
  difference, Shazeer 2019): loss vs tokens/s vs KV bytes/token.

Every experiment is a list of :class:`~attnbench.train.loop.RunSpec` derived from
``pretrain.model`` / ``pretrain.train`` (with ``pretrain.cuda`` merged over them on a
GPU), so one config describes both the CPU default and the GPU scale. ``pretrain.select.runs``
(names or shell-style patterns) picks the runs a sweep trains now; the experiment's other runs
enter its tables when an earlier sweep finished them, else as ``skipped`` rows. So an experiment
can be trained in parts (one seed at a time) and every part's tables hold everything done so far.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import math
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
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
from attnbench.train.determinism import prepare_process
from attnbench.train.intervals import interval_columns
from attnbench.train.loop import RunSpec, TrainConfig, train
from attnbench.train.precision import get_precision

EXPERIMENTS = ("divergence", "lr_sensitivity", "fp8", "layouts")
TRAINED = ("ok", "diverged", "truncated")  # statuses whose step log and summary hold training results


@dataclass
class ExperimentPlan:
    """An experiment's runs, and the names of those this sweep trains now (``pretrain.select.runs``)."""

    runs: list[RunSpec]
    train: list[str]


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


def selected(names: list[str], patterns: list[str]) -> list[str]:
    """The names matching any of ``patterns`` (exact names or shell-style patterns, ``fnmatch``); all without."""
    if not patterns:
        return list(names)
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def plan_experiments(pre: dict) -> dict[str, ExperimentPlan]:
    """``pretrain.select``: the chosen experiments, each with all its runs and those to train now; every
    backend name checked (the patterns of ``select.runs`` by :func:`check_selected_runs`, against every device).

    Errors name the key under ``pretrain``. Backends are checked against the registry here, at
    planning time, not when a run starts.
    """
    from attnbench.kernels.registry import backend_names

    known = backend_names()
    try:
        plans = {name: plan_runs(pre, name) for name in pre["select"]["experiments"]}
    except ConfigError as err:
        raise ConfigError(str(err) if str(err).startswith("pretrain.") else f"pretrain.{err}") from None
    for runs in plans.values():
        for spec in runs:
            for backend in [spec.model.backend, *spec.train.backend_candidates]:
                if backend != "auto" and backend not in known:
                    raise ConfigError(f"pretrain: run {spec.name} names backend={backend!r}, which is not known; "
                                      f"allowed: auto, {', '.join(known)}")
    return {name: ExperimentPlan(runs, selected([s.name for s in runs], pre["select"]["runs"]))
            for name, runs in plans.items()}


def check_selected_runs(patterns: list[str], planned: list[str]) -> None:
    """Every pattern of ``pretrain.select.runs`` names a run that some device plans: ``planned`` is every device's
    (a CPU host checks the ``cuda`` blocks too, and a run that only the GPU plans is a valid choice; on the device
    that does not plan it, the pattern selects nothing)."""
    for pattern in patterns:
        if not selected(planned, [pattern]):
            shown = ", ".join(planned[:8]) + (", ..." if len(planned) > 8 else "")
            raise ConfigError(f"pretrain.select.runs: {pattern!r} is not a planned run and matches none; allowed: "
                              f"run names or patterns of the selected experiments ({shown}; attnbench experiment list)")


def _spec(name: str, model: GPTConfig, tcfg: TrainConfig, data: DataConfig, experiment: str, **tags) -> RunSpec:
    return RunSpec(f"{experiment}/{name}", model, tcfg, data, {"experiment": experiment, **tags})


def _plan_divergence(model, tcfg, data, exp) -> list[RunSpec]:
    refs = list(exp["references"])
    backends = refs + [k for k in exp["kernels"] if k not in refs]
    precision, offset = exp["precision"], exp["seed_offset"]
    # Uncompiled: Inductor rewrites eager attention into SDPA patterns, which would blur the kernel swap.
    ref_train = dataclasses.replace(tcfg, precision=precision, compile=False,
                                    snapshot_steps=_snapshot_steps(tcfg.steps, exp["snapshots"]))
    runs = []
    for seed in exp["seeds"]:  # seed-major: a sweep cut short leaves whole seeds
        seeded = dataclasses.replace(ref_train, init_seed=seed, data_seed=seed)

        def add(variant, role, compare_to, backend, train_cfg=seeded):
            runs.append(_spec(f"{variant}/s{seed}", dataclasses.replace(model, backend=backend), train_cfg, data,
                              "divergence", variant=variant, role=role, compare_to=",".join(compare_to),
                              seed=seed, backend=backend))

        for b in backends:
            add(b, "reference" if b in refs else "kernel", refs[:refs.index(b)] if b in refs else refs, b)
        for r in refs:
            add(f"{r}-replicate", "replicate", [r], r)
        for p in exp["swap_precisions"]:
            add(f"{refs[0]}-{p}", "precision", [refs[0]], refs[0], dataclasses.replace(seeded, precision=p))
        add(f"{refs[0]}-init", "init_seed", [refs[0]], refs[0], dataclasses.replace(seeded, init_seed=seed + offset))
        add(f"{refs[0]}-data", "data_order", [refs[0]], refs[0], dataclasses.replace(seeded, data_seed=seed + offset))
    return runs


def _plan_lr(model, tcfg, data, exp) -> list[RunSpec]:
    runs = []
    for seed in exp["seeds"]:
        for variant, over in exp["variants"].items():
            vmodel = GPTConfig.from_dict({**model.to_dict(), **over.get("model", {})})
            vtrain = TrainConfig.from_dict({**dataclasses.asdict(tcfg), **over.get("train", {})})
            for lr in exp["lrs"]:
                t = dataclasses.replace(vtrain, lr=float(lr), init_seed=seed, data_seed=seed)
                runs.append(_spec(f"{variant}/lr{lr:g}/s{seed}", vmodel, t, data, "lr_sensitivity", variant=variant,
                                  seed=seed))
    return runs


def _plan_fp8(model, tcfg, data, exp) -> list[RunSpec]:
    stats, seeds = tuple(exp["stats"]), exp["seeds"]
    if exp["replicates"] > len(seeds):
        raise ConfigError(f"pretrain.experiments.fp8.replicates={exp['replicates']} is more than the {len(seeds)} "
                          f"seeds; allowed: 1 to {len(seeds)}")
    replicated = seeds[:exp["replicates"]]
    base, *others = exp["precisions"]

    def spec(variant, mlp_variant, m, precision, seed):
        t = dataclasses.replace(tcfg, precision=precision, fp8_stats=stats, init_seed=seed, data_seed=seed)
        return _spec(f"{variant}/s{seed}", m, t, data, "fp8", variant=variant, mlp_variant=mlp_variant, seed=seed)

    runs = [spec(base, model.mlp, model, base, s) for s in seeds]
    runs += [spec(p, model.mlp, model, p, s) for p in others for s in replicated]
    for smooth in (False, True):
        name = "smooth-swiglu" if smooth else "swiglu"
        m = dataclasses.replace(model, mlp="swiglu", smooth_swiglu=smooth, d_ff=None)
        # Smooth-SwiGLU's power-of-two scales are exact outside FP8 casts: at bf16 it is SwiGLU bit for bit
        # (tests/models/test_gpt.py), one more replicate, so it runs at the FP8 precisions only
        chosen = [p for p in exp["swiglu_precisions"] if not smooth or get_precision(p).fp8_recipe]
        runs += [spec(f"{name}-{p}", name, m, p, s) for p in chosen for s in replicated]
    return runs


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


def ceiling_cache(ceilings, run_device_name: str, path: str = "") -> dict:
    """``{matmul dtype: (FLOP/s, source)}`` from a ceilings file (``attnbench ceilings``, the pipeline's ceilings
    job, which measures under the same GPU lease as every job, so alone on its GPU).

    A ceiling measured on another device model gives no MFU: its rates are NaN with the reason as source.
    """
    from attnbench.train.precision import PRECISIONS

    dtypes = {get_precision(p).matmul_dtype for p in PRECISIONS}
    where = f"ceilings job ({path or 'file'}; {ceilings.device_name}, measured {ceilings.measured_at or '?'})"
    if ceilings.device_name and run_device_name and ceilings.device_name != run_device_name:
        why = f"no MFU: the ceilings were measured on {ceilings.device_name}, this run is on {run_device_name}"
        return {d: (math.nan, why) for d in dtypes}
    return {d: (ceilings.peak_flops(d), where) for d in dtypes}


def peak_flops_for(device: str, matmul_dtype: str, cache: dict) -> tuple[float, str]:
    """(the measured matmul ceiling of ``matmul_dtype`` here, where it was measured); measured once per process
    when no ceilings file gave it (:mod:`attnbench.bench.ceilings`)."""
    if matmul_dtype not in cache:
        from attnbench.bench.ceilings import Ceilings, measure_matmul

        rates = {d: measure_matmul(device, d) for d in {matmul_dtype, "fp32"}}
        rate = Ceilings(device, "", math.nan, {k: v for k, v in rates.items() if v == v}).peak_flops(matmul_dtype)
        cache[matmul_dtype] = (rate, "measured by this job before its runs")
    return cache[matmul_dtype]


def _finished(spec: RunSpec, folder: Path) -> dict | None:
    """The summary of a run an earlier sweep trained with this exact config, if there is one."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("config_hash") == spec.config_hash else None


def run_experiment(job: dict, out_dir: str | Path, *, progress: bool = True,
                   peak_cache: dict | None = None, stop_at: float | None = None) -> dict[str, pd.DataFrame]:
    """Train the job's selected runs (``plan/pretrain/<experiment>.json``: ``runs``, and ``train``, the names to
    train now), then write the frames of every run of the experiment.

    Finished runs are kept and killed ones resume. A run not selected enters the frames if an earlier
    sweep finished it with the same config, else as a ``skipped`` row. Writes ``steps.parquet`` (every
    run's step log), ``runs.parquet`` (one summary per run) and, for divergence, ``divergence.parquet``
    and ``numerics.parquet``, for fp8 ``fp8_layers.parquet``. With the job's ``time_limit_s``, or at
    ``stop_at`` (Unix time: the sweep's deadline) if that comes first, runs still going end ``truncated``
    (and resume next time); runs not started by then are ``skipped`` rows. With ``compile_fallback``, a
    compiled run that raises is run again uncompiled. Divergence writes its numerics before the first run
    and its weight divergence after every run it trains, so a job stopped from outside keeps them; rows
    whose snapshots are gone are kept (:func:`_earlier_divergence`), and a finished run whose snapshots a
    pair still needs trains again (:func:`_runs_to_train_again`).
    """
    out = Path(out_dir)
    name, device = job["experiment"], job["device"]
    specs = [RunSpec.from_dict(d) for d in job["runs"]]
    prepare_process(s.train.deterministic for s in specs)  # before the numerics' and the ceilings' CUDA work
    to_train = set(job.get("train", [s.name for s in specs]))
    cache = {} if peak_cache is None else peak_cache  # matmul ceilings, measured once per process
    limit = job.get("time_limit_s")
    ends = [time.monotonic() + t for t in (limit, None if stop_at is None else stop_at - time.time()) if t is not None]
    deadline = min(ends) if ends else None
    frames, divergence, again = {}, {}, set()
    if name == "divergence":
        frames["numerics"] = _numerics(specs, out, device)
        divergence = _earlier_divergence(specs, out)
        again = _runs_to_train_again(specs, out, divergence, to_train)
    outcomes = {}

    def finished(spec: RunSpec, summary: dict, before: dict | None) -> None:
        outcomes[spec.name] = summary
        if name == "divergence" and (before is None or before.get("status") == "truncated" or spec.name in again):
            update_divergence(specs, out, device, divergence, fresh=spec.name)
            write_atomic(divergence_table(divergence), out / "divergence.parquet")

    starts = []  # (spec, arguments of _start_run, the summary an earlier sweep left) in plan order
    for spec in specs:
        if spec.name in to_train:
            peak, source = peak_flops_for(device, get_precision(spec.train.precision).matmul_dtype, cache)
            starts.append((spec, (name, spec, run_dir(out, spec), device, peak, source, progress, deadline,
                                  job.get("compile_fallback", False), spec.name in again),
                           _finished(spec, run_dir(out, spec))))
    workers = job.get("concurrent_runs", 1)
    if workers > 1 and len(starts) > 1:
        _train_concurrently(starts, workers, finished)
    else:
        for spec, args, before in starts:
            finished(spec, _start_run(*args), before)
    summaries, steps, layers = [], [], []
    for spec in specs:
        folder = run_dir(out, spec)
        summaries.append(outcomes.get(spec.name) or _finished(spec, folder) or {
            "run": spec.name, **spec.tags, "status": "skipped",
            "reason": "not selected by pretrain.select.runs, and no earlier sweep ran it"})
        for file, into in (("steps.parquet", steps), ("fp8_layers.parquet", layers)):
            if summaries[-1].get("status") in TRAINED and (folder / file).is_file():
                into.append(pd.read_parquet(folder / file).assign(**{k: str(v) for k, v in spec.tags.items()}))
    pending = sum(s.get("status") in ("skipped", "truncated") for s in summaries)
    if pending:
        print(f"attnbench experiment {name}: {pending} of {len(specs)} runs are skipped or truncated; finished runs "
              "are kept, so running the job again (with these runs selected) continues them", file=sys.stderr)
    frames.update({"runs": pd.DataFrame(summaries),
                   "steps": pd.concat(steps, ignore_index=True) if steps else pd.DataFrame()})
    if name == "divergence":
        frames["divergence"] = divergence_table(update_divergence(specs, out, device, divergence))
    if name == "fp8":
        frames["fp8_layers"] = pd.concat(layers, ignore_index=True) if layers else pd.DataFrame()
    for key, frame in frames.items():
        write_atomic(frame, out / f"{key}.parquet")
    return frames


def _start_run(experiment: str, spec: RunSpec, folder: Path, device: str, peak: float, source: str, progress: bool,
               deadline: float | None, compile_fallback: bool, again: bool) -> dict:
    """One selected run: trained (:func:`_train_guarded`), or a ``skipped`` row (the earlier sweep's summary
    where there is one) when the deadline (a ``time.monotonic()`` value, the same clock in every process of
    the host) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        return _finished(spec, folder) or {
            "run": spec.name, **spec.tags, "status": "skipped",
            "reason": "not started: the experiment's time limit (time_limit_s, or the sweep's deadline) had passed"}
    print(f"attnbench experiment {experiment}: {spec.name}", file=sys.stderr, flush=True)
    return _train_guarded(spec, folder, device, peak, source, progress, deadline, compile_fallback, again)


def _worker_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def _train_concurrently(starts: list[tuple], workers: int, finished) -> None:
    """Run :func:`_start_run` for each of ``starts`` in ``workers`` processes (spawned: CUDA cannot be forked),
    taken in plan order, calling ``finished(spec, summary, before)`` in this process as each ends. The runs share
    the device, so their speed is not their own (``gpu_sharing`` says so); a worker that dies is an ``error`` row."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, torch.get_num_threads() // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_threads, initargs=(threads,)) as pool:
        running = {pool.submit(_start_run, *args): (spec, before) for spec, args, before in starts}
        for future in as_completed(running):
            spec, before = running[future]
            try:
                summary = future.result()
            except Exception as err:  # the worker process died (out of host memory, a signal)
                summary = {"run": spec.name, **spec.tags, "status": "error",
                           "reason": f"its worker process ended: {first_line(err)}"}
            finished(spec, summary, before)


def _train_guarded(spec: RunSpec, folder: Path, device: str, peak: float, source: str, progress: bool,
                   deadline: float | None, compile_fallback: bool, again: bool = False) -> dict:
    """One run; an exception is a summary row (a failing run never ends the experiment)."""
    kwargs = {"peak_flops": peak, "peak_flops_source": source, "progress": progress, "deadline": deadline,
              "again": again}
    try:
        try:
            return train(spec, folder, device, **kwargs)
        except Exception as err:
            if not (compile_fallback and spec.train.compile):
                raise
            traceback.print_exc()
            note = f"compiled run failed ({first_line(err)}); ran uncompiled"
            print(f"{spec.name}: {note}", file=sys.stderr, flush=True)
            uncompiled = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=False))
            summary = train(uncompiled, folder, device, **kwargs)
            return {**summary, "reason": "; ".join(r for r in (summary.get("reason"), note) if r)}
    except Exception as err:  # one failing run (OOM, a compile error) is a row, not the end of the sweep
        traceback.print_exc()
        return {"run": spec.name, **spec.tags, "status": "error", "reason": first_line(err)}


# ---------------------------------------------------------------- divergence

ARM_OF_ROLE = {"reference": "kernel", "kernel": "kernel", "replicate": "replicate", "precision": "precision",
               "init_seed": "init_seed", "data_order": "data_order"}
ARMS = ("replicate", "kernel", "precision", "init_seed", "data_order")
DIVERGENCE_COLUMNS = ["arm", "label", "reference", "variant", "seed", "step", *stability.DIVERGENCE_METRICS,
                      "config_hash", "reference_config_hash"]


def _label(arm: str, variant: str, reference: str, row: dict, ref_row: dict) -> str:
    if arm == "replicate":
        return f"{reference} replicate"
    if arm == "kernel":
        return f"{row.get('backend', variant)} vs {reference}"
    if arm == "precision":
        return f"{row.get('precision')} vs {ref_row.get('precision')} ({reference})"
    if arm in ("init_seed", "data_order"):
        return f"{'init seed' if arm == 'init_seed' else 'data order'} swap ({reference})"
    return f"{variant} vs {reference}"  # a role this module does not plan (rows of an older layout): its own arm


def divergence_pairs(rows: list[dict]) -> list[dict]:
    """Every (reference run, swap run) pair of a divergence experiment, per seed, from the runs' tags
    (``variant``, ``role``, ``compare_to``, ``seed``) and precisions: arm, label, reference, variant, seed,
    and the two run names."""
    by_key = {(r["variant"], int(r["seed"])): r for r in rows}
    pairs = []
    for r in rows:
        for ref in [c for c in str(r.get("compare_to") or "").split(",") if c]:
            ref_row = by_key.get((ref, int(r["seed"])))
            if ref_row is None:
                continue
            arm = ARM_OF_ROLE.get(r["role"], r["role"])
            pairs.append({"arm": arm, "label": _label(arm, r["variant"], ref, r, ref_row), "reference": ref,
                          "variant": r["variant"], "seed": int(r["seed"]), "run": r["run"],
                          "reference_run": ref_row["run"]})
    return pairs


def _spec_rows(specs: list[RunSpec]) -> list[dict]:
    return [{"run": s.name, **s.tags, "precision": s.train.precision} for s in specs]


def _identities(specs: list[RunSpec], out: Path) -> dict[str, str | None]:
    """Each run's identity hash (:func:`attnbench.train.loop.run_identity`) as its ``run.json`` records it, None
    before it first trained."""
    files = {s.name: run_dir(out, s) / "run.json" for s in specs}
    return {name: json.loads(p.read_text()).get("config_hash") if p.is_file() else None for name, p in files.items()}


def _key(pair: dict, step) -> tuple:
    """One divergence row's identity: a swap run (variant, seed) against its reference at a snapshot step."""
    return pair["variant"], pair["reference"], int(pair["seed"]), int(step)


def _snapshot(spec: RunSpec, out: Path, step: int) -> Path:
    return run_dir(out, spec) / "snapshots" / f"{step}.pt"


def _earlier_divergence(specs: list[RunSpec], out: Path) -> dict[tuple, dict]:
    """The rows of the experiment's ``divergence.parquet`` whose two runs still have the identity hashes they were
    computed from, by (variant, reference, seed, step). Snapshots (43 MB each at the GPU scale) stay on the machine
    that trained the runs, and a lease's pack leaves them out, so these rows are what a sweep continued on another
    machine keeps of the pairs it cannot compute again."""
    path = out / "divergence.parquet"
    if not path.is_file():
        return {}
    frame = pd.read_parquet(path)
    if not {"config_hash", "reference_config_hash"} <= set(frame.columns):
        return {}  # rows of a layout that did not record their runs: nothing to check them against
    identity = _identities(specs, out)
    pairs = {(p["variant"], p["reference"], p["seed"]): p for p in divergence_pairs(_spec_rows(specs))}
    kept = {}
    for row in frame.to_dict("records"):
        key = _key(row, row["step"])
        pair = pairs.get(key[:3])
        if pair and (row["config_hash"], row["reference_config_hash"]) == (
                identity[pair["run"]], identity[pair["reference_run"]]):
            kept[key] = row
    return kept


def _runs_to_train_again(specs: list[RunSpec], out: Path, earlier: dict[tuple, dict], to_train: set[str]) -> set[str]:
    """Finished runs to train again, from step 0: those whose snapshot at a step is gone (left on the machine that
    trained them) while a pair of runs both trained now or ``ok`` has no row at that step. A pair with a run that
    failed, diverged or is not selected now is left as it is."""
    by_name = {s.name: s for s in specs}
    status = {s.name: (_finished(s, run_dir(out, s)) or {}).get("status") for s in specs}
    again = set()
    for pair in divergence_pairs(_spec_rows(specs)):
        runs = (pair["run"], pair["reference_run"])
        if not all(r in to_train and status[r] in ("ok", "truncated", None) for r in runs):
            continue
        for step in by_name[pair["reference_run"]].train.snapshot_steps:
            if _key(pair, step) not in earlier:
                again.update(r for r in runs if status[r] == "ok" and not _snapshot(by_name[r], out, step).is_file())
    return again


def update_divergence(specs: list[RunSpec], out: Path, device: str, rows: dict[tuple, dict],
                      fresh: str | None = None) -> dict[tuple, dict]:
    """Add to ``rows`` (by :func:`_key`) the weight divergence at each snapshot step both runs of a pair saved
    (on ``device``), with both runs' identity hashes: every step of the pairs of run ``fresh`` (just trained, so
    its earlier rows are replaced), and the steps ``rows`` lacks of every other pair. Returns ``rows``."""
    by_name, identity = {s.name: s for s in specs}, _identities(specs, out)
    load = functools.lru_cache(maxsize=16)(load_weights)  # references recur; weights only, never code
    for pair in sorted(divergence_pairs(_spec_rows(specs)), key=lambda p: p["reference_run"]):
        ref, other = by_name[pair["reference_run"]], by_name[pair["run"]]
        renew = fresh in (ref.name, other.name)
        hashes = {"config_hash": identity[other.name], "reference_config_hash": identity[ref.name]}
        for step in ref.train.snapshot_steps:
            a, b = (_snapshot(s, out, step) for s in (ref, other))
            if (renew or _key(pair, step) not in rows) and a.is_file() and b.is_file():
                div = stability.weight_divergence(load(a), load(b), device)
                rows[_key(pair, step)] = ({k: pair[k] for k in ("arm", "label", "reference", "variant", "seed")}
                                          | {"step": step, **div, **hashes})
    return rows


def divergence_table(rows: dict[tuple, dict]) -> pd.DataFrame:
    """``divergence.parquet``: the rows of :func:`update_divergence`, by reference, variant, seed and step."""
    frame = pd.DataFrame(list(rows.values()), columns=DIVERGENCE_COLUMNS)
    return frame.sort_values(["reference", "variant", "seed", "step"], ignore_index=True)


def _loss(steps: pd.DataFrame, run: str) -> pd.Series:
    if steps.empty:
        return pd.Series(dtype=float)
    return steps.loc[steps["run"] == run, ["step", "loss"]].set_index("step")["loss"]


def loss_divergence_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per pair and seed: final val-loss gap (swap minus reference), RMS and largest per-step train-loss gap over
    the steps both logged, and the statuses of the two runs.

    Every swap but the data-order swap sees the reference's batches in the reference's order, so the
    per-step difference of training loss isolates what the swap changed, at the resolution of the loss
    rather than the weights (compared at snapshots by :func:`update_divergence`).
    """
    cols = ["arm", "label", "reference", "variant", "seed", "status", "reason", "steps_compared", "final_val_loss",
            "val_loss_gap", "train_loss_gap_rms", "train_loss_gap_max"]
    if runs.empty or "role" not in runs:
        return pd.DataFrame(columns=cols)
    by_run = {r["run"]: r for r in runs.to_dict("records")}
    rows = []
    for pair in divergence_pairs(list(by_run.values())):
        run, ref = by_run[pair["run"]], by_run[pair["reference_run"]]
        bad = [r for r in (run, ref) if r.get("status") not in TRAINED]
        gap = (_loss(steps, run["run"]) - _loss(steps, ref["run"])).dropna()
        rows.append({**{k: pair[k] for k in ("arm", "label", "reference", "variant", "seed")},
                     "status": bad[0]["status"] if bad else "ok",
                     "reason": f"{bad[0]['variant']}: {bad[0].get('reason', '')}" if bad else "",
                     "steps_compared": len(gap), "final_val_loss": run.get("final_val_loss", math.nan),
                     "val_loss_gap": run.get("final_val_loss", math.nan) - ref.get("final_val_loss", math.nan),
                     "train_loss_gap_rms": float((gap ** 2).mean() ** 0.5) if len(gap) else math.nan,
                     "train_loss_gap_max": float(gap.abs().max()) if len(gap) else math.nan})
    return pd.DataFrame(rows, columns=cols)


def divergence_summary(div: pd.DataFrame, loss: pd.DataFrame) -> pd.DataFrame:
    """One row per arm and label: intervals across seeds (:mod:`attnbench.train.intervals`) of the weight
    divergence at the last snapshot every seed reached, of the paper's max |W - W_ref| over all snapshots,
    and of the loss gaps; the replicate floor of the same reference beside the kernel and precision arms."""
    rows = []
    for (arm, label), pairs in loss.groupby(["arm", "label"], sort=False):
        ok = pairs[pairs["status"] == "ok"]
        row = {"arm": arm, "label": label, "reference": pairs["reference"].iloc[0], "seeds_planned": len(pairs),
               "seeds_ok": len(ok), "status": "ok" if len(ok) else pairs["status"].iloc[0],
               "reason": "; ".join(sorted(set(r for r in pairs["reason"] if r)))}
        sub = div[(div["arm"] == arm) & (div["label"] == label) & div["seed"].isin(ok["seed"])]
        if len(sub):
            last = int(sub.groupby("seed")["step"].max().min())
            at = sub[sub["step"] == last]
            row["step"] = last
            for metric in stability.DIVERGENCE_METRICS:
                row.update(interval_columns(metric, at[metric]))
            row.update(interval_columns("max_abs_over_steps", sub.groupby("seed")["max_abs"].max()))
            row["identical"] = bool((sub[list(stability.DIVERGENCE_METRICS)] == 0).all().all())
        row.update(interval_columns("val_loss_gap", ok["val_loss_gap"]))
        row.update(interval_columns("train_loss_gap_rms", ok["train_loss_gap_rms"]))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty or "rel_l2_mean" not in frame:
        return frame
    floors = frame[frame["arm"] == "replicate"].set_index("reference")["rel_l2_mean"]
    frame["replicate_rel_l2"] = frame["reference"].map(floors)
    with np.errstate(divide="ignore", invalid="ignore"):
        frame["over_replicate"] = frame["rel_l2_mean"] / frame["replicate_rel_l2"]
    order = {a: i for i, a in enumerate(ARMS)}
    frame = frame.assign(_o=frame["arm"].map(order).fillna(len(ARMS)))
    return frame.sort_values(["_o", "label"], kind="stable").drop(columns="_o")


def _numerics_cases(specs: list[RunSpec]) -> list[tuple[str, str]]:
    """The (backend, precision) pairs the divergence runs trained with (the precision swaps train only their
    reference), in plan order."""
    return list(dict.fromkeys((s.model.backend, s.train.precision) for s in specs
                              if s.train.precision in ("fp32", "fp16", "bf16")))


def _numerics(specs: list[RunSpec], out: Path, device: str) -> pd.DataFrame:
    """The experiment's ``numerics.parquet`` where an earlier job wrote every (backend, dtype) it needs (those
    rows), else :func:`numerics_frame`, written at once (a job stopped from outside keeps it)."""
    path = out / "numerics.parquet"
    needed = set(_numerics_cases(specs))
    if path.is_file():
        earlier = pd.read_parquet(path)
        have = list(zip(earlier["backend"], earlier["dtype"]))
        if set(have) >= needed:
            return earlier[[pair in needed for pair in have]].reset_index(drop=True)
    frame = numerics_frame(specs, device)
    write_atomic(frame, path)
    return frame


def numerics_frame(specs: list[RunSpec], device: str) -> pd.DataFrame:
    """Each divergence backend's output and gradient error against fp64 at the model's attention shape, in each
    precision its runs trained in (:func:`_numerics_cases`; the same inputs for every backend); a backend that
    cannot run a case is a row with the reason."""
    from attnbench.bench.numerics import baselines, check_numerics
    from attnbench.kernels.registry import get_backend, safe_available
    from attnbench.models.gpt import GPT

    ref = specs[0]
    with torch.device("meta"):
        attn = GPT(dataclasses.replace(ref.model, backend="sdpa-math")).blocks[0].attn
    cases = _numerics_cases(specs)
    rows = []
    for precision in sorted({p for _, p in cases}):
        case = attn.case(ref.train.batch_size, ref.train.seq_len, precision, "fwd_bwd")
        base = baselines(case, device, seed=ref.train.init_seed)
        for name in [b for b, p in cases if p == precision]:
            backend = get_backend(name)
            row = {"backend": name, "dtype": case.dtype, "case": case.label()}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    ok, why = safe_available(backend)
                    if not ok:
                        rows.append({**row, "status": "unavailable", "reason": why})
                        continue
                    ok, why = backend.supports(case)
                    if not ok:
                        rows.append({**row, "status": "unsupported", "reason": why})
                        continue
                    res = check_numerics(case, lambda q, k, v: backend.attention(q, k, v, causal=True, scale=case.scale),
                                         device, ref.train.init_seed, base)
                except Exception as err:  # a backend that cannot run this case is a row with the reason
                    status, reason = classify(err, caught)
                    rows.append({**row, "status": status, "reason": reason})
                    continue
            row.update({"status": "ok", "reason": "", "out_rel_err": res.out.rel_err, "out_max_abs": res.out.max_abs_err})
            for g, e in zip(("dq", "dk", "dv"), res.grads or ()):
                row.update({f"{g}_rel_err": e.rel_err, f"{g}_max_abs": e.max_abs_err})
            rows.append(row)
    return pd.DataFrame(rows)


def kernel_training_frame(summary: pd.DataFrame, numerics: pd.DataFrame, precision: str) -> pd.DataFrame:
    """Per kernel arm: the backend's and its reference's per-call fp64 error at the model's attention shape in the
    divergence precision, beside the arm's weight divergence and loss-gap intervals and the reference's replicate
    floor (one table: kernel numerics joined to training)."""
    if summary.empty:
        return pd.DataFrame()
    kernel = summary[summary["arm"] == "kernel"]
    num = numerics[numerics["dtype"] == precision].set_index("backend") if len(numerics) else pd.DataFrame()
    rows = []
    for _, arm in kernel.iterrows():
        backend = arm["label"].split(" vs ")[0]
        row = {"backend": backend, "reference": arm["reference"], "dtype": precision}
        for who, name in (("", backend), ("reference_", arm["reference"])):
            if name in num.index:
                n = num.loc[name]
                row[f"{who}out_rel_err"] = n.get("out_rel_err", math.nan)
                row[f"{who}dq_rel_err"] = n.get("dq_rel_err", math.nan)
                if not who and n.get("status") != "ok":
                    row["numerics_status"] = f"{n.get('status')}: {n.get('reason', '')}"
        for col in ("rel_l2_mean", "rel_l2_ci_low", "rel_l2_ci_high", "replicate_rel_l2", "over_replicate",
                    "val_loss_gap_mean", "val_loss_gap_ci_low", "val_loss_gap_ci_high", "seeds_ok", "status",
                    "reason"):
            row[col] = arm.get(col, math.nan)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if {"out_rel_err", "reference_out_rel_err"} <= set(frame):
        frame.insert(5, "out_err_ratio", frame["out_rel_err"] / frame["reference_out_rel_err"])
    return frame


# ---------------------------------------------------------------- LR sensitivity


def lr_frame(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(mean final val loss per variant x LR over seeds, LR sensitivity per variant: per-seed values and their
    interval) from the lr_sensitivity summaries.

    Per (variant, seed) the sensitivity is Wortsman et al.'s over every LR of the grid that trained
    (:func:`attnbench.train.stability.lr_sensitivity`: a diverged run counts as its initial loss, a
    truncated run with its last evaluation); a seed whose grid has runs that did not train (skipped,
    error, unavailable) is marked incomplete and left out of the interval.
    """
    if runs.empty or "lr" not in runs:
        return pd.DataFrame(), pd.DataFrame()
    trained = runs[runs["status"].isin(TRAINED)]
    grid = trained.pivot_table(index="variant", columns="lr", values="final_val_loss", aggfunc="mean")
    rows = []
    for variant, sub in runs.groupby("variant", sort=False):
        per_seed, incomplete = [], []
        for seed, one in sub.groupby("seed"):
            done = one[one["status"].isin(TRAINED)]
            if len(done) < len(one) or done.empty:
                incomplete.append(str(seed))
                continue
            per_seed.append(stability.lr_sensitivity(dict(zip(done["lr"], done["final_val_loss"])),
                                                     float(done["initial_val_loss"].median())))
        t = sub[sub["status"].isin(TRAINED)]
        mean_final = t.groupby("lr")["final_val_loss"].mean() if len(t) else pd.Series(dtype=float)
        rows.append({"variant": variant, **interval_columns("lr_sensitivity", per_seed),
                     "lr_sensitivity_per_seed": ", ".join(f"{v:.4g}" for v in per_seed),
                     "incomplete_seeds": ", ".join(incomplete), "lrs": int(sub["lr"].nunique()),
                     "best_lr": float(mean_final.idxmin()) if mean_final.notna().any() else math.nan,
                     "best_final_val_loss": float(mean_final.min()) if len(mean_final) else math.nan,
                     "max_attention_logit": float(t["max_attention_logit"].max()) if len(t) else math.nan,
                     "diverged_runs": int((sub["status"] == "diverged").sum()),
                     "truncated_runs": int((sub["status"] == "truncated").sum())})
    return grid, pd.DataFrame(rows)


# ---------------------------------------------------------------- FP8


FP8_TRAIN_WINDOW = 100  # logged steps per window whose mean training losses fp8_train_gap_curve compares


def _baseline_precision(rows: pd.DataFrame) -> str:
    """The FP8 experiment's baseline precision: the first of ``precisions``, so the first row of its runs (and of
    :func:`fp8_frame`, which keeps their order)."""
    return rows["precision"].iloc[0]


def _mlp_family(mlp_variant: pd.Series) -> pd.Series:
    """The MLP each variant computes outside the FP8 casts: Smooth-SwiGLU (Fishman et al. 2024) is SwiGLU with
    per-channel scales that cancel, so ``smooth-swiglu`` is of the ``swiglu`` family."""
    return mlp_variant.str.removeprefix("smooth-")


def _finished_fp8(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`fp8_frame` that finished (status ``ok``) at an FP8 precision, the baseline's left out."""
    return frame[(frame["status"] == "ok") & (frame["precision"] != _baseline_precision(frame))]


def _fp8_pairs(runs: pd.DataFrame) -> tuple[dict[str, str], list[str]]:
    """(each trained run's baseline run, the baseline seeds' runs).

    The baseline of a run is the run at the first precision with the same MLP and the same seed (the
    same initial weights and batch order, so the difference is the recipe's; a Smooth-SwiGLU run is
    paired with the SwiGLU run when it has none of its own, the same function outside FP8 casts),
    else the base model's run at that seed. The baseline seeds are the first precision's runs on the
    base model, one per seed: how far they lie apart is how far another seed moves the loss.
    """
    trained = runs[runs["status"].isin(TRAINED)]
    if trained.empty:
        return {}, []
    base_precision, base_mlp = _baseline_precision(runs), runs["mlp_variant"].iloc[0]
    at_base = trained[trained["precision"] == base_precision]
    family, trained_family = _mlp_family(at_base["mlp_variant"]), _mlp_family(trained["mlp_variant"])
    pairs = {}
    for i, r in trained.iterrows():
        same_seed = at_base["seed"] == r["seed"]
        candidates = [at_base[same_seed & (at_base["mlp_variant"] == r["mlp_variant"])],
                      at_base[same_seed & (family == trained_family.loc[i])],
                      at_base[same_seed & (at_base["mlp_variant"] == base_mlp)]]
        ref_run = next((c["run"].iloc[0] for c in candidates if len(c)), None)
        if ref_run is not None:
            pairs[r["run"]] = ref_run
    return pairs, at_base[at_base["mlp_variant"] == base_mlp]["run"].tolist()


def fp8_gap_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per eval step and run: val loss minus its baseline's (:func:`_fp8_pairs`), beside the baseline seeds'
    noise band: at each eval step, +- the largest distance of a baseline seed from their mean. A gap outside it
    is an effect larger than the seed's."""
    cols = ["run", "variant", "step", "val_loss", "baseline", "gap", "band_low", "band_high"]
    if steps.empty or "val_loss" not in steps or runs.empty:
        return pd.DataFrame(columns=cols)
    pairs, seeds = _fp8_pairs(runs)
    val = steps.dropna(subset=["val_loss"])[["run", "step", "val_loss"]]
    curves = val[val["run"].isin(seeds)].pivot_table(index="step", columns="run", values="val_loss")
    half = curves.sub(curves.mean(axis=1), axis=0).abs().max(axis=1)
    band = pd.DataFrame({"band_low": -half, "band_high": half})
    rows = []
    for run, ref_run in pairs.items():
        own = val[val["run"] == run].set_index("step")["val_loss"]
        ref = val[val["run"] == ref_run].set_index("step")["val_loss"]
        frame = pd.DataFrame({"val_loss": own, "baseline": ref}).dropna().join(band, how="left")
        frame["gap"] = frame["val_loss"] - frame["baseline"]
        variant = runs.loc[runs["run"] == run, "variant"].iloc[0]
        rows.append(frame.reset_index().rename(columns={"index": "step"}).assign(run=run, variant=variant))
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def fp8_train_gap_curve(runs: pd.DataFrame, steps: pd.DataFrame, window: int = FP8_TRAIN_WINDOW) -> pd.DataFrame:
    """Per run and window of ``window`` consecutive steps that it and its baseline (:func:`_fp8_pairs`: the same
    batches) both logged, counted back from their last common step (``step`` is a window's last): its mean
    training loss, that minus the baseline's (``gap``), and the band, +- the largest distance of a baseline seed's
    mean over the window from the seeds' mean. Where validation data is seen many times over (a small corpus, a
    long run), validation loss measures memorisation; the training loss says how well each recipe fits what it
    saw, and :func:`gap_opens` over these windows says from when its gap is larger than another seed's."""
    cols = ["run", "variant", "step", "train_loss", "gap", "band_low", "band_high"]
    if steps.empty or "loss" not in steps or runs.empty:
        return pd.DataFrame(columns=cols)
    pairs, seeds = _fp8_pairs(runs)
    loss = steps.pivot_table(index="step", columns="run", values="loss")
    variant = runs.set_index("run")["variant"]
    rows = []
    for run, ref_run in pairs.items():
        common = loss[[run, ref_run]].dropna().index  # both logged: a truncated pair's common steps
        back = (len(common) - 1 - np.arange(len(common))) // window  # 0: the last window
        mean = loss.loc[common].groupby(back).mean()  # every run's mean over each window, seeds included
        half = mean[seeds].sub(mean[seeds].mean(axis=1), axis=0).abs().max(axis=1)
        rows.append(pd.DataFrame({"run": run, "variant": variant[run],
                                  "step": pd.Series(common, index=back).groupby(level=0).max(),
                                  "train_loss": mean[run], "gap": mean[run] - mean[ref_run],
                                  "band_low": -half, "band_high": half}).sort_values("step"))
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def fp8_train_gap_frame(runs: pd.DataFrame, steps: pd.DataFrame, window: int = FP8_TRAIN_WINDOW) -> pd.DataFrame:
    """Per run, the last window of :func:`fp8_train_gap_curve`: mean training loss over the last ``window`` steps
    both runs of its pair logged, its gap to the baseline, and the seeds' band there."""
    return _last_windows(fp8_train_gap_curve(runs, steps, window))


def _last_windows(curve: pd.DataFrame) -> pd.DataFrame:
    last = curve.groupby("run", sort=False).tail(1).rename(columns={"gap": "train_gap", "band_high": "train_band_high"})
    return last[["run", "train_loss", "train_gap", "train_band_high"]].reset_index(drop=True)


def gap_opens(gaps: pd.DataFrame) -> float:
    """The first step of ``gaps`` (eval steps, or the last steps of training-loss windows) from which the gap stays
    outside the band at every later one; NaN if it never leaves (or is back inside at the last)."""
    g = gaps.sort_values("step")
    outside = ((g["gap"] < g["band_low"]) | (g["gap"] > g["band_high"])).to_numpy()
    if not len(outside) or not outside[-1]:
        return math.nan
    inside = np.flatnonzero(~outside)
    return float(g["step"].iloc[inside[-1] + 1] if len(inside) else g["step"].iloc[0])


def fp8_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: status, final val loss, its gap to its baseline (:func:`fp8_gap_frame`) with the band at the last
    eval step, the step the gap opens at (:func:`gap_opens`), the lowest val loss and its step, the training-loss
    gap (:func:`fp8_train_gap_frame`) and the step it opens at over :func:`fp8_train_gap_curve`'s windows, spike
    scores, speed and whether the GPU was its own."""
    gaps = fp8_gap_frame(runs, steps)
    curve = fp8_train_gap_curve(runs, steps)
    train = _last_windows(curve).set_index("run")
    val = steps.dropna(subset=["val_loss"]) if "val_loss" in steps else pd.DataFrame(columns=["run", "step"])
    rows = []
    for _, r in runs.iterrows():
        g = gaps[gaps["run"] == r["run"]]
        last = g.sort_values("step").iloc[-1] if len(g) else None
        own_val = val[val["run"] == r["run"]]
        best = own_val.loc[own_val["val_loss"].idxmin()] if len(own_val) else None
        fit = train.loc[r["run"]] if r["run"] in train.index else None
        own_curve = curve[curve["run"] == r["run"]]
        rows.append({"variant": r.get("variant"), "seed": r.get("seed"), "precision": r.get("precision"),
                     "mlp": r.get("mlp_variant"), "status": r["status"], "emulated": r.get("emulated", False),
                     "final_val_loss": r.get("final_val_loss", math.nan),
                     "gap": last["gap"] if last is not None else math.nan,
                     "band_low": last["band_low"] if last is not None else math.nan,
                     "band_high": last["band_high"] if last is not None else math.nan,
                     "gap_opens_at_step": gap_opens(g) if len(g) else math.nan,
                     "best_val_loss": best["val_loss"] if best is not None else math.nan,
                     "best_val_step": best["step"] if best is not None else math.nan,
                     "train_loss": fit["train_loss"] if fit is not None else math.nan,
                     "train_gap": fit["train_gap"] if fit is not None else math.nan,
                     "train_band_high": fit["train_band_high"] if fit is not None else math.nan,
                     "train_gap_opens_at_step": gap_opens(own_curve) if len(own_curve) else math.nan,
                     "steps_done": r.get("steps_done", math.nan),
                     "spike_score_olmo2_paper_loss": r.get("spike_score_olmo2_paper_loss", math.nan),
                     "spike_score_olmo_core_any": r.get("spike_score_olmo_core_any", math.nan),
                     "tokens_per_s": r.get("tokens_per_s", math.nan),
                     "tokens_per_s_iqr": r.get("tokens_per_s_iqr", math.nan),
                     "mfu": r.get("mfu", math.nan), "gpu_sharing": r.get("gpu_sharing", ""),
                     "reason": r.get("reason", "")})
    return pd.DataFrame(rows)


def fp8_seeds_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per FP8 variant, its gaps over the seeds that finished (rows of :func:`fp8_frame`, status ``ok``): the mean
    validation- and training-loss gap with Student-t intervals (:mod:`attnbench.train.intervals`), the baseline
    seeds' bands beside them, and the earliest and latest step at which a seed's gap opened (a seed whose gap never
    opens counts as not opened: ``opened`` says how many did)."""
    if frame.empty:
        return pd.DataFrame()
    done = _finished_fp8(frame)
    done = done[done["gap"].notna()]
    rows = []
    for variant, sub in done.groupby("variant", sort=False):
        opens = sub["gap_opens_at_step"].dropna()
        rows.append({"variant": variant, "precision": sub["precision"].iloc[0], "mlp": sub["mlp"].iloc[0],
                     "seeds": ",".join(str(s) for s in sorted(sub["seed"])),
                     **interval_columns("gap", sub["gap"]), "band_high": sub["band_high"].max(),
                     **interval_columns("train_gap", sub["train_gap"]), "train_band_high": sub["train_band_high"].max(),
                     "opened": len(opens), "opens_first": opens.min() if len(opens) else math.nan,
                     "opens_last": opens.max() if len(opens) else math.nan})
    return pd.DataFrame(rows)


def fp8_contrasts_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every two FP8 variants of one MLP family (SwiGLU and Smooth-SwiGLU are one: the same function outside the
    casts), paired by seed over the seeds both finished (rows of :func:`fp8_frame`, status ``ok``): ``variant``'s
    validation loss at the last eval step minus ``against``'s, and its training loss over the last window minus
    ``against``'s, each as a mean with a Student-t interval (:mod:`attnbench.train.intervals`). A seed fixes the
    initial weights and the batches, so each difference is the recipes' alone, and the interval is the paired
    one: unlike the two variants' own gap intervals side by side, it leaves out the spread the seeds share."""
    if frame.empty:
        return pd.DataFrame()
    done = _finished_fp8(frame)
    rows = []
    for family, sub in done.groupby(_mlp_family(done["mlp"]), sort=False):
        loss = sub.pivot_table(index="seed", columns="variant", values=["final_val_loss", "train_loss"])
        order = list(dict.fromkeys(sub["variant"]))  # the experiment's order: each variant against those before it
        for i, against in enumerate(order):
            for variant in order[i + 1:]:
                both = loss[[("final_val_loss", variant), ("final_val_loss", against)]].dropna().index
                if not len(both):
                    continue
                val = loss.loc[both, "final_val_loss"]
                train = loss.loc[both, "train_loss"]
                rows.append({"variant": variant, "against": against, "mlp": family,
                             "seeds": ",".join(str(s) for s in both),
                             **interval_columns("diff", val[variant] - val[against]),
                             **interval_columns("train_diff", train[variant] - train[against])})
    return pd.DataFrame(rows)


def fp8_stats_frame(runs: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Mean over the logged steps of every ``fp8_<recipe>_<kind>_<stat>`` column, per run (summed over layers)."""
    rows = []
    for _, r in runs.iterrows():
        sub = steps[steps["run"] == r["run"]] if len(steps) else steps
        row = {"variant": r.get("variant"), "seed": r.get("seed")}
        for col in [c for c in sub.columns if c.startswith("fp8_")]:
            row[col] = float(sub[col].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def own_recipe(precision: str) -> str:
    """The scale-statistics recipe of a run's own precision (tensorwise for bf16: the recipe it is compared with)."""
    return {"fp8-rowwise": "rowwise", "mxfp8": "mxfp8"}.get(precision, "tensorwise")


def fp8_layers_frame(runs: pd.DataFrame, layers: pd.DataFrame, module: str = "mlp.proj", kind: str = "act"
                     ) -> pd.DataFrame:
    """Per run and layer, the ``kind`` tensor of every ``module`` Linear under the run's own recipe: amax at the first
    and last record and its largest, the last scale (log2), the largest overflow share, the mean underflow share."""
    if layers.empty:
        return pd.DataFrame()
    precision = runs.set_index("run")["precision"] if "precision" in runs else pd.Series(dtype=str)
    rows = []
    for (run, layer), sub in layers[layers["layer"].str.endswith(module) & (layers["kind"] == kind)].groupby(
            ["run", "layer"], sort=False):
        sub = sub[sub["recipe"] == own_recipe(precision.get(run, "bf16"))].sort_values("step")
        if sub.empty:
            continue
        rows.append({"run": run, "variant": sub["variant"].iloc[0] if "variant" in sub else "", "layer": layer,
                     "recipe": sub["recipe"].iloc[0], "records": len(sub), "amax_first": sub["amax"].iloc[0],
                     "amax_last": sub["amax"].iloc[-1], "amax_max": sub["amax"].max(),
                     "scale_log2_last": sub["scale_log2"].iloc[-1], "overflow_max": sub["overflow"].max(),
                     "underflow_mean": sub["underflow"].mean()})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- spikes and layouts


SPIKE_COLUMNS = ["steps_done", "spike_score_olmo2_paper_loss", "spike_score_olmo2_paper_grad",
                 "spike_scored_olmo2_paper", "spike_min_jump_olmo2_paper_loss", "spike_score_olmo_core_loss",
                 "spike_score_olmo_core_grad", "spike_score_olmo_core_any", "spike_span_olmo_core",
                 "spike_min_jump_olmo_core_loss", "zscore_exceed_loss", "zscore_exceed_grad", "nonfinite_steps"]


def spike_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Both spike scores of every trained run, with the smallest jump each would flag at the run's end."""
    if runs.empty:
        return pd.DataFrame()
    trained = runs[runs["status"].isin(TRAINED)]
    return trained.reindex(columns=["run", "status", *SPIKE_COLUMNS]).assign(
        run=trained["run"].str.split("/", n=1).str[1])


def layouts_frame(runs: pd.DataFrame) -> pd.DataFrame:
    cols = ["variant", "layout", "status", "backend", "params", "kv_cache_elements_per_token",
            "kv_bytes_per_token_bf16", "final_val_loss", "best_val_loss", "tokens_per_s", "tokens_per_s_iqr", "mfu",
            "gpu_sharing", "reason"]
    frame = runs.reindex(columns=cols)
    order = frame["layout"].map({name: i for i, name in enumerate(LAYOUTS)}).fillna(len(LAYOUTS))
    return frame.assign(_order=order).sort_values(["_order", "variant"]).drop(columns="_order")
