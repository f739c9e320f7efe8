"""Log a finished sweep to Weights & Biases: tables, figures, the results artifact, config and provenance.

Snakemake owns the sweep; W&B only records it (W&B sweeps need a server).
Mode: ``$WANDB_MODE`` when set, else ``online`` when ``$WANDB_API_KEY`` is
set, else ``offline``. Offline runs are written under
``<results>/wandb/wandb/offline-run-*`` and uploaded later with ``wandb sync``.
The key is read by wandb itself from the environment; this module never reads
its value, logs it or writes it (run config holds the sweep config and the
provenance files only).

Logged: every aggregated table as a ``wandb.Table`` (``tables/<name>``), the
full results as ``tables/results``, every figure as a ``wandb.Image``
(``figures/<name>``), a ``results`` artifact (merged parquet, tables, figures,
environment files), and run config ``{"sweep": <effective config>,
"provenance": <versions.json>, "ceilings": <ceilings.json>}``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import yaml


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


def publish(results_dir: str | Path, env_dir: str | Path, out: str | Path, *, project: str, entity: str | None = None,
            tags: list[str] | None = None) -> dict:
    """Log the sweep in ``results_dir``; write a JSON receipt to ``out`` and return it."""
    results_dir, env_dir = Path(results_dir), Path(env_dir)
    wandb_dir = results_dir / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", ".cache"), ("WANDB_DATA_DIR", ".data")):
        os.environ.setdefault(var, str((wandb_dir / sub).resolve()))
    import wandb

    from attnbench.files import read_json, read_parquet

    config = yaml.safe_load((env_dir / "config.yaml").read_text())
    provenance = read_json(env_dir / "versions.json", "versions file (attnbench env)")
    ceilings = read_json(env_dir / "ceilings.json", "ceilings file (attnbench ceilings)")
    merged = read_parquet(results_dir / "microbench.parquet")
    tables_dir, figures_dir = results_dir / "microbench" / "tables", results_dir / "microbench" / "figures"
    index = read_json(tables_dir / "index.json", "table index (attnbench aggregate)")
    mode = wandb_mode()
    run = wandb.init(project=project, entity=entity, mode=mode, dir=os.environ["WANDB_DIR"],
                     job_type="microbench-sweep", name=f"{config['sweep']}-{provenance.get('git_sha', 'unknown')}",
                     tags=[config["sweep"], config["device"], *(tags or [])],
                     config={"sweep": config, "provenance": provenance, "ceilings": ceilings})
    logged = {"tables/results": _table(merged)}
    for name, entry in index.items():
        logged[f"tables/{name}"] = _table(pd.read_csv(tables_dir / f"{name}.csv"))
        run.summary[f"captions/{name}"] = entry["caption"]
    for png in sorted(figures_dir.glob("*.png")):
        logged[f"figures/{png.stem}"] = wandb.Image(str(png))
    run.log(logged)
    counts = merged.groupby("status").size().to_dict()
    run.summary.update({"rows": len(merged), **{f"rows_{k}": int(v) for k, v in counts.items()}})
    artifact = wandb.Artifact(f"attnbench-{config['sweep']}", type="results",
                              description="attnbench microbench results, tables, figures and environment")
    artifact.add_file(str(results_dir / "microbench.parquet"))
    artifact.add_dir(str(tables_dir), name="tables")
    artifact.add_dir(str(figures_dir), name="figures")
    artifact.add_dir(str(env_dir), name="env")
    run.log_artifact(artifact)
    receipt = {"mode": mode, "project": project, "entity": entity, "run_id": run.id, "run_name": run.name,
               "run_dir": os.path.relpath(run.dir, Path.cwd()), "logged": sorted(logged),
               "artifact": artifact.name, "url": run.url if mode == "online" else None,
               "sync": None if mode == "online" else f"wandb sync {os.path.relpath(Path(run.dir).parent, Path.cwd())}"}
    run.finish()
    Path(out).write_text(json.dumps(receipt, indent=2))
    return receipt
