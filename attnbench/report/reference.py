"""Assemble a sweep folder from the committed reference rows, so that the report renders from them.

``results/reference/h200/`` holds the sweep folders of reference runs through the pipeline (``paper/``,
``stability/``, ``backends/``, ``workloads/``, ``core/``, ``triton/``, the hbm stage of ``h200-hbm`` in
``hbm/``, the context stage of ``h200-context`` in ``context/`` and the h200-pretrain experiments in
``pretrain/sweep/``). A report's sections come from several of them: :func:`assemble` copies them into the
layout of one ``results/<sweep>/`` (:mod:`attnbench.workflow.paths`) and writes every stage's tables,
figures and index with the same code the rules run; then ``attnbench render`` renders the report::

    attnbench reference sweep --out results/reference-h200
    attnbench render --results results/reference-h200 --out reports/reference/h200/report.html
    attnbench reference backends --out results/reference-h200-backends
    attnbench render --results results/reference-h200-backends --out reports/reference/h200/backends/report.html
    attnbench reference workloads --out results/reference-h200-workloads
    attnbench render --results results/reference-h200-workloads --out reports/reference/h200/workloads/report.html
    attnbench reference core --out results/reference-h200-core
    attnbench render --results results/reference-h200-core --out reports/reference/h200/core/report.html
    attnbench reference triton --out results/reference-h200-triton
    attnbench render --results results/reference-h200-triton --out reports/reference/h200/triton/report.html

Reports
  sweep      the paper sweep's microbench rows (paper/), the stability passes (stability/), hbm and its
             ledger, the pretraining experiments, context capability and cost
  backends   the FA3-README-style backend grid (backends/): fa4, cuDNN, FlashInfer, fa2/fa3 unavailable
  workloads  the real-workload sweep (workloads/): trace-driven ragged and chunked prefill, paged decode,
             attention variants
  core       the harness-core grid (core/): prefill and decode for the SDPA backends, eager, math, flex
  triton     our Triton kernels beside fa4, cuDNN and FA2 (triton/), with the compiler's report
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from attnbench.bench.results import to_frame, write_atomic
from attnbench.report import stages
from attnbench.workflow import paths

# each reference report and the sweep folder it starts from (a folder that a reference run wrote)
SWEEP_FOLDERS = {"sweep": "paper", "backends": "backends", "workloads": "workloads", "core": "core",
                 "triton": "triton"}
REPORTS = tuple(SWEEP_FOLDERS)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _pretrain(rows: Path, out: Path) -> list[str]:
    """One folder per experiment (the layout `experiment run` writes), copied from the h200-pretrain sweep's own
    folder (``sweep/``) for each experiment that has landed there (``lease.sh h200-pretrain:<experiment>``)."""
    from attnbench.train import experiments as ex

    landed = [name for name in ex.EXPERIMENTS
              if paths.within(rows / "sweep", paths.PRETRAIN_RUNS, experiment=name).is_file()]
    for name in landed:
        source = paths.within(rows / "sweep", paths.PRETRAIN_DIR, experiment=name)
        for frame in sorted(source.glob("*.parquet")):
            _copy(frame, paths.within(out, paths.PRETRAIN_DIR, experiment=name) / frame.name)
    return landed


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
    sweep = rows / SWEEP_FOLDERS[name]
    _env(sweep, out)
    write_atomic(to_frame(pd.read_parquet(sweep / "microbench.parquet")), paths.within(out, paths.MERGED))
    if name == "sweep":
        parts["stability"] = _stability(rows / "stability", out)
        _copy(rows / "hbm" / "hbm.parquet", paths.within(out, paths.HBM_TABLE))
        _copy(rows / "hbm" / "ledger.parquet", paths.within(out, paths.HBM_LEDGER))
        parts["hbm"] = []
        parts["pretrain"] = _pretrain(rows / "pretrain", out)
        for merged in (paths.CONTEXT_CAPABILITY_ALL, paths.CONTEXT_COST_ALL, paths.CONTEXT_ROPE):
            # the h200-context sweep's folder holds its results/<sweep>/context/ files
            _copy(rows / "context" / Path(merged).name, paths.within(out, merged))
        parts["context"] = []
    if name == "triton":
        _copy(sweep / "triton" / "compiler.parquet", paths.within(out, paths.TRITON_COMPILER))
        parts["triton"] = []
    for stage, stage_parts in parts.items():
        stages.write(stage, out, tuple(stage_parts))
    return out
