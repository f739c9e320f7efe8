"""Log a finished sweep to Weights & Biases: every stage's tables and figures, one results artifact,
config and provenance, and a W&B Report with the executed report's sections.

Snakemake owns the sweep; W&B only records it (W&B sweeps need a server).
Mode: ``$WANDB_MODE`` when set, else ``online`` when ``$WANDB_API_KEY`` is
set, else ``offline``. Offline runs are written under
``<results>/wandb/wandb/offline-run-*`` and uploaded later with ``wandb sync``.
The key is read by wandb itself from the environment; this module never reads
its value, logs it or writes it (run config holds the sweep config and the
provenance files only).

Logged, for every stage with an index (``<stage>/tables/index.json``; ``env`` first):

* each table as a ``wandb.Table`` under ``<stage>/<table>`` (from its CSV), its caption in the
  run summary under ``captions/<stage>/<table>``;
* each figure as a ``wandb.Image`` under ``<stage>/figures/<figure>``, with its caption;
* ``microbench/results``: every joined microbench row;
* one ``results`` artifact: every stage's folder of tables and figures, the joined rows, the env files;
* run config ``{"sweep": <effective config>, "provenance": <versions.json>, "ceilings": <ceilings.json>}``.

The W&B Report (:mod:`attnbench.report.wandb_report`) has the report's sections, each with its
tables and figures; online it is saved, offline its spec is written into the run's files
(``report-spec.json``, uploaded by ``wandb sync``) for ``attnbench wandb-report`` to build later.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import yaml

from attnbench.report import stages as report_stages
from attnbench.report.artifacts import read_index
from attnbench.workflow import paths


def wandb_mode() -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _table(df: pd.DataFrame):
    import wandb

    df = df.reset_index(drop=True)
    df.columns = [str(c) for c in df.columns]
    for name in df.columns:  # nullable pandas dtypes and mixed number/status columns: plain Python values
        if df[name].dtype == object or str(df[name].dtype) in ("string", "Int64", "boolean"):
            df[name] = df[name].astype(object).where(df[name].notna(), None)
    return wandb.Table(dataframe=df, allow_mixed_types=True)


def stage_indexes(results_dir: Path, stages: list[str] | None) -> dict[str, dict]:
    """The indexes to publish, env first, in report order: the named stages, else every one that wrote its index."""
    order = ["env", *[s for s in report_stages.STAGE_REPORTS if s != "env"]]
    wanted = order if not stages else ["env", *[s for s in order if s in stages]]
    out = {}
    for stage in wanted:
        path = paths.within(results_dir, paths.STAGE_INDEX, stage=stage)
        if path.is_file() or stages:
            out[stage] = read_index(path)
    return out


def logged_items(results_dir: Path, indexes: dict[str, dict]) -> tuple[dict, dict]:
    """``{key: wandb object}`` for run.log and ``{key: caption}`` for every table and figure."""
    import wandb

    logged, captions = {}, {}
    for stage, index in indexes.items():
        stage_dir = paths.within(results_dir, paths.STAGE_DIR, stage=stage)
        for entry in index["tables"]:
            key = f"{stage}/{entry['name']}"
            logged[key] = _table(pd.read_csv(stage_dir / entry["files"]["csv"]))
            captions[key] = entry["caption"]
        for entry in index["figures"]:
            key = f"{stage}/figures/{entry['name']}"
            logged[key] = wandb.Image(str(stage_dir / entry["files"]["png"]), caption=entry["caption"])
            captions[key] = entry["caption"]
    merged = paths.within(results_dir, paths.MERGED)
    if "microbench" in indexes and merged.is_file():
        logged["microbench/results"] = _table(pd.read_parquet(merged))
        captions["microbench/results"] = "Every (case, backend) row of the sweep's microbenchmarks."
    return logged, captions


def publish(results_dir: str | Path, out: str | Path, *, project: str, stages: list[str] | None = None,
            entity: str | None = None, tags: list[str] | None = None) -> dict:
    """Log the sweep in ``results_dir`` (``results/<sweep>``); write a JSON receipt to ``out`` and return it."""
    from attnbench.report.wandb_report import report_spec, save_spec

    results_dir = Path(results_dir)
    env_dir = paths.within(results_dir, paths.ENV)
    wandb_dir = results_dir / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_DATA_DIR", ".data")):
        os.environ.setdefault(var, str((wandb_dir / sub).resolve()))
    import wandb

    from attnbench.files import read_json

    config = yaml.safe_load((env_dir / "config.yaml").read_text())
    provenance = read_json(env_dir / "versions.json", "versions file (attnbench env)")
    ceilings = read_json(env_dir / "ceilings.json", "ceilings file (attnbench ceilings)")
    indexes = stage_indexes(results_dir, stages)
    mode = wandb_mode()
    run = wandb.init(project=project, entity=entity, mode=mode, dir=os.environ["WANDB_DIR"],
                     job_type="sweep", name=f"{config['sweep']}-{provenance.get('git_sha', 'unknown')}",
                     tags=[config["sweep"], config["device"], *(tags or [])],
                     config={"sweep": config, "provenance": provenance, "ceilings": ceilings})
    logged, captions = logged_items(results_dir, indexes)
    run.log(logged)
    run.summary.update({f"captions/{key}": text for key, text in captions.items()})
    artifact = wandb.Artifact(f"attnbench-{config['sweep']}", type="results",
                              description="attnbench sweep: every stage's tables and figures, the joined rows, "
                                          "the environment")
    for stage in indexes:
        artifact.add_dir(str(paths.within(results_dir, paths.STAGE_TABLES, stage=stage)), name=f"{stage}/tables")
        figures = paths.within(results_dir, paths.STAGE_FIGURES, stage=stage)
        if figures.is_dir():
            artifact.add_dir(str(figures), name=f"{stage}/figures")
    merged = paths.within(results_dir, paths.MERGED)
    if merged.is_file():
        artifact.add_file(str(merged))
    for name in ("config.yaml", "versions.json", "ceilings.json"):
        artifact.add_file(str(env_dir / name), name=f"env/{name}")
    run.log_artifact(artifact)
    spec = report_spec(indexes, captions, project=project, entity=entity, sweep=config["sweep"], run_name=run.name)
    spec_path = Path(run.dir) / "report-spec.json"
    save_spec(spec, spec_path)
    report_url = None
    if mode == "online":
        from attnbench.report.wandb_report import build_report

        report_url = build_report(spec, entity=run.entity).save().url
    receipt = {"mode": mode, "project": project, "entity": entity, "run_id": run.id, "run_name": run.name,
               "run_dir": os.path.relpath(run.dir, Path.cwd()), "stages": list(indexes), "logged": sorted(logged),
               "artifact": artifact.name, "report_spec": os.path.relpath(spec_path, Path.cwd()),
               "report_url": report_url, "url": run.url if mode == "online" else None,
               "sync": None if mode == "online" else f"wandb sync {os.path.relpath(Path(run.dir).parent, Path.cwd())}"}
    run.finish()
    Path(out).write_text(json.dumps(receipt, indent=2))
    return receipt
