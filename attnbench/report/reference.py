"""Assemble a sweep folder from the committed reference rows, so that the report renders from them.

``results/reference/h200/`` holds the sweep folders of reference runs through the pipeline (``paper/``,
``stability/``, ``backends/``, ``workloads/``, ``core/``, ``triton/``, the hbm stage of ``h200-hbm`` in
``hbm/`` and the context stage of ``h200-context`` in ``context/``, the h200-pretrain experiments that have
landed in ``pretrain/sweep/``) beside the FP8 rows a time-boxed GPU script wrote before the pipeline ran every
stage, in its own file layout (``pretrain/pretrain_*.parquet``; docs/reference-runs.md). :func:`assemble`
copies (and, where a file held several stages' parts, splits) them into the layout of ``results/<sweep>/``
(:mod:`attnbench.workflow.paths`) and writes every stage's tables, figures and index with the same
code the rules run; then ``attnbench render`` renders the report::

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

from attnbench.bench.results import to_frame
from attnbench.report import stages
from attnbench.workflow import paths

# each reference report and the sweep folder it starts from (a folder that a reference run wrote)
SWEEP_FOLDERS = {"sweep": "paper", "backends": "backends", "workloads": "workloads", "core": "core",
                 "triton": "triton"}
REPORTS = tuple(SWEEP_FOLDERS)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def upgrade(runs: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, steps) of the retired script's FP8 rows with today's columns: one seed (0) whose initial weights
    and data order are both that seed, the GELU MLP and the precision as the variant, and both spike scores
    recomputed from the committed step logs at their definitions (:func:`attnbench.train.stability.spike_summary`)."""
    from attnbench.train import stability

    runs = runs.assign(init_seed=runs["seed"], data_seed=runs["seed"], seed=0, mlp_variant="gelu",
                       variant=runs["precision"])
    spikes = {run: stability.spike_summary(s["loss"].to_numpy(float), s["grad_norm"].to_numpy(float))
              for run, s in steps.groupby("run")}
    columns = pd.DataFrame.from_dict(spikes, orient="index")
    return runs.drop(columns=[c for c in columns if c in runs]).join(columns, on="run"), steps


def _pretrain(rows: Path, out: Path) -> list[str]:
    """One folder per experiment (the layout `experiment run` writes): the h200-pretrain sweep's own folder
    for each experiment that has landed in ``sweep/`` (``lease.sh h200-pretrain:<experiment>``); FP8, until it
    lands, from the retired script's rows (``pretrain_runs.parquet``, ``pretrain_steps.parquet``), brought to
    today's columns (:func:`upgrade`)."""
    from attnbench.train import experiments as ex

    landed = [name for name in ex.EXPERIMENTS
              if paths.within(rows / "sweep", paths.PRETRAIN_RUNS, experiment=name).is_file()]
    for name in landed:
        source = paths.within(rows / "sweep", paths.PRETRAIN_DIR, experiment=name)
        for frame in sorted(source.glob("*.parquet")):
            _copy(frame, paths.within(out, paths.PRETRAIN_DIR, experiment=name) / frame.name)
    retired = []
    if "fp8" not in landed and (rows / "pretrain_runs.parquet").is_file():
        runs, steps = upgrade(pd.read_parquet(rows / "pretrain_runs.parquet"),
                              pd.read_parquet(rows / "pretrain_steps.parquet"))
        folder = paths.within(out, paths.PRETRAIN_DIR, experiment="fp8")
        folder.mkdir(parents=True, exist_ok=True)
        runs.to_parquet(folder / "runs.parquet", index=False)
        steps.to_parquet(folder / "steps.parquet", index=False)
        retired = ["fp8"]
    return [name for name in ex.EXPERIMENTS if name in landed or name in retired]


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
    to_frame(pd.read_parquet(sweep / "microbench.parquet")).to_parquet(paths.within(out, paths.MERGED), index=False)
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
