"""``attnbench context-parallel | context-parallel-merge``: the stage's subcommands (listed in cli.COMMAND_MODULES).

  context-parallel        run one world size's job: torchrun with N ranks, within its time limit
  context-parallel-merge  merge the world sizes' files and fill the scaling efficiency

The stage's tables and figures come from the merged file through ``attnbench tables context_parallel``
(:mod:`attnbench.report.stages`).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path



def _cmd_run(args) -> int:
    from attnbench.parallel.launch import launch
    from attnbench.parallel.plan import STAGE
    from attnbench.plan import resolve_job

    job = resolve_job(job=args.job, config=args.config, stage=STAGE, name=args.name, stages=(STAGE,))
    with tempfile.TemporaryDirectory(prefix="attnbench-cp-") as tmp:
        job_path = args.job
        if job_path is None:  # planned now: the ranks read their job from a file, as in the workflow
            job_path = str(Path(tmp) / "job.json")
            Path(job_path).write_text(json.dumps(job))
        print(f"attnbench context-parallel: {job['device']}, {job['world_size']} ranks, {len(job['items'])} rows",
              file=sys.stderr)
        df = launch(job, job_path, args.out)
    counts = ", ".join(f"{k} {v}" for k, v in df.groupby("status").size().items())
    print(f"attnbench context-parallel: {counts}", file=sys.stderr)
    return 0


def _cmd_merge(args) -> int:
    from attnbench.bench.results import validate_rows, write_atomic
    from attnbench.files import read_parquet
    from attnbench.parallel.columns import merge

    parts = []
    for path in args.parts:
        df = read_parquet(path, "context-parallel results file (attnbench context-parallel)")
        validate_rows(df, path)
        parts.append(df)
    df = merge(parts)
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows from {len(parts)} files to {args.out}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("context-parallel", help="run one world size's context-parallel job (torchrun, N ranks)")
    p.add_argument("--job", help="the job's plan file, results/<sweep>/plan/context_parallel/n<N>.json")
    p.add_argument("--config", help="a config file: plan the job now, instead of --job")
    p.add_argument("--name", help="with --config: the job, n<N> (N a world size of context_parallel.world_sizes)")
    p.add_argument("--out", required=True, help="results parquet")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("context-parallel-merge", help="merge context-parallel files, filling the scaling efficiency")
    p.add_argument("--out", required=True, help="the merged parquet (with scaling efficiency)")
    p.add_argument("parts", nargs="+", help="parquet files written by attnbench context-parallel")
    p.set_defaults(func=_cmd_merge)
