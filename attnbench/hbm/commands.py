"""``attnbench hbm | ledger | hbm-figures``: the hbm stage's subcommands (listed in cli.COMMAND_MODULES).

  hbm          time and ncu-profile one group of the config's ``hbm.groups`` into a parquet file
  hbm-table    merge hbm job files into one table
  ledger       KV bytes/token per layout (+ measured decode check) and attention bytes per training step
  hbm-figures  ratio bars, roofline and ledger charts from those two tables
"""
from __future__ import annotations

import signal
import sys

import pandas as pd


def _cmd_hbm(args) -> int:
    from attnbench.bench.ceilings import Ceilings, measure_ceilings
    from attnbench.bench.results import write_atomic
    from attnbench.config import load_config, resolve_device
    from attnbench.hbm.ncu import NcuSettings
    from attnbench.hbm.plan import hbm_plan, select_group
    from attnbench.hbm.stage import HbmOptions, frame, run_hbm
    from attnbench.kernels.registry import get_backend

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so a running ncu process group is killed
    config = load_config(args.config)
    device, why = resolve_device(config)
    plan = hbm_plan(config)
    groups = args.group or list(plan.groups)
    cases_of = {g: select_group(plan, g) for g in groups}  # unknown group: one-line error before any work
    for name in args.backend or []:
        get_backend(name)
    section = config["hbm"]
    ceilings = None
    if args.ceilings:
        ceilings = Ceilings.load(args.ceilings)
    elif device == "cuda":
        ceilings = measure_ceilings(device)
    frames = []
    for group, cases in cases_of.items():
        backends = args.backend or plan.group_backends[group]
        print(f"attnbench hbm: {device} ({why}); group {group}: {len(cases)} cases x {', '.join(backends)}",
              file=sys.stderr)
        options = HbmOptions(sweep=config["sweep"], group=group, device=device,
                             settings=NcuSettings.from_config(section), seed=config["seed"],
                             warmup_calls=section["warmup_calls"], timeout_s=section["timeout_s"],
                             time_in_process=section["time"], timing=config["timing"], ceilings=ceilings,
                             microbench=args.microbench, workdir=args.workdir)
        frames.append(run_hbm(cases, backends, options))
    df = frame(pd.concat(frames, ignore_index=True).to_dict("records"))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows ({(df.status == 'ok').sum()} measured) to {args.out}", file=sys.stderr)
    return 0


def _cmd_table(args) -> int:
    from attnbench.bench.results import validate_rows, write_atomic
    from attnbench.hbm.stage import frame

    parts = []
    for path in args.parts:
        df = pd.read_parquet(path)
        validate_rows(df, path)
        parts.append(df)
    df = frame(pd.concat(parts, ignore_index=True).to_dict("records"))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows from {len(parts)} files to {args.out}", file=sys.stderr)
    return 0


def _ledger_section(config_path: str | None) -> dict:
    from attnbench.config import load_config, section_defaults

    if config_path:
        return load_config(config_path)["hbm"]["ledger"]
    return section_defaults("hbm")["ledger"]


def _read_tables(paths: list[str] | None) -> pd.DataFrame | None:
    if not paths:
        return None
    return pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)


def _cmd_ledger(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.hbm.ledger import LedgerShape, build_ledger

    shape = LedgerShape.from_config(_ledger_section(args.config))
    df = build_ledger(shape, _read_tables(args.hbm))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} ledger rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_figures(args) -> int:
    from attnbench.hbm.figures import write_figures

    paths = write_figures(_read_tables(args.hbm), pd.read_parquet(args.ledger), args.out)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("hbm", help="measure DRAM bytes per (case, backend) with Nsight Compute")
    p.add_argument("--config", required=True)
    p.add_argument("--group", action="append", help="a group of hbm.groups (repeatable); default: all")
    p.add_argument("--backend", action="append", help="backend name (repeatable); default: the group's list")
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
    p.add_argument("--config", help="config whose hbm.ledger gives the model shape; default: the schema's")
    p.add_argument("--hbm", action="append", help="hbm parquet(s) whose decode rows check the formulas")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_ledger)

    p = sub.add_parser("hbm-figures", help="ratio bars, roofline and ledger charts")
    p.add_argument("--hbm", action="append", required=True, help="hbm parquet (repeatable)")
    p.add_argument("--ledger", required=True, help="ledger parquet")
    p.add_argument("--out", required=True, help="folder for " + ", ".join(("hbm-ratios.png", "roofline.png",
                                                                           "kv-ledger.png")))
    p.set_defaults(func=_cmd_figures)
