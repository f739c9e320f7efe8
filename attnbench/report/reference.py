"""Assemble a sweep folder from the committed reference rows, so that the report renders from them.

``results/reference/h200/`` holds the sweep folders of reference runs through the pipeline (``paper/``,
``stability/``, ``backends/``) beside rows that time-boxed GPU runs wrote before it ran every stage, in
their own file layout (``hbm/``, ``pretrain/``, ``context/``; docs/reference-runs.md). :func:`assemble`
copies (and, where a file held several stages' parts, splits) them into the layout of ``results/<sweep>/``
(:mod:`attnbench.workflow.paths`) and writes every stage's tables, figures and index with the same
code the rules run; then ``attnbench render`` renders the report::

    attnbench reference sweep --out results/reference-h200
    attnbench render --results results/reference-h200 --out reports/reference/h200/report.html
    attnbench reference backends --out results/reference-h200-backends
    attnbench render --results results/reference-h200-backends --out reports/reference/h200/backends/report.html

Reports
  sweep      the paper sweep's microbench rows (paper/), the stability passes (stability/), hbm and its
             ledger, the pretraining experiments, context capability and cost
  backends   the FA3-README-style backend grid (backends/): fa4, cuDNN, FlashInfer, fa2/fa3 unavailable
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from attnbench.bench.results import to_frame
from attnbench.report import stages
from attnbench.workflow import paths

REPORTS = ("sweep", "backends")
# scripts/h200_pretrain.sh wrote the divergence experiment's two extra frames into one file (column table)
DIVERGENCE_TABLES = {"weight_divergence": "divergence.parquet", "numerics_vs_fp64": "numerics.parquet"}


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _pretrain(rows: Path, out: Path) -> list[str]:
    """Split the single runs/steps files into one folder per experiment (the layout `experiment run` writes)."""
    from attnbench.train import experiments as ex

    runs = pd.read_parquet(rows / "pretrain_runs.parquet")
    steps = pd.read_parquet(rows / "pretrain_steps.parquet")
    extra_path = rows / "pretrain_divergence.parquet"
    extra = pd.read_parquet(extra_path) if extra_path.is_file() else pd.DataFrame(columns=["table"])
    names = [name for name in ex.EXPERIMENTS if (runs["experiment"] == name).any()]
    for name in names:
        folder = paths.within(out, paths.PRETRAIN_DIR, experiment=name)
        folder.mkdir(parents=True, exist_ok=True)
        runs[runs["experiment"] == name].to_parquet(folder / "runs.parquet", index=False)
        steps[steps["experiment"] == name].to_parquet(folder / "steps.parquet", index=False)
        if name == "divergence":
            for table, file in DIVERGENCE_TABLES.items():
                # one file held both tables: a column only the other table has is all empty here
                own = extra[extra["table"] == table].drop(columns="table").dropna(axis=1, how="all")
                own.to_parquet(folder / file, index=False)
    return names


def _stability(rows: Path, out: Path) -> list[str]:
    """The stability sweep's passes, ``stability/<group>/<process>.parquet``, into ``out``; their part names."""
    parts = []
    for path in sorted(rows.glob("stability/*/*.parquet"), key=lambda p: (p.parent.name, int(p.stem))):
        _copy(path, paths.within(out, paths.STABILITY, group=path.parent.name, index=int(path.stem)))
        parts.append(f"{path.parent.name}/{path.stem}")
    return parts


def _env(sweep: Path, out: Path) -> None:
    """A reference sweep's own env files (effective config, versions, ceilings)."""
    for name in ("config.yaml", "versions.json", "ceilings.json"):
        _copy(sweep / "env" / name, paths.within(out, paths.ENV) / name)


def assemble(name: str, rows: str | Path, out: str | Path) -> Path:
    """Build the sweep folder ``out`` of reference report ``name`` from the committed rows in ``rows``."""
    if name not in REPORTS:
        raise ValueError(f"reference report {name!r} is not known; allowed: {', '.join(REPORTS)}")
    rows, out = Path(rows), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[str]] = {"env": [], "microbench": []}
    sweep = rows / ("paper" if name == "sweep" else "backends")  # sweep folders of reference runs
    _env(sweep, out)
    to_frame(pd.read_parquet(sweep / "microbench.parquet")).to_parquet(paths.within(out, paths.MERGED), index=False)
    if name == "sweep":
        parts["stability"] = _stability(rows / "stability", out)
        _copy(rows / "hbm" / "hbm.parquet", paths.within(out, paths.HBM_TABLE))
        _copy(rows / "hbm" / "ledger.parquet", paths.within(out, paths.HBM_LEDGER))
        parts["hbm"] = []
        parts["pretrain"] = _pretrain(rows / "pretrain", out)
        _copy(rows / "context" / "context_capability.parquet", paths.within(out, paths.CONTEXT_CAPABILITY_ALL))
        _copy(rows / "context" / "context_cost.parquet", paths.within(out, paths.CONTEXT_COST_ALL))
        parts["context"] = []
    for stage, stage_parts in parts.items():
        stages.write(stage, out, tuple(stage_parts))
    return out
