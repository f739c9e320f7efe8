"""Subcommands of the pipeline's plumbing: the calls rules make around the stages.

  env            write the effective config and the versions/provenance of this host
  guard          run a results job; a crash becomes error rows for the cases it did not finish
  lease          run a command under its device's timing lock (a leased GPU with CUDA_VISIBLE_DEVICES, --gpus N
                 of them all or none, or the CPU)
  rule-backend   `cases`: a job's cases as TSV; `ingest`: a command's timings as results rows
  schema         print or write a generated schema (results)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnbench.arguments import bounded_int

MAX_GPUS = 64  # a job's ranks, one GPU each: the largest world size context_parallel.schema.yaml admits
GPUS = bounded_int(1, MAX_GPUS)  # --gpus of lease


def _cmd_env(args) -> int:
    import importlib.metadata

    import yaml

    from attnbench.bench.provenance import environment
    from attnbench.files import read_json
    from attnbench.kernels.registry import all_backends, safe_available, safe_version

    config = read_json(args.config_in, "config snapshot (results/<sweep>/plan/config.json)")  # validated when planned
    device = config["device"]
    Path(args.config_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.config_out).write_text("# The effective config of this sweep (validated, defaults filled, device "
                                     "resolved), written by `attnbench env`.\n" + yaml.safe_dump(config, sort_keys=False))
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
    versions = {**environment(device), "sweep": config["sweep"], "sources": config.get("sources", []),
                "packages": packages, "backends": backends}
    Path(args.versions_out).write_text(json.dumps(versions, indent=2))
    print(f"attnbench env: sweep {config['sweep']!r} on {device}", file=sys.stderr)
    return 0


def _inner(args) -> list[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("attnbench: error: no command after --; usage: attnbench guard ... -- attnbench microbench ...")
    return cmd


def _cmd_guard(args) -> int:
    from attnbench.plan import RESULTS_STAGES, read_job
    from attnbench.workflow.guard import guard

    job = read_job(args.job, RESULTS_STAGES)
    return guard(_inner(args), job=job, backends=args.backend or job["backends"], out=args.out)


def _cmd_lease(args) -> int:
    from attnbench.workflow.lease import run_leased, visible_devices

    device = args.device if args.device != "auto" else ("cuda" if visible_devices() else "cpu")
    if args.gpus > 1 and device != "cuda":
        raise SystemExit(f"attnbench lease: --gpus={args.gpus} is not allowed with --device {device}; allowed: "
                         f"1, or 1 to {MAX_GPUS} with --device cuda")
    return run_leased(_inner(args), device, untimed=args.untimed, gpus=args.gpus)


def _cmd_rule_cases(args) -> int:
    from attnbench.plan import read_job
    from attnbench.workflow.ingest import write_cases

    n = write_cases(read_job(args.job, ("microbench-rule",)), args.out)
    print(f"wrote {n} cases to {args.out}", file=sys.stderr)
    return 0


def _cmd_rule_ingest(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.bench.schema import validate_frame
    from attnbench.plan import read_job
    from attnbench.workflow.ingest import ingest

    job = read_job(args.job, ("microbench-rule",))
    df = ingest(job, job["backends"][0], timings=args.timings, ceilings=args.ceilings, version=args.version,
                family=args.family, unavailable=args.unavailable)
    validate_frame(df, args.out)
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows to {args.out}: " + ", ".join(f"{k} {v}" for k, v in
                                                             df.groupby("status").size().items()), file=sys.stderr)
    return 0


def _cmd_schema(args) -> int:
    from attnbench.bench.schema import results_schema_text

    text = results_schema_text()
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("env", help="write the effective config and this host's versions")
    p.add_argument("--config-in", required=True, help="the planner's config snapshot (results/<sweep>/plan/config.json)")
    p.add_argument("--config-out", required=True)
    p.add_argument("--versions-out", required=True)
    p.set_defaults(func=_cmd_env)

    p = sub.add_parser("guard", help="run a results job; if it leaves rows out, write error rows for them")
    p.add_argument("--job", required=True, help="the job's plan file")
    p.add_argument("--backend", action="append", help="the backends the command runs (default: the job's)")
    p.add_argument("--out", required=True, help="the results file the job must write")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the job's command")
    p.set_defaults(func=_cmd_guard)

    p = sub.add_parser("lease", help="run a command under its device's timing lock (one GPU, --gpus N, or the whole CPU)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="the device the command times on (auto: cuda when a GPU is visible)")
    p.add_argument("--untimed", action="store_true",
                   help="the command needs the device but times nothing: no CPU lock (a GPU is still leased)")
    p.add_argument("--gpus", type=GPUS, default=1,
                   help="GPUs to lease together, all or none (default 1; more only with --device cuda)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    p.set_defaults(func=_cmd_lease)

    p = sub.add_parser("rule-backend", help="helpers for backends added as Snakemake rules")
    rb = p.add_subparsers(dest="rule_command", required=True)
    q = rb.add_parser("cases", help="write a job's cases as TSV for a backend's command")
    q.add_argument("--job", required=True, help="the rule backend's plan file (plan/microbench-rule/<name>.<group>.json)")
    q.add_argument("--out", required=True)
    q.set_defaults(func=_cmd_rule_cases)
    q = rb.add_parser("ingest", help="turn a command's timings TSV into validated results rows")
    q.add_argument("--job", required=True, help="the rule backend's plan file")
    q.add_argument("--timings", help="the command's output (see attnbench.workflow.ingest)")
    q.add_argument("--unavailable", help="the backend could not be built or run here: every row unavailable, this reason")
    q.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`")
    q.add_argument("--version", default="", help="version string of the backend")
    q.add_argument("--family", choices=["fused", "eager", "math"], default="fused", help="how its bytes are modelled")
    q.add_argument("--out", required=True)
    q.set_defaults(func=_cmd_rule_ingest)

    p = sub.add_parser("schema", help="print or write a generated schema")
    p.add_argument("which", choices=["results"])
    p.add_argument("--out")
    p.set_defaults(func=_cmd_schema)
