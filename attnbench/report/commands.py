"""Subcommands of the report: join results, render the report, publish the sweep.

  aggregate      validate and join results files; write tables and figures
  render         execute the report notebooks into one HTML file
  publish        log the sweep to Weights & Biases (offline unless WANDB_API_KEY is set)
"""
from __future__ import annotations

import sys


def _cmd_aggregate(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.files import staged_folders
    from attnbench.report.aggregate import load_results
    from attnbench.report.figures import write_figures
    from attnbench.report.tables import write_tables

    df = load_results(args.inputs)  # every input checked first: a bad one is one line, and nothing is written
    with staged_folders(args.tables, args.figures) as (tables_dir, figures_dir):  # old outputs stay until all are new
        index = write_tables(df, tables_dir)
        figures = write_figures(df, figures_dir)
    write_atomic(df, args.merged)
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


def add_commands(sub) -> None:
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
