"""``attnbench train`` and ``attnbench experiment``: the pretraining stage's subcommands.

  attnbench train --config FILE --run NAME --out DIR
      one run: ``base`` (pretrain.model/train/data as configured) or any run an
      experiment plans (``attnbench experiment list`` prints the names); resumes a
      killed run from its checkpoint, skips a finished one
  attnbench experiment list   --config FILE
  attnbench experiment run    --job FILE --out DIR [--ceilings FILE] [--threads N]
  attnbench experiment restore --config FILE --rows results/reference/<gpu>/<folder>/pretrain/<experiment>
                               --out results/<sweep>/pretrain/<experiment>
      the finished runs of committed rows back into the experiment's folder (its runs/), so that the
      experiment trains only the runs still missing (:mod:`attnbench.train.restore`)

Its tables and figures: ``attnbench tables pretrain`` (:mod:`attnbench.report.stages`).
"""
from __future__ import annotations

import json
import sys

from attnbench.arguments import THREADS
from attnbench.errors import ConfigError


def _threads(device: str, threads: int | None) -> None:
    if device == "cpu" and threads:
        import torch  # here, not at the top: building the parser needs no torch

        torch.set_num_threads(threads)


def _peak_cache(args, device: str) -> dict:
    """``{matmul dtype: (FLOP/s, source)}`` from ``--ceilings`` (``attnbench ceilings``: the pipeline's ceilings job,
    measured alone on its GPU), else empty: measured when first needed."""
    if not args.ceilings:
        return {}
    from attnbench.bench.ceilings import Ceilings
    from attnbench.bench.provenance import environment
    from attnbench.train.experiments import ceiling_cache

    return ceiling_cache(Ceilings.load(args.ceilings), environment(device)["device_name"], args.ceilings)


def _find_run(plan, name: str):
    from attnbench.train import experiments as ex
    from attnbench.train.loop import RunSpec

    pre = plan.view["pretrain"]
    if name == "base":
        model, tcfg, data = ex.base_configs(pre)
        return RunSpec("base", model, tcfg, data, {"experiment": "base"})
    exp = name.split("/", 1)[0]
    if exp not in ex.EXPERIMENTS:
        raise ConfigError(f"--run {name!r}: allowed: base, or <experiment>/<run> with experiment one of "
                          f"{', '.join(ex.EXPERIMENTS)} (attnbench experiment list)")
    specs = {s.name: s for s in ex.plan_runs(pre, exp)}
    if name not in specs:
        raise ConfigError(f"--run {name!r} is not planned; allowed: {', '.join(specs)}")
    return specs[name]


def _cmd_train(args) -> int:
    from attnbench.plan import load_plan
    from attnbench.train.determinism import prepare_process
    from attnbench.train.experiments import peak_flops_for
    from attnbench.train.loop import train
    from attnbench.train.precision import get_precision

    plan = load_plan(args.config, args.device)
    _threads(plan.device, args.threads or plan.view["pretrain"]["threads"])
    spec = _find_run(plan, args.run)
    prepare_process([spec.train.deterministic])  # before the matmul ceiling's CUDA work
    peak, source = peak_flops_for(plan.device, get_precision(spec.train.precision).matmul_dtype,
                                  _peak_cache(args, plan.device))
    summary = train(spec, args.out, plan.device, peak_flops=peak, peak_flops_source=source,
                    progress=not args.no_progress)
    keys = ("run", "status", "reason", "steps_done", "final_val_loss", "spike_score_olmo2_paper_loss",
            "spike_score_olmo_core_any", "nonfinite_steps", "tokens_per_s", "tokens_per_s_iqr", "mfu", "gpu_sharing")
    print(json.dumps({k: summary.get(k) for k in keys}, default=str))
    return 0 if summary.get("status") in ("ok", "diverged", "unavailable", "unsupported") else 1


def _cmd_experiment(args) -> int:
    from attnbench.train import experiments as ex

    if args.action == "list":
        from attnbench.plan import load_plan

        plan = load_plan(args.config, args.device)
        for name in ex.EXPERIMENTS:
            for spec in ex.plan_runs(plan.view["pretrain"], name):
                print(spec.name)
        return 0
    if args.action == "restore":
        return _cmd_restore(args)
    from attnbench.plan import read_job

    job = read_job(args.job, ("pretrain",))
    _threads(job["device"], args.threads or job["threads"])
    from attnbench.envvars import deadline

    frames = ex.run_experiment(job, args.out, progress=not args.no_progress,
                               peak_cache=_peak_cache(args, job["device"]),
                               stop_at=deadline())  # a lease's deadline
    runs = frames["runs"]
    cols = [c for c in ("run", "status", "final_val_loss", "spike_score_olmo_core_any", "tokens_per_s",
                        "tokens_per_s_iqr", "mfu", "gpu_sharing") if c in runs]
    print(runs[cols].to_string(index=False), file=sys.stderr)
    return 0


def _cmd_restore(args) -> int:
    from attnbench.plan import load_plan
    from attnbench.train import experiments as ex
    from attnbench.train.loop import RunSpec
    from attnbench.train.restore import experiment_folder, reference_rows, restore_finished_runs

    rows = reference_rows(args.rows)
    experiment = rows.name
    if experiment not in ex.EXPERIMENTS:
        raise ConfigError(f"--rows={args.rows!r} ends in {experiment!r}; allowed: a folder named after an experiment, "
                          f"one of {', '.join(ex.EXPERIMENTS)}")
    out = experiment_folder(args.out, experiment)
    plan = load_plan(args.config, args.device)
    specs = [RunSpec.from_dict(d) for d in plan.job("pretrain", experiment).payload["runs"]]  # as the job trains them
    restored = restore_finished_runs(experiment, specs, rows, out)
    print(f"attnbench experiment restore: {len(restored)} finished runs from {rows} into {out}/runs"
          + (f": {', '.join(restored)}" if restored else ""))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("train", help="one pretraining run (resumes from its checkpoint)")
    p.add_argument("--config", required=True)
    p.add_argument("--run", required=True, help="base, or <experiment>/<run> (attnbench experiment list)")
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: the config's device")
    _common(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("experiment", help="plan or run a pretraining experiment")
    p.add_argument("action", choices=["list", "run", "restore"])
    p.add_argument("--config", help="list, restore: the config whose runs are planned")
    p.add_argument("--device", choices=["cpu", "cuda"], help="list, restore: plan this device (default: the config's)")
    p.add_argument("--rows", help="restore: an experiment's committed rows, "
                                  "results/reference/<gpu>/<folder>/pretrain/<experiment>")
    p.add_argument("--job", help="run: the experiment's plan file, results/<sweep>/plan/pretrain/<experiment>.json")
    p.add_argument("--out", help="run, restore: the experiment directory, results/<sweep>/pretrain/<experiment>")
    _common(p)
    p.set_defaults(func=_check_experiment_args)


def _common(p) -> None:
    p.add_argument("--ceilings", help="ceilings JSON (attnbench ceilings) for MFU; default: measure the matmul rate")
    p.add_argument("--threads", type=THREADS, help="torch CPU threads; default: pretrain.threads")
    p.add_argument("--no-progress", action="store_true")


def _check_experiment_args(args) -> int:
    need = {"list": ["config"], "run": ["job", "out"], "restore": ["config", "rows", "out"]}[args.action]
    missing = [n for n in need if not getattr(args, n)]
    if missing:
        raise ConfigError(f"attnbench experiment {args.action} needs --{missing[0]}")
    return _cmd_experiment(args)
