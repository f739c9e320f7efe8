"""``attnbench hbm | hbm-table | ledger``: the hbm stage's subcommands (listed in cli.COMMAND_MODULES).

  hbm          time and ncu-profile one group of the config's ``hbm.groups`` into a parquet file
  hbm-table    merge hbm job files into one table
  ledger       KV bytes/token per layout (+ measured decode check) and attention bytes per training step

Its tables and figures (ratio bars, roofline, the KV ledger): ``attnbench tables hbm`` (attnbench.report.hbm).
"""
from __future__ import annotations

import signal
import sys

import pandas as pd

from attnbench.errors import ConfigError
from attnbench.files import read_parquet


def _cmd_hbm(args) -> int:
    from attnbench.bench.ceilings import Ceilings, measure_ceilings
    from attnbench.bench.results import write_atomic
    from attnbench.hbm.ncu import NcuSettings
    from attnbench.hbm.stage import HbmOptions, frame, run_hbm
    from attnbench.kernels.registry import get_backend
    from attnbench.plan import job_cases, load_plan, read_job

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so a running ncu process group is killed
    for name in args.backend or []:
        get_backend(name)
    if args.job:
        job = read_job(args.job, ("hbm",))
    elif args.config and args.group:
        job = load_plan(args.config).hbm_job(args.group, args.backend).payload
    else:
        raise ConfigError("give --job (a plan file), or --config with --group")
    backends = args.backend or job["backends"]
    cases, device, section = job_cases(job), job["device"], job["hbm"]
    ceilings = None
    if args.ceilings:
        ceilings = Ceilings.load(args.ceilings)
    elif device == "cuda":
        ceilings = measure_ceilings(device)
    print(f"attnbench hbm: {device}; group {job['group']}: {len(cases)} cases x {', '.join(backends)}",
          file=sys.stderr)
    options = HbmOptions(sweep=job["sweep"], group=job["group"], device=device,
                         settings=NcuSettings.from_config(section), warmup_calls=section["warmup_calls"],
                         timeout_s=section["timeout_s"], time_in_process=section["time"], run=job["options"],
                         ceilings=ceilings, microbench=args.microbench, workdir=args.workdir)
    df = frame(run_hbm(cases, backends, options).to_dict("records"))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows ({(df.status == 'ok').sum()} measured) to {args.out}", file=sys.stderr)
    return 0


def _cmd_table(args) -> int:
    from attnbench.bench.results import validate_rows, write_atomic
    from attnbench.hbm.stage import frame

    parts = []
    for path in args.parts:
        df = read_parquet(path)
        validate_rows(df, path)
        parts.append(df)
    df = frame(pd.concat(parts, ignore_index=True).to_dict("records"))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows from {len(parts)} files to {args.out}", file=sys.stderr)
    return 0


def _read_tables(paths: list[str] | None) -> pd.DataFrame | None:
    if not paths:
        return None
    return pd.concat([read_parquet(p) for p in paths], ignore_index=True)


def _cmd_ledger(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.hbm.ledger import LedgerShape, build_ledger

    from attnbench.config import section_defaults
    from attnbench.plan import read_job

    section = read_job(args.job, ("hbm-ledger",))["ledger"] if args.job else section_defaults("hbm")["ledger"]
    shape = LedgerShape.from_config(section)
    df = build_ledger(shape, _read_tables(args.hbm))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} ledger rows to {args.out}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("hbm", help="measure DRAM bytes per (case, backend) with Nsight Compute")
    p.add_argument("--job", help="the job's plan file, results/<sweep>/plan/hbm/<group>.<backend>.json")
    p.add_argument("--config", help="a config file: plan the job now, instead of --job")
    p.add_argument("--group", help="with --config: a group of hbm.groups")
    p.add_argument("--backend", action="append", help="backend name (repeatable); default: the job's")
    p.add_argument("--microbench", help="results parquet to take times from (same case_id and backend)")
    p.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`; default: measure now (CUDA)")
    p.add_argument("--workdir", help="keep ncu plans, logs and reports under this folder")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_hbm)

    p = sub.add_parser("hbm-table", help="merge hbm job files into one table")
    p.add_argument("--out", required=True)
    p.add_argument("parts", nargs="+", help="parquet files written by attnbench hbm")
    p.set_defaults(func=_cmd_table)

    p = sub.add_parser("ledger", help="KV bytes/token per layout and attention bytes per training step")
    p.add_argument("--job", help="the ledger's plan file (plan/hbm/ledger.json); default: the schema's model shape")
    p.add_argument("--hbm", action="append", help="hbm parquet(s) whose decode rows check the formulas")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_ledger)
