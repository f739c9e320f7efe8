#!/usr/bin/env python3
"""Paper-style tables and figures of committed GPU-scale pretraining rows (CPU only; no training).

``scripts/h200_pretrain.sh`` wrote one ``pretrain_runs.parquet`` and one ``pretrain_steps.parquet`` for all the
experiments it ran (column ``experiment``) and, with divergence, ``pretrain_divergence.parquet`` (column ``table``:
``weight_divergence``, ``numerics_vs_fp64``). This splits them into the per-experiment frames that
:func:`attnbench.report.pretrain.render` reads (the layout ``attnbench experiment run`` writes), brings the rows of
that older layout to today's columns (:func:`upgrade`), and renders each experiment into ``<out>/tables`` and
``<out>/figures``, as the Snakemake pretraining rules do.

What :func:`upgrade` does to the older rows: one seed (0) whose initial weights and data order are both that
seed; the runs' tags as today's divergence plan writes them (sdpa-math the reference, every other backend a
kernel arm against it, fp32 the precision arm, and the old seed swap, which changed the initial weights and the
data order together, as its own arm ``init_and_data_seed``); both spike scores recomputed from the committed step
logs at their definitions (:func:`attnbench.train.stability.spike_summary`); the weight divergence's pooled
Wasserstein distance kept as ``wasserstein_pooled`` (today's per-tensor ``w1_mean`` and ``w1_max`` are empty).

usage: python3 scripts/pretrain_reference_report.py [--in results/reference/h200/pretrain]
                                                     [--out reports/reference/h200/pretrain]
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd

from attnbench.train import experiments as ex
from attnbench.train import stability
from attnbench.report.pretrain import render

DIVERGENCE_TABLES = {"weight_divergence": "divergence.parquet", "numerics_vs_fp64": "numerics.parquet"}
OLD_ROLES = {"reference": ("reference", ""), "backend": ("kernel", "sdpa-math"),
             "precision": ("precision", "sdpa-math"), "seed": ("init_and_data_seed", "sdpa-math")}


def upgrade(name: str, runs: pd.DataFrame, steps: pd.DataFrame, div: pd.DataFrame | None = None):
    """(runs, steps, divergence) of the older layout with today's columns (see the module docstring)."""
    runs, steps = runs.copy(), steps.copy()
    if "init_seed" not in runs:
        runs = runs.assign(init_seed=runs["seed"], data_seed=runs["seed"], seed=0)
    spikes = {run: stability.spike_summary(s["loss"].to_numpy(float), s["grad_norm"].to_numpy(float))
              for run, s in steps.groupby("run")}
    columns = pd.DataFrame.from_dict(spikes, orient="index")
    runs = runs.drop(columns=[c for c in columns if c in runs]).join(columns, on="run")
    if name == "divergence" and "swap" in runs:
        variant = {r["run"]: "sdpa-math" if r["swap"] == "reference" else
                   r["backend"] if r["swap"] == "backend" else f"sdpa-math-{r['run'].rsplit('-', 1)[-1]}"
                   for _, r in runs.iterrows()}
        runs = runs.assign(variant=runs["run"].map(variant), role=runs["swap"].map(lambda s: OLD_ROLES[s][0]),
                           compare_to=runs["swap"].map(lambda s: OLD_ROLES[s][1]))
    if name == "fp8" and "mlp_variant" not in runs:
        runs = runs.assign(mlp_variant="gelu", variant=runs["precision"])
    if div is not None and "swap" in div:
        names = dict(zip(runs["run"], runs["variant"]))
        arms = {s: OLD_ROLES[s][0] for s in OLD_ROLES}
        div = pd.DataFrame({"arm": div["swap"].map(arms), "reference": "sdpa-math", "variant": div["run"].map(names),
                            "seed": 0, "step": div["step"], "max_abs": div["max_abs"], "rel_l2": div["rel_l2"],
                            "w1_mean": math.nan, "w1_max": math.nan, "wasserstein_pooled": div["wasserstein"]})
        rows = runs.set_index("variant")
        div["label"] = [ex._label(a, v, "sdpa-math", rows.loc[v].to_dict(), rows.loc["sdpa-math"].to_dict())
                        for a, v in zip(div["arm"], div["variant"])]
    return runs, steps, div


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
        # one file holds both divergence tables: a column only the other table has is all empty here
        own = {t: extra[extra["table"] == t].drop(columns="table").dropna(axis=1, how="all") for t in DIVERGENCE_TABLES}
        exp_runs, exp_steps, div = upgrade(name, runs[runs["experiment"] == name], steps[steps["experiment"] == name],
                                           own["weight_divergence"] if name == "divergence" else None)
        exp_runs.to_parquet(folder / "runs.parquet", index=False)
        exp_steps.to_parquet(folder / "steps.parquet", index=False)
        if name == "divergence":
            div.to_parquet(folder / DIVERGENCE_TABLES["weight_divergence"], index=False)
            own["numerics_vs_fp64"].to_parquet(folder / DIVERGENCE_TABLES["numerics_vs_fp64"], index=False)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in", dest="rows", default="results/reference/h200/pretrain", type=Path)
    parser.add_argument("--out", default="reports/reference/h200/pretrain", type=Path)
    args = parser.parse_args()
    for name in ("pretrain_runs.parquet", "pretrain_steps.parquet"):
        if not (args.rows / name).is_file():
            sys.exit(f"--in={args.rows}: {name} is missing (scripts/h200_pretrain.sh wrote it)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in split(args.rows, Path(tmp)):
            for path in render(name, Path(tmp) / name, args.out):
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
