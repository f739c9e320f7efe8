"""Assemble a sweep folder from the committed reference rows, so that the report renders from them.

``results/reference/h200/`` holds the sweep folders of reference runs through the pipeline (``paper/``,
``stability/``, ``backends/``, ``workloads/``, ``core/``, ``triton/``, the hbm stage of ``h200-hbm`` in
``hbm/`` and the context stage of ``h200-context`` in ``context/``) beside rows that time-boxed GPU runs wrote
before it ran every stage, in their own file layout (``pretrain/``; docs/reference-runs.md). :func:`assemble`
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

import math
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
# scripts/h200_pretrain.sh wrote the divergence experiment's two extra frames into one file (column table)
DIVERGENCE_TABLES = {"weight_divergence": "divergence.parquet", "numerics_vs_fp64": "numerics.parquet"}


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


OLD_ROLES = {"reference": ("reference", ""), "backend": ("kernel", "sdpa-math"),
             "precision": ("precision", "sdpa-math"), "seed": ("init_and_data_seed", "sdpa-math")}


def upgrade(name: str, runs: pd.DataFrame, steps: pd.DataFrame, div: pd.DataFrame | None = None):
    """(runs, steps, divergence) of the retired script's pretraining rows with today's columns: one seed (0)
    whose initial weights and data order are both that seed; the runs' tags as today's divergence plan writes
    them (sdpa-math the reference, every other backend a kernel arm against it, fp32 the precision arm, and
    the old seed swap, which changed the initial weights and the data order together, as its own arm
    ``init_and_data_seed``); both spike scores recomputed from the committed step logs at their definitions
    (:func:`attnbench.train.stability.spike_summary`); the weight divergence's pooled Wasserstein distance kept
    as ``wasserstein_pooled`` (today's per-tensor ``w1_mean`` and ``w1_max`` are empty)."""
    from attnbench.train import experiments as ex
    from attnbench.train import stability

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


def _pretrain(rows: Path, out: Path) -> list[str]:
    """One folder per experiment (the layout `experiment run` writes): the h200-pretrain sweep's own folder
    for each experiment that has landed in ``sweep/`` (``lease.sh h200-pretrain:<experiment>``), else the
    retired script's rows, split out of its single runs/steps files and brought to today's columns
    (:func:`upgrade`)."""
    from attnbench.train import experiments as ex

    landed = [name for name in ex.EXPERIMENTS
              if paths.within(rows / "sweep", paths.PRETRAIN_RUNS, experiment=name).is_file()]
    for name in landed:
        source = paths.within(rows / "sweep", paths.PRETRAIN_DIR, experiment=name)
        for frame in sorted(source.glob("*.parquet")):
            _copy(frame, paths.within(out, paths.PRETRAIN_DIR, experiment=name) / frame.name)
    runs = pd.read_parquet(rows / "pretrain_runs.parquet")
    steps = pd.read_parquet(rows / "pretrain_steps.parquet")
    extra_path = rows / "pretrain_divergence.parquet"
    extra = pd.read_parquet(extra_path) if extra_path.is_file() else pd.DataFrame(columns=["table"])
    retired = [name for name in ex.EXPERIMENTS if name not in landed and (runs["experiment"] == name).any()]
    # one file holds both divergence tables: a column only the other table has is all empty here
    own = {t: extra[extra["table"] == t].drop(columns="table").dropna(axis=1, how="all") for t in DIVERGENCE_TABLES}
    for name in retired:
        folder = paths.within(out, paths.PRETRAIN_DIR, experiment=name)
        folder.mkdir(parents=True, exist_ok=True)
        exp_runs, exp_steps, div = upgrade(name, runs[runs["experiment"] == name], steps[steps["experiment"] == name],
                                           own["weight_divergence"] if name == "divergence" else None)
        exp_runs.to_parquet(folder / "runs.parquet", index=False)
        exp_steps.to_parquet(folder / "steps.parquet", index=False)
        if name == "divergence":
            div.to_parquet(folder / DIVERGENCE_TABLES["weight_divergence"], index=False)
            own["numerics_vs_fp64"].to_parquet(folder / DIVERGENCE_TABLES["numerics_vs_fp64"], index=False)
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
