"""``attnbench`` command line: the only entry point the workflow's rules call.

Subcommands
  backends      list every backend with available/unavailable and the reason
  ceilings      measure roofline ceilings on this host and write them as JSON
  cases         print the cases a config expands to (and check it)
  microbench    run one group of cases for one or more backends into a parquet file
"""
from __future__ import annotations

import argparse
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


def _cmd_cases(args) -> int:
    from attnbench.config import load_config, microbench_plan, resolve_device

    config = load_config(args.config)
    device, why = (args.device, "--device on the command line") if args.device else resolve_device(config)
    plan = microbench_plan(config, device)
    print(f"# grid: {plan.device} ({why})")
    for group, cases in plan.groups.items():
        for case in cases:
            print(f"{group}\t{case.case_id}\t{case.label()}")
    return 0


def _cmd_microbench(args) -> int:
    from attnbench.bench.ceilings import Ceilings, measure_ceilings
    from attnbench.bench.microbench import RunOptions, run_group
    from attnbench.bench.results import to_frame, write_atomic
    from attnbench.config import ConfigError, load_config, microbench_plan, resolve_device
    from attnbench.kernels.registry import get_backend

    config = load_config(args.config)
    device, why = resolve_device(config)
    plan = microbench_plan(config, device)
    for name in args.backend or []:
        get_backend(name)  # unknown name: one-line error before any work
    if args.group and args.group not in plan.groups:
        raise ConfigError(f"group={args.group!r} is not in microbench.{device}.groups; allowed: {', '.join(plan.groups)}")
    groups = {g: plan.groups[g] for g in ([args.group] if args.group else plan.groups)}
    backends_of = {g: args.backend or plan.group_backends[g] for g in groups}
    print(f"attnbench microbench: {device} grid ({why}); "
          + "; ".join(f"{g}: {len(groups[g])} cases x {', '.join(backends_of[g])}" for g in groups), file=sys.stderr)
    ceilings = Ceilings.load(args.ceilings) if args.ceilings else measure_ceilings(device)
    timing = config["timing"]
    rows: list[dict] = []
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `timeout` and schedulers stop a job with SIGTERM
    try:
        for group, cases in groups.items():
            options = RunOptions(sweep=config["sweep"], group=group, device=device, numerics=config["numerics"],
                                 max_err_ratio=config["max_err_ratio"], seed=config["seed"],
                                 warmup_ms=timing["warmup_ms"], rep_ms=timing["rep_ms"],
                                 cpu_min_run_time_s=timing["cpu_min_run_time_s"], ceilings=ceilings)
            run_group(cases, backends_of[group], options, rows=rows)
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


# Modules that add subcommands: each has ``add_commands(subparsers)``; one line per stage.
COMMAND_MODULES: tuple[str, ...] = (
    "attnbench.report.commands",
    "attnbench.wheelhouse_commands",
    "attnbench.train.commands",
    "attnbench.hbm.commands",
    "attnbench.context.commands",
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

    p = sub.add_parser("cases", help="print the cases a config expands to")
    p.add_argument("--config", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], help="show this device's grid instead of the resolved one")
    p.set_defaults(func=_cmd_cases)

    p = sub.add_parser("microbench", help="time, check and record a group of cases")
    p.add_argument("--config", required=True)
    p.add_argument("--backend", action="append", help="backend name (repeatable); default: the config's list")
    p.add_argument("--group", help="one group of the config; default: all")
    p.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`; default: measure now")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_microbench)

    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from attnbench.bench.case import CaseError
    from attnbench.bench.results import ResultsError
    from attnbench.config import ConfigError
    from attnbench.kernels.registry import BackendError

    try:
        return args.func(args)
    except (ConfigError, CaseError, BackendError, ResultsError) as err:
        print(f"attnbench: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
