"""Assemble a sweep folder from the committed reference rows, so that the report renders from them.

``results/reference/h200/`` holds rows that time-boxed GPU runs wrote before the pipeline ran every
stage, in their own file layout (docs/reference-runs.md). :func:`assemble` copies (and, where a
file held several stages' parts, splits) them into the layout of ``results/<sweep>/``
(:mod:`attnbench.workflow.paths`) and writes every stage's tables, figures and index with the same
code the rules run; then ``attnbench render`` renders the report::

    attnbench reference sweep --out results/reference-h200
    attnbench render --results results/reference-h200 --out reports/reference/h200/report.html
    attnbench reference backends --out results/reference-h200-backends
    attnbench render --results results/reference-h200-backends --out reports/reference/h200/backends/report.html

Reports
  sweep      the paper sweep's microbench rows (pipeline/), the stability passes, hbm and its ledger,
             the pretraining experiments, context capability and cost
  backends   the FA3-README-style backend grid (backends/): fa4, cuDNN, FlashInfer, fa2/fa3 unavailable
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from attnbench.bench.results import to_frame
from attnbench.report import stages
from attnbench.workflow import paths

REPORTS = ("sweep", "backends")
PROVENANCE = ("device", "device_name", "driver", "torch_version", "cuda_version", "cudnn_version", "triton_version",
              "python_version", "git_sha", "host")
# scripts/h200_pretrain.sh wrote the divergence experiment's two extra frames into one file (column table)
DIVERGENCE_TABLES = {"weight_divergence": "divergence.parquet", "numerics_vs_fp64": "numerics.parquet"}


def ceilings_from_rows(df: pd.DataFrame) -> dict:
    """The ceilings a run's rows were judged against (each row keeps its copy bandwidth and its dtype's
    matmul ceiling), as ``attnbench ceilings`` writes them."""
    rows = df.dropna(subset=["peak_bytes_per_s"])
    first = rows.sort_values("timestamp").iloc[0]
    return {"device": first["device"], "device_name": first["device_name"],
            "copy_bytes_per_s": float(rows["peak_bytes_per_s"].median()),
            "matmul_flops_per_s": {str(d): float(v) for d, v in rows.groupby("dtype", observed=True)["peak_flops"]
                                   .median().dropna().items()},
            "measured_at": f"the run's start (its first row: {first['timestamp']})"}


def versions_from_rows(df: pd.DataFrame, why: str) -> dict:
    """Provenance as ``attnbench env`` writes it, from the rows' own provenance columns and statuses."""
    first = df.sort_values("timestamp").iloc[0]
    versions = {k: (None if pd.isna(first.get(k)) else str(first.get(k))) for k in PROVENANCE}
    versions.update(why=why, sweep=str(first["sweep"]), packages={})
    backends = {}
    for name, rows in df.groupby("backend", sort=False, observed=True):
        unavailable = rows[rows["status"] == "unavailable"]
        backends[name] = {"available": unavailable.empty, "version": str(rows["backend_version"].dropna().iloc[0])
                          if rows["backend_version"].notna().any() else "",
                          "reason": "" if unavailable.empty else str(unavailable["reason"].iloc[0])}
    versions["backends"] = backends
    return versions


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")


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
    """The retired stability script wrote both processes into one file (column ``pass``)."""
    df = pd.read_parquet(rows / "stability.parquet")
    parts = []
    for process, frame in df.groupby("pass"):
        group = str(frame["group"].iloc[0])
        target = paths.within(out, paths.STABILITY, group=group, index=int(process))
        target.parent.mkdir(parents=True, exist_ok=True)
        to_frame(frame.drop(columns="pass")).to_parquet(target, index=False)
        parts.append(f"{group}/{int(process)}")
    return parts


def assemble(name: str, rows: str | Path, out: str | Path) -> Path:
    """Build the sweep folder ``out`` of reference report ``name`` from the committed rows in ``rows``."""
    if name not in REPORTS:
        raise ValueError(f"reference report {name!r} is not known; allowed: {', '.join(REPORTS)}")
    rows, out = Path(rows), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = paths.within(out, paths.ENV)
    parts: dict[str, list[str]] = {"env": []}
    if name == "sweep":
        merged = to_frame(pd.read_parquet(rows / "pipeline" / "microbench-paper.parquet"))
        versions = rows.parents[1] / "reports" / rows.name / "versions.json"  # the paper run's own env capture
        if versions.is_file():
            _copy(versions, env / "versions.json")
        else:
            _write_json(env / "versions.json", versions_from_rows(merged, "the paper sweep's rows"))
        _write_json(env / "ceilings.json", ceilings_from_rows(merged))
        merged.to_parquet(paths.within(out, paths.MERGED), index=False)
        parts["microbench"] = []
        parts["stability"] = _stability(rows / "stability", out)
        _copy(rows / "hbm" / "hbm.parquet", paths.within(out, paths.HBM_TABLE))
        _copy(rows / "hbm" / "ledger.parquet", paths.within(out, paths.HBM_LEDGER))
        parts["hbm"] = []
        parts["pretrain"] = _pretrain(rows / "pretrain", out)
        _copy(rows / "context" / "context_capability.parquet", paths.within(out, paths.CONTEXT_CAPABILITY_ALL))
        _copy(rows / "context" / "context_cost.parquet", paths.within(out, paths.CONTEXT_COST_ALL))
        parts["context"] = []
    else:
        merged = to_frame(pd.read_parquet(rows / "backends" / "backends.parquet"))
        merged.to_parquet(paths.within(out, paths.MERGED), index=False)
        _copy(rows / "backends" / "ceilings.json", env / "ceilings.json")
        _write_json(env / "versions.json", versions_from_rows(merged, "the h200-backends run's rows"))
        parts["microbench"] = []
    for stage, stage_parts in parts.items():
        stages.write(stage, out, tuple(stage_parts))
    return out
