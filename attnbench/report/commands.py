"""Subcommands of the report: join results, render the report, publish the sweep.

  aggregate        validate and join results files; write the pairs table, tables and figures
  compare          set two results files or sweep folders against each other, row by row, within noise
  stability-table  the stability stage's tables: do independent passes agree within their intervals
  render           execute the report notebooks into one HTML file
  publish          log the sweep to Weights & Biases (offline unless WANDB_API_KEY is set)
"""
from __future__ import annotations

import sys


def _cmd_aggregate(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.bench.stats import pairs
    from attnbench.report.aggregate import load_results
    from attnbench.report.figures import write_figures
    from attnbench.report.tables import write_tables

    df = load_results(args.inputs)
    write_atomic(df, args.merged)
    pair_table = pairs(df, _min_margin(args.min_margin))
    if args.pairs:
        write_atomic(pair_table, args.pairs)
    index = write_tables(df, args.tables, pair_table, _min_margin(args.min_margin))
    figures = write_figures(df, args.figures)
    print(f"joined {len(args.inputs)} files, {len(df)} rows ({', '.join(f'{k} {v}' for k, v in df.groupby('status').size().items())}); "
          f"{len(pair_table)} pairs; {len(index)} tables, {len(figures)} figure files", file=sys.stderr)
    return 0


def _cmd_compare(args) -> int:
    from attnbench.report import compare

    base, new = compare.load_side(args.base), compare.load_side(args.new)
    table = compare.compare(base, new, args.threshold)
    text = compare.to_text(table, args.threshold) + compare.winners_summary(
        compare.winners(base, new, _min_margin(args.min_margin))) + "\n"
    print(f"attnbench compare: new {args.new} against base {args.base}\n\n{text}")
    if args.out:
        from pathlib import Path

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".csv":
            table.to_csv(out, index=False)
        else:
            out.write_text(f"new `{args.new}` against base `{args.base}`\n\n{text}")
    code = compare.exit_code(table)
    if code:
        print(f"attnbench compare: {(table['verdict'] == 'slower').sum()} rows slower beyond their interval and "
              f"{args.threshold:.0%}", file=sys.stderr)
    return code


def _cmd_stability_table(args) -> int:
    from attnbench.report import stability

    index = stability.write(args.inputs, args.out_dir, args.threshold, _min_margin(args.min_margin))
    summaries = " ".join(v["caption"].split(". ")[-1] for v in index.values())
    print(f"wrote {', '.join(index)} to {args.out_dir}: {summaries}", file=sys.stderr)
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


def _min_margin(value: float | None) -> float:
    """``--min-margin``, or the schema's default of ``report.min_margin``."""
    from attnbench.report.tables import DEFAULT_MIN_MARGIN

    return DEFAULT_MIN_MARGIN if value is None else value


def add_commands(sub) -> None:
    p = sub.add_parser("aggregate", help="validate and join results files; write tables and figures")
    p.add_argument("--merged", required=True, help="the joined results parquet")
    p.add_argument("--tables", required=True, help="folder for tables (md, tex, csv, index.json)")
    p.add_argument("--figures", required=True, help="folder for figures (png, svg)")
    p.add_argument("--pairs", help="write the paired ratios of every two backends of a job here (parquet)")
    p.add_argument("--min-margin", type=float,
                   help="report.min_margin: a claimed difference must exceed it (default: the schema's)")
    p.add_argument("inputs", nargs="+", help="results files (parquet or csv)")
    p.set_defaults(func=_cmd_aggregate)

    p = sub.add_parser("compare", help="NEW against BASE per (case, backend): ratio, 95%% interval, verdict; "
                                       "exit 1 when a row is slower beyond its interval and the threshold")
    p.add_argument("base", help="results file (parquet, csv) or sweep folder (results/<sweep>)")
    p.add_argument("new", help="results file or sweep folder")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="a row counts as slower or faster beyond this relative margin (default %(default)s)")
    p.add_argument("--min-margin", type=float,
                   help="report.min_margin, for the two sides' winners (default: the schema's)")
    p.add_argument("--out", help="also write the comparison here (.md, or .csv for the numbers)")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("stability-table", help="compare the passes of each stability group (tables and index.json)")
    p.add_argument("--out-dir", required=True, help="folder for the tables (md, tex, csv, parquet, index.json)")
    p.add_argument("--threshold", type=float, default=0.05, help="compare's threshold for the verdict column")
    p.add_argument("--min-margin", type=float, help="report.min_margin, for the pairs (default: the schema's)")
    p.add_argument("inputs", nargs="+", help="pass files results/<sweep>/stability/<group>/<i>.parquet")
    p.set_defaults(func=_cmd_stability_table)

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
