"""Every stage's report outputs, and the report's sections, in one registry.

A :class:`StageReport` says what one stage shows: :attr:`~StageReport.names` lists the tables and
figures it writes (known at Snakemake parse time, so that rules declare them and ``snakemake
--report`` shows them), :attr:`~StageReport.build` makes them from the stage's aggregated files
inside a sweep folder. ``attnbench tables <stage> --results results/<sweep>`` runs one
(:func:`write`), writing ``<stage>/{tables,figures}/`` and ``<stage>/tables/index.json``
(:mod:`attnbench.report.artifacts`). ``parts`` are a stage's planned units whose files it reads
(pretraining experiments; stability jobs ``<group>/<process>``); other stages take none.

:data:`SECTIONS` is the executed report's order (data-flow order): each section is one notebook,
``workflow/notebooks/<name>.py``, under a heading naming it; a section whose stages did not run is
one line saying so. Adding a stage: ``workflow/rules/ADD_STAGE.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.files import read_json, read_parquet
from attnbench.report.artifacts import StageOutputs, write_stage
from attnbench.workflow import paths


@dataclass(frozen=True)
class StageReport:
    stage: str
    title: str  # the heading of its section and its category in `snakemake --report`
    names: Callable[[tuple[str, ...]], tuple[tuple[str, ...], tuple[str, ...]]]  # parts -> (tables, figures)
    build: Callable[[Path, tuple[str, ...]], StageOutputs]  # (sweep folder, parts) -> outputs


def _env(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import env

    return env.build(read_json(paths.within(results, paths.CEILINGS), "ceilings file (attnbench ceilings)"),
                     read_json(paths.within(results, paths.VERSIONS), "versions file (attnbench env)"))


def _microbench(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import backends, figures, tables, triton, workloads

    df = read_parquet(paths.within(results, paths.MERGED))
    return StageOutputs(tables.build_tables(df, min_margin=report_settings(results)["min_margin"]) + backends.build_tables(df) + workloads.build_tables(df)
                        + [triton.versus_best_table(df)],
                        figures.build_figures(df) + workloads.build_figures(df))


def _microbench_names(parts: tuple[str, ...]):
    from attnbench.report import backends, figures, tables, workloads

    return ((*tables.TABLE_NAMES, *backends.TABLE_NAMES, *workloads.TABLE_NAMES, "triton_vs_best"),
            (*figures.FIGURE_NAMES, *workloads.FIGURE_NAMES))


def stability_part(part: str) -> dict[str, str]:
    """A stability job's name, ``<group>/<process>``, as the wildcards of :data:`paths.STABILITY`."""
    group, process = part.rsplit("/", 1)
    return {"group": group, "index": process}


def report_settings(results: Path) -> dict:
    """The sweep's ``report`` section (``env/config.yaml``, written by the env job), else the schema's
    defaults (a sweep folder assembled from committed rows has no config)."""
    from attnbench.config import load_schema

    defaults = {key: spec["default"] for key, spec in load_schema("report")["properties"].items() if "default" in spec}
    config = paths.within(results, paths.ENV) / "config.yaml"
    if not config.is_file():
        return defaults
    import yaml

    return {**defaults, **(yaml.safe_load(config.read_text()) or {}).get("report", {})}


