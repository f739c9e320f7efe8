#!/usr/bin/env python3
"""Paper-style tables and figures of committed GPU-scale pretraining rows (CPU only; no training).

``scripts/h200_pretrain.sh`` writes one ``pretrain_runs.parquet`` and one ``pretrain_steps.parquet`` for all the
experiments it ran (column ``experiment``) and, with divergence, ``pretrain_divergence.parquet`` (column ``table``:
``weight_divergence``, ``numerics_vs_fp64``). This splits them into the per-experiment frames that
:func:`attnbench.report.pretrain.render` reads (the layout ``attnbench experiment run`` writes) and renders each
experiment into ``<out>/tables`` and ``<out>/figures``, as the Snakemake pretraining rules do for CPU runs.

usage: python3 scripts/pretrain_reference_report.py [--in results/reference/h200/pretrain]
                                                     [--out reports/reference/h200/pretrain]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from attnbench.train import experiments as ex
from attnbench.report.pretrain import render

DIVERGENCE_TABLES = {"weight_divergence": "divergence.parquet", "numerics_vs_fp64": "numerics.parquet"}


def split(rows: Path, work: Path) -> list[str]:
    """Write each experiment's runs/steps (and divergence's two extra frames) under ``work/<experiment>``."""
    runs = pd.read_parquet(rows / "pretrain_runs.parquet")
    steps = pd.read_parquet(rows / "pretrain_steps.parquet")
    extra_path = rows / "pretrain_divergence.parquet"
    extra = pd.read_parquet(extra_path) if extra_path.is_file() else pd.DataFrame(columns=["table"])
    names = [name for name in ex.EXPERIMENTS if (runs["experiment"] == name).any()]
    for name in names:
        folder = work / name
        folder.mkdir(parents=True)
        runs[runs["experiment"] == name].to_parquet(folder / "runs.parquet", index=False)
        steps[steps["experiment"] == name].to_parquet(folder / "steps.parquet", index=False)
        if name == "divergence":
            for table, file in DIVERGENCE_TABLES.items():
                # one file holds both tables: a column only the other table has is all empty here
                own = extra[extra["table"] == table].drop(columns="table").dropna(axis=1, how="all")
                own.to_parquet(folder / file, index=False)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in", dest="rows", default="results/reference/h200/pretrain", type=Path)
    parser.add_argument("--out", default="reports/reference/h200/pretrain", type=Path)
    args = parser.parse_args()
    for name in ("pretrain_runs.parquet", "pretrain_steps.parquet"):
        if not (args.rows / name).is_file():
            sys.exit(f"--in={args.rows}: {name} is missing (scripts/h200_pretrain.sh writes it)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in split(args.rows, Path(tmp)):
            for path in render(name, Path(tmp) / name, args.out):
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
