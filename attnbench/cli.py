"""``attnbench`` command line: the only entry point the workflow's rules call.

Core subcommands (the stages add theirs, :data:`COMMAND_MODULES`)
  backends      list every backend with available/unavailable and the reason
  ceilings      measure roofline ceilings on this host and write them as JSON
  plan          check a config and print (or write) the jobs it plans, per stage
  cases         print the microbench cases a config expands to
  microbench    time, check and record one results job (a group of cases on its backends)
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

import pandas as pd


def _cmd_backends(args) -> int:
    from attnbench.kernels.registry import all_backends, safe_available, safe_version

    rows = []
    for name, backend in all_backends().items():
        ok, reason = safe_available(backend)
        rows.append({"backend": name, "family": backend.family, "status": "available" if ok else "unavailable",
                     "version": safe_version(backend), "reason": reason or ""})
    df = pd.DataFrame(rows)
    if args.format == "json":
        print(df.to_json(orient="records", indent=2))
    else:
        with pd.option_context("display.max_colwidth", 120, "display.width", 200):
            print(df.to_string(index=False))
    return 0


def _cmd_ceilings(args) -> int:
    from attnbench.bench.ceilings import measure_ceilings
    from attnbench.config import resolve_device

    device = resolve_device({"device": args.device})[0]
    ceilings = measure_ceilings(device)
    ceilings.save(args.out)
    print(f"{ceilings.device_name}: copy {ceilings.copy_bytes_per_s / 1e9:.1f} GB/s; "
          + ", ".join(f"{d} {r / 1e12:.2f} TFLOP/s" for d, r in ceilings.matmul_flops_per_s.items()), file=sys.stderr)
    return 0


def _cmd_plan(args) -> int:
    from attnbench.plan import load_plan

    plan = load_plan(args.config, args.device)
    print(plan.summary())
    for job in plan.jobs():
        print(f"{job.stage}\t{job.name}")
    if args.out_dir:
        plan.write_jobs(args.out_dir)
    return 0


def _cmd_cases(args) -> int:
    from attnbench.plan import load_plan

    plan = load_plan(args.config, args.device)
    print(f"# grid: {plan.device} ({plan.why})")
    for group in plan.microbench.values():
        for case in group.cases:
            print(f"{group.name}\t{case.case_id}\t{case.label()}")
    return 0


def _cmd_microbench(args) -> int:
    from attnbench.bench.ceilings import Ceilings, measure_ceilings
    from attnbench.bench.microbench import RunOptions, run_group
    from attnbench.bench.results import to_frame, write_atomic
    from attnbench.kernels.registry import get_backend
    from attnbench.plan import RESULTS_STAGES, job_cases, resolve_job

    job = resolve_job(job=args.job, config=args.config, stage="microbench", name=args.group, stages=RESULTS_STAGES)
    for name in args.backend or []:
        get_backend(name)  # unknown name: one-line error before any work
    backends = args.backend or job["backends"]
    cases = job_cases(job)
    device = job["device"]
    print(f"attnbench microbench: {job['stage']} job {job['group']!r} on {device}: {len(cases)} cases x "
          f"{', '.join(backends)}", file=sys.stderr)
    ceilings = Ceilings.load(args.ceilings) if args.ceilings else measure_ceilings(device)
    rows: list[dict] = []
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `timeout` and schedulers stop a job with SIGTERM
    try:
        run_group(cases, backends, RunOptions(**job["options"], ceilings=ceilings), rows=rows)
    except KeyboardInterrupt:
        if rows:
            write_atomic(to_frame(rows), args.out)
            print(f"attnbench: interrupted; wrote the {len(rows)} finished rows to {args.out}", file=sys.stderr)
        else:
            print(f"attnbench: interrupted before any row finished; {args.out} left as it was", file=sys.stderr)
        return 3
    write_atomic(to_frame(rows), args.out)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def add_job_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """``--job`` (a plan file, what the workflow passes) or ``--config`` with ``--group`` (standalone)."""
    p.add_argument("--job", help="the job's plan file, results/<sweep>/plan/<stage>/<name>.json (the workflow's way)")
    p.add_argument("--config", help="a config file: plan the job now, instead of --job")
    p.add_argument("--group", help=f"with --config: the {what} group")


# Modules that add subcommands, in data-flow order: each has ``add_commands(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = (
    "attnbench.workflow.commands",
    "attnbench.hbm.commands",
    "attnbench.train.commands",
    "attnbench.context.commands",
    "attnbench.parallel.commands",
    "attnbench.report.commands",
    "attnbench.wheelhouse_commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("backends", help="list backends and whether each can run here")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=_cmd_backends)

    p = sub.add_parser("ceilings", help="measure copy bandwidth and matmul rate per dtype")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_ceilings)

    p = sub.add_parser("plan", help="check a config and list the jobs it plans (optionally write their files)")
    p.add_argument("--config", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], help="plan this device's grid instead of the resolved one")
    p.add_argument("--out-dir", help="write each job's plan file under this folder")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("cases", help="print the microbench cases a config expands to")
    p.add_argument("--config", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], help="show this device's grid instead of the resolved one")
    p.set_defaults(func=_cmd_cases)

    p = sub.add_parser("microbench", help="time, check and record a group of cases")
    add_job_arguments(p, "microbench")
    p.add_argument("--backend", action="append", help="backend name (repeatable); default: the job's")
    p.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`; default: measure now")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_microbench)

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from attnbench.bench.results import ResultsError
    from attnbench.case import CaseError
    from attnbench.errors import ConfigError
    from attnbench.kernels.registry import BackendError

    try:
        return args.func(args)
    except (ConfigError, CaseError, BackendError, ResultsError) as err:
        print(f"attnbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
