"""Where every file of a sweep lives, in one place: the rules' outputs and the planner's targets read it.

Each name is a template relative to the working directory, formatted with the sweep name and, where it
has them, the job's wildcards; a rule fills its wildcards by passing ``"{group}"`` through. Everything
a sweep writes is under ``results/<sweep>/`` and ``reports/<sweep>/``; sweep and group names match
:data:`attnbench.errors.NAME_PATTERN`, so no template can leave those folders.
"""
from __future__ import annotations

from pathlib import Path

RESULTS = "results/{sweep}"
REPORTS = "reports/{sweep}"

PLAN_DIR = RESULTS + "/plan"  # one JSON file per job (attnbench.plan.Plan.write_jobs)
PLAN_CONFIG = PLAN_DIR + "/config.json"  # the validated config the planner used
JOB = PLAN_DIR + "/{stage}/{name}.json"  # name: <group>, or <group>/<backend>, <backend>/<group>, ...

ENV = RESULTS + "/env"
ENV_CONFIG = ENV + "/config.yaml"
VERSIONS = ENV + "/versions.json"
CEILINGS = ENV + "/ceilings.json"
LOGS = RESULTS + "/logs"
BENCHMARKS = RESULTS + "/benchmarks"
JOB_LOG = LOGS + "/{stage}/{name}.log"  # a job's log and Snakemake benchmark mirror its plan file's path
JOB_BENCHMARK = BENCHMARKS + "/{stage}/{name}.tsv"

MICROBENCH = RESULTS + "/microbench/{group}.parquet"  # one job per group, its Python backends interleaved
MICROBENCH_RULE = RESULTS + "/microbench/{backend}/{group}.parquet"  # a backend added as a Snakemake rule
MERGED = RESULTS + "/microbench.parquet"  # every microbench row of the sweep, validated and joined
COMPARE = RESULTS + "/compare/compare.md"  # `snakemake compare`: this sweep against config `baseline`

STABILITY = RESULTS + "/stability/{group}/{index}.parquet"  # one pass: its own `attnbench microbench` process
HBM_PART = RESULTS + "/hbm/parts/{group}/{backend}.parquet"
HBM_TABLE = RESULTS + "/hbm/hbm.parquet"
HBM_LEDGER = RESULTS + "/hbm/ledger.parquet"
CONTEXT_COST = RESULTS + "/context/cost/{group}.parquet"
CONTEXT_CHECKPOINT = RESULTS + "/context/pretrain.pt"
CONTEXT_CAPABILITY = RESULTS + "/context/capability/{method}.parquet"
CONTEXT_ROPE = RESULTS + "/context/rope_overhead.parquet"
CONTEXT_CAPABILITY_ALL = RESULTS + "/context/capability.parquet"  # every method's rows, merged
CONTEXT_COST_ALL = RESULTS + "/context/cost.parquet"  # every cost group's rows, merged
PRETRAIN_DIR = RESULTS + "/pretrain/{experiment}"
PRETRAIN_RUNS = PRETRAIN_DIR + "/runs.parquet"
PRETRAIN_STEPS = PRETRAIN_DIR + "/steps.parquet"
TRITON_PRECOMPILE = RESULTS + "/triton/precompile.parquet"  # Triton configs compiled ahead of the timed jobs
TRITON_COMPILER = RESULTS + "/triton/compiler.parquet"  # the compiler report on our Triton kernels
CP_PART = RESULTS + "/context_parallel/n{world}.parquet"  # one job per world size N
CP_TABLE = RESULTS + "/context_parallel/context_parallel.parquet"  # every N's rows, scaling efficiency filled

# Each stage's tables and figures: <stage>/tables/{name}.{md,tex,csv}, <stage>/figures/{name}.{png,svg},
# and one index of both with their captions, read by the report, `snakemake --report` and publishing.
STAGE_DIR = RESULTS + "/{stage}"
STAGE_TABLES = RESULTS + "/{stage}/tables"
STAGE_FIGURES = RESULTS + "/{stage}/figures"
STAGE_INDEX = RESULTS + "/{stage}/tables/index.json"

REPORT_HTML = REPORTS + "/report.html"
PUBLISHED = RESULTS + "/wandb/published.json"


def group_results(stage: str) -> str:
    """The results file of one group of a stage whose groups a lease may run alone (microbench, context cost, a
    pretraining experiment's runs)."""
    return {"microbench": MICROBENCH, "context-cost": CONTEXT_COST, "pretrain": PRETRAIN_RUNS}[stage]


def group_targets(sweep: str, groups: list[tuple[str, str]]) -> list[str]:
    """Snakemake targets that run only these ``(stage, group)`` results groups of a sweep (microbench, context
    cost or pretraining experiments), and record the run's config and versions beside them (a lease that runs
    again only the groups still missing; scripts/lease.sh)."""
    return [group_results(stage).format(sweep=sweep, group=g, experiment=g) for stage, g in groups] + \
        [ENV_CONFIG.format(sweep=sweep), VERSIONS.format(sweep=sweep)]


def within(results_dir: str | Path, template: str, **wildcards) -> Path:
    """``template`` (one of the names above) inside a given sweep folder instead of ``results/<sweep>``."""
    if not template.startswith(RESULTS + "/"):
        raise ValueError(f"{template!r} is not under {RESULTS}; allowed: a template of a sweep's results")
    return Path(results_dir) / template[len(RESULTS) + 1:].format(**wildcards)
