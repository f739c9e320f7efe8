"""``attnbench triton precompile | report``: the triton stage's subcommands (listed in cli.COMMAND_MODULES).

  triton precompile  compile every config the job's triton cases need, in parallel processes (GPU)
  triton report      the compiler report (configs, registers, spills, SASS mix, difference from cuDNN)
"""
from __future__ import annotations

import sys


def _cmd(args) -> int:
    import pandas as pd

    from attnbench.bench.results import write_atomic
    from attnbench.plan import job_cases, read_job

    job = read_job(args.job, ({"precompile": "triton-precompile", "report": "triton-compiler"}[args.action],))
    cases, device = job_cases(job), job["device"]
    if args.action == "precompile":
        from attnbench.compiler.precompile import precompile, tasks_for

        tasks = tasks_for(cases, job["backends"]) if device == "cuda" else []
        print(f"attnbench triton precompile: {len(tasks)} kernel configs", file=sys.stderr)
        rows = precompile(tasks)
    else:
        from attnbench.compiler.report import compiler_rows

        print(f"attnbench triton report: {len(cases)} cases x {', '.join(job['backends'])}", file=sys.stderr)
        rows = compiler_rows(cases, job["backends"], device, seed=job["seed"])
    df = pd.DataFrame(rows)
    write_atomic(df, args.out)
    counts = df.groupby("status").size().to_dict() if len(df) else {}
    print(f"wrote {len(df)} rows to {args.out}: {counts}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    parser = sub.add_parser("triton", help="our Triton kernels: precompile their configs, report on the compiler")
    parser.add_argument("action", choices=["precompile", "report"])
    parser.add_argument("--job", required=True, help="the plan file: results/<sweep>/plan/precompile/triton.json, or plan/triton/compiler.json")
    parser.add_argument("--out", required=True)
    parser.set_defaults(func=_cmd)
