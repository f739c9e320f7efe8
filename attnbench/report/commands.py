"""Subcommands of the report: join results, write a stage's tables, render the report, publish the sweep.

  aggregate      validate and join microbench results files into one table
  tables         write one stage's tables, figures and index (attnbench.report.stages)
  compare        set two results files or sweep folders against each other, row by row, within noise
  render         execute the report notebooks, one section per stage, into one HTML file
  publish        log every stage to Weights & Biases (offline unless WANDB_API_KEY is set)
  wandb-report   build the W&B Report of an offline run's saved spec, once it is synced
  reference      assemble a sweep folder from the committed reference rows (results/reference/<gpu>/)
  reference-merge  merge the microbench or context-cost groups of a lease's pack into a reference folder
"""
from __future__ import annotations

import sys


def _cmd_aggregate(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.report.aggregate import load_results

    df = load_results(args.inputs)  # every input checked first: a bad one is one line, and nothing is written
    write_atomic(df, args.merged)
    counts = ", ".join(f"{k} {v}" for k, v in df.groupby("status").size().items())
    print(f"joined {len(args.inputs)} files, {len(df)} rows ({counts}) into {args.merged}", file=sys.stderr)
    return 0


def _cmd_tables(args) -> int:
    from attnbench.report.stages import write

    index = write(args.stage, args.results, tuple(args.part))
    print(f"attnbench tables {args.stage}: {len(index['tables'])} tables, {len(index['figures'])} figures "
          f"({sum(t['empty'] for t in index['tables'])} without rows)", file=sys.stderr)
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


def _cmd_render(args) -> int:
    from attnbench.report.notebook import render, section_sources

    sources = section_sources(args.notebooks)
    out = render(sources, args.results, args.out, planned=tuple(args.stage) if args.stage else None,
                 keep_notebook=args.keep_notebook, notebooks_dir=args.notebooks)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


def _cmd_publish(args) -> int:
    from attnbench.report.publish import publish

    receipt = publish(args.results, args.out, stages=args.stage, project=args.project, entity=args.entity,
                      tags=args.tag)
    print(f"attnbench publish: {receipt['mode']} run {receipt['run_id']} in {receipt['run_dir']}"
          + (f"; upload later with: {receipt['sync']}" if receipt["sync"] else f"; {receipt['url']}"), file=sys.stderr)
    return 0


def _cmd_wandb_report(args) -> int:
    from attnbench.report.wandb_report import save_report

    print(f"attnbench wandb-report: saved {save_report(args.spec, entity=args.entity)}", file=sys.stderr)
    return 0


def _cmd_reference(args) -> int:
    from attnbench.report.reference import assemble

    folder = assemble(args.name, args.rows, args.out)
    print(f"attnbench reference: assembled {folder}; render it with: attnbench render --results {folder} "
          f"--out reports/reference/<gpu>/{'' if args.name == 'sweep' else args.name + '/'}report.html", file=sys.stderr)
    return 0


def _cmd_reference_merge(args) -> int:
    from attnbench.report.reference_merge import merge

    groups = args.groups.split(",") if args.groups else None
    counts = merge(args.pack, args.into, groups, args.gpu)
    print(f"attnbench reference-merge: {', '.join(f'{g} {n} rows' for g, n in counts.items())} into {args.into}; "
          "then render its report again (attnbench reference <report>, attnbench render)", file=sys.stderr)
    return 0


def _min_margin(value: float | None) -> float:
    """``--min-margin``, or the schema's default of ``report.min_margin``."""
    from attnbench.report.tables import DEFAULT_MIN_MARGIN

    return DEFAULT_MIN_MARGIN if value is None else value


def add_commands(sub) -> None:
    from attnbench.report.reference import REPORTS
    from attnbench.report.stages import STAGE_REPORTS

    p = sub.add_parser("aggregate", help="validate and join microbench results files into one table")
    p.add_argument("--merged", required=True, help="the joined results parquet")
    p.add_argument("inputs", nargs="+", help="results files (parquet or csv)")
    p.set_defaults(func=_cmd_aggregate)

    p = sub.add_parser("tables", help="write one stage's tables, figures and index.json")
    p.add_argument("stage", choices=list(STAGE_REPORTS))
    p.add_argument("--results", required=True, help="the sweep's folder, results/<sweep>")
    p.add_argument("--part", action="append", default=[],
                   help="a planned unit the stage reads (pretrain: an experiment; stability: <group>/<process>)")
    p.set_defaults(func=_cmd_tables)

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

    p = sub.add_parser("render", help="execute the report notebooks (jupytext py:percent) into one HTML file")
    p.add_argument("--results", required=True, help="the sweep's folder, results/<sweep> (stage indexes and tables)")
    p.add_argument("--out", required=True)
    p.add_argument("--notebooks", default="workflow/notebooks", help="folder of the section notebooks, <section>.py")
    p.add_argument("--stage", action="append", default=[],
                   help="a stage the sweep planned (repeatable); default: every stage that wrote its index")
    p.add_argument("--keep-notebook", help="also write the executed .ipynb here")
    p.set_defaults(func=_cmd_render)

    p = sub.add_parser("publish", help="log every stage to Weights & Biases (offline unless WANDB_API_KEY is set)")
    p.add_argument("--results", required=True, help="the sweep's folder, results/<sweep>")
    p.add_argument("--stage", action="append", default=[],
                   help="a stage whose tables and figures to log (repeatable); default: every stage with an index")
    p.add_argument("--project", default="attnbench")
    p.add_argument("--entity")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--out", required=True, help="JSON receipt: mode, run id, run dir, what was logged")
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser("wandb-report", help="build and save the W&B Report of a run's saved spec (needs a key)")
    p.add_argument("--spec", required=True, help="report-spec.json that `attnbench publish` saved in the run's files")
    p.add_argument("--entity", help="W&B entity (default: the spec's, else the key's default)")
    p.set_defaults(func=_cmd_wandb_report)

    p = sub.add_parser("reference", help="assemble a sweep folder from committed reference rows, for render")
    p.add_argument("name", choices=list(REPORTS), help="which reference report")
    p.add_argument("--rows", default="results/reference/h200", help="the committed rows' folder")
    p.add_argument("--out", required=True, help="the sweep folder to write (e.g. results/reference-h200)")
    p.set_defaults(func=_cmd_reference)

    p = sub.add_parser("reference-merge",
                       help="merge the microbench or context-cost groups of a lease's pack into a reference folder")
    p.add_argument("pack", help="the $OUT/<sweep>.tar.gz a call of scripts/lease.sh returned")
    p.add_argument("--into", required=True, help="the committed folder, results/reference/<gpu>/<folder>")
    p.add_argument("--groups", metavar="GROUP[,GROUP...]", help="the groups to merge (default: every one in the pack)")
    p.add_argument("--gpu", help="the call's $OUT/gpu.txt, kept as gpu-<sha>.txt")
    p.set_defaults(func=_cmd_reference_merge)