def _stability(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import stability

    groups: dict[str, dict[str, pd.DataFrame]] = {}
    for part in sorted(parts, key=lambda p: (stability_part(p)["group"], int(stability_part(p)["index"]))):
        wildcards = stability_part(part)
        groups.setdefault(wildcards["group"], {})[wildcards["index"]] = read_parquet(
            paths.within(results, paths.STABILITY, **wildcards))
    settings = report_settings(results)
    return stability.build(groups, settings["compare_threshold"], settings["min_margin"])


def _hbm(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import hbm

    return hbm.build(read_parquet(paths.within(results, paths.HBM_TABLE)),
                     read_parquet(paths.within(results, paths.HBM_LEDGER)))


def _triton(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import triton

    return StageOutputs([triton.compiler_table(read_parquet(paths.within(results, paths.TRITON_COMPILER)))])


def _pretrain(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import pretrain

    return pretrain.build({name: paths.within(results, paths.PRETRAIN_DIR, experiment=name) for name in parts})


def _pretrain_names(parts: tuple[str, ...]):
    from attnbench.report.pretrain import FIGURES, OUTPUTS

    return tuple(t for name in parts for t in OUTPUTS[name]), tuple(f for name in parts for f in FIGURES[name])


def _read_optional(path: Path) -> pd.DataFrame:
    """A merged file of a part the sweep may not plan (context capability without a GPU recipe, ...)."""
    return read_parquet(path) if path.is_file() else pd.DataFrame()


def _context(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import context

    return context.build(_read_optional(paths.within(results, paths.CONTEXT_CAPABILITY_ALL)),
                         _read_optional(paths.within(results, paths.CONTEXT_COST_ALL)),
                         _read_optional(paths.within(results, paths.CONTEXT_ROPE)))


def _context_parallel(results: Path, parts: tuple[str, ...]) -> StageOutputs:
    from attnbench.report import context_parallel

    return context_parallel.build(read_parquet(paths.within(results, paths.CP_TABLE)))


def _fixed(module: str):
    def names(parts: tuple[str, ...]):
        import importlib

        mod = importlib.import_module(f"attnbench.report.{module}")
        return tuple(mod.TABLE_NAMES), tuple(mod.FIGURE_NAMES)
    return names


STAGE_REPORTS: dict[str, StageReport] = {s.stage: s for s in (
    StageReport("env", "Environment and measured ceilings",
                lambda parts: (("ceilings", "provenance", "backends"), ()), _env),
    StageReport("microbench", "Microbenchmarks", _microbench_names, _microbench),
    StageReport("stability", "Timing stability across processes", _fixed("stability"), _stability),
    StageReport("hbm", "HBM traffic and the KV-cache ledger", _fixed("hbm"), _hbm),
    StageReport("triton", "Our Triton kernels: the compiler's report", lambda parts: (("compiler",), ()), _triton),
    StageReport("pretrain", "Pretraining experiments", _pretrain_names, _pretrain),
    StageReport("context", "Context extension", _fixed("context"), _context),
    StageReport("context_parallel", "Context parallelism over N ranks", _fixed("context_parallel"),
                _context_parallel),
)}


def reported_stages(plan) -> list[str]:
    """The planned stages (``plan.stages``, in order) that plan at least one job: those whose index the report
    reads (a stage in ``stages:`` whose section names no groups runs nothing and is reported as not run)."""
    with_jobs = {job.stage.split("-")[0] for job in plan.jobs()}  # microbench-rule, context-cost: their stage's
    return [stage for stage in plan.stages if stage in with_jobs]


def stage_report(stage: str) -> StageReport:
    if stage not in STAGE_REPORTS:
        raise ValueError(f"stage={stage!r} has no report outputs; allowed: {', '.join(STAGE_REPORTS)}")
    return STAGE_REPORTS[stage]


def write(stage: str, results: str | Path, parts: tuple[str, ...] = ()) -> dict:
    """Build ``stage``'s outputs from the sweep folder ``results`` and write them with their index.

    The written names must be the declared ones (:attr:`StageReport.names`): a rule that declared
    other files would fail after the work, so a mismatch is an error naming both lists here.
    """
    report = stage_report(stage)
    results = Path(results)
    outputs = report.build(results, tuple(parts))
    declared = report.names(tuple(parts))
    built = (tuple(t.name for t in outputs.tables), tuple(f.name for f in outputs.figures))
    if tuple(map(sorted, built)) != tuple(map(sorted, declared)):
        raise ValueError(f"stage {stage}: built tables/figures {built} differ from the declared {declared}")
    return write_stage(stage, outputs, paths.within(results, paths.STAGE_DIR, stage=stage))


def declared_outputs(stage: str, stage_dir: str, parts: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The files :func:`write` writes for ``stage`` under ``stage_dir``, for a rule's ``output:``.

    ``tables``/``figures``: one per table (CSV) and figure (PNG), what ``snakemake --report`` shows;
    ``table_files``/``figure_files``: the other formats; ``index``: the stage index.
    """
    from attnbench.report.artifacts import FIGURE_FORMATS, TABLE_FORMATS

    tables, figures = stage_report(stage).names(tuple(parts))
    return {"index": [f"{stage_dir}/tables/index.json"],
            "tables": [f"{stage_dir}/tables/{name}.csv" for name in tables],
            "table_files": [f"{stage_dir}/tables/{name}.{ext}" for name in tables for ext in TABLE_FORMATS
                            if ext != "csv"],
            "figures": [f"{stage_dir}/figures/{name}.png" for name in figures],
            "figure_files": [f"{stage_dir}/figures/{name}.{ext}" for name in figures for ext in FIGURE_FORMATS
                             if ext != "png"]}


def index_labels(stage_dir: str, kind: str, name: str):
    """A ``labels=`` function for ``snakemake --report``: the entry's name, group and caption, read from the
    stage's index when the report is made (never while the workflow runs, so it triggers no rerun)."""
    def labels(wildcards) -> dict[str, str]:
        from attnbench.report.artifacts import read_index

        try:
            entries = {e["name"]: e for e in read_index(f"{stage_dir}/tables/index.json")[kind]}
        except (OSError, ValueError):
            entries = {}
        entry = entries.get(name, {})
        return {"name": name, "group": entry.get("group", ""), "caption": entry.get("caption", "")}
    return labels


@dataclass(frozen=True)
class Section:
    """One section of the executed report: ``workflow/notebooks/<name>.py`` under the heading ``title``."""

    name: str
    title: str
    stages: tuple[str, ...]  # it runs when any of these ran (``env`` always does)


SECTIONS: tuple[Section, ...] = (
    Section("env", "Environment and measured ceilings", ("env",)),
    Section("microbench", "Microbenchmarks: roofline, throughput against context, who wins where", ("microbench",)),
    Section("backends", "Backend tables in the FlashAttention-3 README's layout", ("microbench",)),
    Section("workloads", "Real workloads: traces, ragged batches, attention variants", ("microbench",)),
    Section("stability", "Timing stability across fresh processes", ("stability",)),
    Section("hbm", "HBM traffic: measured against modelled bytes, and the KV bytes/token ledger", ("hbm",)),
    Section("triton", "Our Triton kernel against the best backends", ("microbench", "triton")),
    Section("pretrain", "Pretraining: divergence, LR sensitivity, FP8, layouts", ("pretrain",)),
    Section("context", "Context extension: perplexity against length, and cost", ("context",)),
    Section("context_parallel", "Context parallelism: attention sharded over N ranks, its scaling and its cost",
            ("context_parallel",)),
)


def section(name: str) -> Section:
    found = {s.name: s for s in SECTIONS}
    if name not in found:
        raise ValueError(f"report section {name!r} is not known; allowed: {', '.join(found)}")
    return found[name]


def ran(sec: Section, planned: tuple[str, ...] | None, results: str | Path) -> bool:
    """Whether a section has something to show: one of its stages is planned (when the plan is known) and
    wrote its index."""
    return any((planned is None or stage == "env" or stage in planned)
               and paths.within(results, paths.STAGE_INDEX, stage=stage).is_file() for stage in sec.stages)
