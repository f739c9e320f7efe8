"""Subcommands of the workflow's stages after the benchmark: the only calls its rules make.

  env            write the effective config and the versions/provenance of this host
  guard          run a microbench job (optionally on a leased GPU); a crash becomes error rows
  lease          run any command on a leased GPU (CUDA_VISIBLE_DEVICES set)
  rule-backend   `cases`: a group's cases as TSV; `ingest`: a command's timings as results rows
  aggregate      validate and join results files; write tables and figures
  render         execute the report notebooks into one HTML file
  publish        log the sweep to Weights & Biases (offline unless WANDB_API_KEY is set)
  schema         print or write a generated schema (results)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _cmd_env(args) -> int:
    import importlib.metadata

    import yaml

    from attnbench.bench.provenance import environment
    from attnbench.config import resolve_device, validate_config
    from attnbench.kernels.registry import all_backends, safe_available, safe_version

    config = validate_config(json.loads(Path(args.config_in).read_text()))
    device, why = resolve_device(config)
    config["device"] = device
    Path(args.config_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.config_out).write_text("# The effective config of this sweep, written by `attnbench env`; "
                                     "every job reads it.\n" + yaml.safe_dump(config, sort_keys=False))
    backends = {}
    for name, backend in all_backends().items():
        ok, reason = safe_available(backend)
        backends[name] = {"available": ok, "version": safe_version(backend), "reason": reason or ""}
    packages = {}
    for name in ("torch", "triton", "numpy", "pandas", "pyarrow", "snakemake", "seaborn", "matplotlib", "nbconvert",
                 "jupytext", "wandb"):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    versions = {**environment(device), "why": why, "sweep": config["sweep"], "packages": packages,
                "backends": backends}
    Path(args.versions_out).write_text(json.dumps(versions, indent=2))
    print(f"attnbench env: {device} grid ({why})", file=sys.stderr)
    return 0


def _inner(args) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("attnbench: error: no command after --; usage: attnbench guard ... -- attnbench microbench ...")
    return cmd


def _cmd_guard(args) -> int:
    from attnbench.report.jobs import guard

    return guard(_inner(args), config=args.config, group=args.group, backends=args.backend, out=args.out,
                 gpu=args.gpu_lease)


def _cmd_lease(args) -> int:
    import os

    from attnbench.report.jobs import gpu_lease

    with gpu_lease() as device:
        print(f"attnbench lease: GPU {device}", file=sys.stderr)
        return subprocess.call(_inner(args), env={**os.environ, "CUDA_VISIBLE_DEVICES": device})


def _cmd_rule_cases(args) -> int:
    from attnbench.report.ingest import write_cases

    n = write_cases(args.config, args.group, args.out)
    print(f"wrote {n} cases to {args.out}", file=sys.stderr)
    return 0


def _cmd_rule_ingest(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.report.ingest import ingest
    from attnbench.report.schema import validate_frame

    df = ingest(args.config, args.group, args.backend, timings=args.timings, ceilings=args.ceilings,
                version=args.version, family=args.family, unavailable=args.unavailable)
    validate_frame(df, args.out)
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows to {args.out}: " + ", ".join(f"{k} {v}" for k, v in
                                                             df.groupby("status").size().items()), file=sys.stderr)
    return 0


def _cmd_aggregate(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.report.aggregate import load_results
    from attnbench.report.figures import write_figures
    from attnbench.report.tables import write_tables

    df = load_results(args.inputs)
    write_atomic(df, args.merged)
    index = write_tables(df, args.tables)
    figures = write_figures(df, args.figures)
    print(f"joined {len(args.inputs)} files, {len(df)} rows ({', '.join(f'{k} {v}' for k, v in df.groupby('status').size().items())}); "
          f"{len(index)} tables, {len(figures)} figure files", file=sys.stderr)
    return 0


def _cmd_render(args) -> int:
    from attnbench.report.notebook import render

    out = render(args.notebooks, args.results, args.out, keep_notebook=args.keep_notebook)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


def _cmd_publish(args) -> int:
    from attnbench.report.publish import publish

    receipt = publish(args.results, args.env, args.out, project=args.project, entity=args.entity, tags=args.tag)
    print(f"attnbench publish: {receipt['mode']} run {receipt['run_id']} in {receipt['run_dir']}"
          + (f"; upload later with: {receipt['sync']}" if receipt["sync"] else f"; {receipt['url']}"), file=sys.stderr)
    return 0


def _cmd_schema(args) -> int:
    from attnbench.report.schema import results_schema_text

    text = results_schema_text()
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def add_commands(sub) -> None:
    import argparse

    p = sub.add_parser("env", help="write the effective config and this host's versions")
    p.add_argument("--config-in", required=True, help="the merged config as JSON (the workflow's snapshot)")
    p.add_argument("--config-out", required=True)
    p.add_argument("--versions-out", required=True)
    p.set_defaults(func=_cmd_env)

    p = sub.add_parser("guard", help="run a microbench job; if it leaves no results, write error rows instead")
    p.add_argument("--config", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--backend", action="append", help="the job's backends (default: the group's)")
    p.add_argument("--out", required=True, help="the results file the job must write")
    p.add_argument("--gpu-lease", action="store_true", help="lease one GPU and set CUDA_VISIBLE_DEVICES")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the job's command")
    p.set_defaults(func=_cmd_guard)

    p = sub.add_parser("lease", help="run a command on one leased GPU")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    p.set_defaults(func=_cmd_lease)

    p = sub.add_parser("rule-backend", help="helpers for backends added as Snakemake rules")
    rb = p.add_subparsers(dest="rule_command", required=True)
    q = rb.add_parser("cases", help="write a group's cases as TSV for a backend's command")
    q.add_argument("--config", required=True)
    q.add_argument("--group", required=True)
    q.add_argument("--out", required=True)
    q.set_defaults(func=_cmd_rule_cases)
    q = rb.add_parser("ingest", help="turn a command's timings TSV into validated results rows")
    q.add_argument("--config", required=True)
    q.add_argument("--group", required=True)
    q.add_argument("--backend", required=True)
    q.add_argument("--timings", help="the command's output (see attnbench.report.ingest)")
    q.add_argument("--unavailable", help="the backend could not be built or run here: every row unavailable, this reason")
    q.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`")
    q.add_argument("--version", default="", help="version string of the backend")
    q.add_argument("--family", choices=["fused", "eager", "math"], default="fused", help="how its bytes are modelled")
    q.add_argument("--out", required=True)
    q.set_defaults(func=_cmd_rule_ingest)

    p = sub.add_parser("aggregate", help="validate and join results files; write tables and figures")
    p.add_argument("--merged", required=True, help="the joined results parquet")
    p.add_argument("--tables", required=True, help="folder for tables (md, tex, csv, index.json)")
    p.add_argument("--figures", required=True, help="folder for figures (png, svg)")
    p.add_argument("inputs", nargs="+", help="results files (parquet or csv)")
    p.set_defaults(func=_cmd_aggregate)

    p = sub.add_parser("render", help="execute report notebooks (jupytext py:percent) into one HTML file")
    p.add_argument("--results", required=True, help="the sweep's results folder (aggregated tables)")
    p.add_argument("--out", required=True)
    p.add_argument("--keep-notebook", help="also write the executed .ipynb here")
    p.add_argument("notebooks", nargs="+")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("publish", help="log the sweep to Weights & Biases (offline unless WANDB_API_KEY is set)")
    p.add_argument("--results", required=True, help="the sweep's results folder")
    p.add_argument("--env", required=True, help="the sweep's env folder (config.yaml, versions.json, ceilings.json)")
    p.add_argument("--project", default="attnbench")
    p.add_argument("--entity")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--out", required=True, help="JSON receipt: mode, run id, run dir, what was logged")
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("schema", help="print or write a generated schema")
    p.add_argument("which", choices=["results"])
    p.add_argument("--out")
    p.set_defaults(func=_cmd_schema)
