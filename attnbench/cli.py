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
    if args.targets is not None:  # only the paths, one a line: what scripts/lease.sh passes to Snakemake
        from attnbench.workflow.paths import group_targets

        groups = [plan.lease_group(name) for name in args.targets.split(",")]
        print("\n".join(group_targets(plan.sweep, groups)))
        return 0
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
    from attnbench.kernels.registry import get_backend
    from attnbench.plan import RESULTS_STAGES, job_cases, resolve_job
    from attnbench.workflow.resume import SideFile, side_path

    job = resolve_job(job=args.job, config=args.config, stage="microbench", name=args.group, stages=RESULTS_STAGES)
    for name in args.backend or []:
        get_backend(name)  # unknown name: one-line error before any work
    backends = args.backend or job["backends"]
    cases = job_cases(job)
    ceilings = Ceilings.load(args.ceilings) if args.ceilings else None  # a bad file: one line before any work
    side = SideFile(args.out, job, backends)  # rows a stopped run of this job finished
    todo = side.pending(cases, backends)
    device = job["device"]
    resumed = f"; resuming: {len(side.done)} rows kept from {side_path(args.out)}" if side.done else ""
    print(f"attnbench microbench: {job['stage']} job {job['group']!r} on {device}: {len(cases)} cases x "
          f"{', '.join(backends)}{resumed}", file=sys.stderr)
    if todo and ceilings is None:
        ceilings = measure_ceilings(device)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `timeout` and schedulers stop a job with SIGTERM
    try:
        for batch, batch_backends in todo:
            run_group(batch, batch_backends, RunOptions(**job["options"], ceilings=ceilings), rows=side.rows)
    except KeyboardInterrupt:
        print(f"attnbench: interrupted; {len(side.done) + len(side.rows)} finished rows are in "
              f"{side_path(args.out)} (the next run measures only the rest); {args.out} not written", file=sys.stderr)
        return 3
    df = side.finish()
    print(f"wrote {len(df)} rows to {args.out}", file=sys.stderr)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (``attnbench <command>: error: ... (see --help)``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    "attnbench.compiler.commands",
    "attnbench.report.commands",
    "attnbench.wheelhouse_commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnbench", description=__doc__.split("\n")[0])
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
    p.add_argument("--targets", metavar="GROUP[,GROUP...]",
                   help="print only the Snakemake targets that run these results groups (microbench, else context "
                        "cost, else pretraining experiments) and record the config")
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
    """Parse, then check what can be checked before any work (the environment variables, outputs that would
    overwrite inputs), then run the command; every error a user can fix is one line and exit status 2."""
    from attnbench.workflow.process import die_with_parent

    die_with_parent()  # a job whose Snakemake is killed stops instead of running on as an orphan
    args = build_parser().parse_args(argv)
    from attnbench.bench.results import ResultsError
    from attnbench.case import CaseError
    from attnbench.envvars import check_environment
    from attnbench.errors import ConfigError
    from attnbench.files import InputError, refuse_overwrite
    from attnbench.kernels.registry import BackendError

    try:
        check_environment()
        refuse_overwrite(args)
        return args.func(args)
    except (ConfigError, CaseError, BackendError, ResultsError, InputError) as err:
        print(f"attnbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
