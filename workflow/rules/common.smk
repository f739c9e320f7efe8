# Load, validate and plan the sweep once, at parse time, before any job starts; write each job's plan
# file (results/<sweep>/plan/<stage>/<name>.json, rewritten only when its content changes, so a job whose
# work did not change is not rerun). Jobs read their plan file, never the YAML. The planning logic lives
# in attnbench.plan (tested Python); this file only calls it and names the paths.
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.logging import logger
from snakemake.utils import min_version

from attnbench import config as attnbench_config
from attnbench.envvars import check_environment
from attnbench.errors import NAME_PATTERN, ConfigError
from attnbench.plan import build_plan
from attnbench.report.stages import STAGE_REPORTS, declared_outputs, index_labels, stability_part
from attnbench.workflow import paths, resources, resume
from snakemake.exceptions import WorkflowError

min_version("8.20")

RULE_BACKEND_DIR = Path(workflow.basedir, "workflow", "rules", "backends")
try:
    check_environment()  # ATTNBENCH_DEADLINE, WANDB_MODE, ...: one line now, not a traceback in a job
    # --configfile files (each with its extends: chain), else the repository's default sweep; --config on top
    CONFIG_FILES = list(workflow.config_settings.configfiles) or [Path(workflow.basedir, "config", "config.yaml")]
    OVERRIDES = attnbench_config.command_line_overrides(dict(workflow.config_settings.config))
    CONFIG = attnbench_config.validate_config(attnbench_config.load_files(CONFIG_FILES, OVERRIDES))
    PLAN = build_plan(CONFIG, rule_backend_files=[p.stem for p in RULE_BACKEND_DIR.glob("*.smk")])
except ConfigError as err:  # one line naming the key and the allowed values, no traceback
    sys.exit(f"attnbench: config error: {err}")

# Every path of the sweep (attnbench.workflow.paths), with the sweep name filled in; job wildcards stay.
P = SimpleNamespace(**{name: getattr(paths, name).replace("{sweep}", PLAN.sweep)
                       for name in dir(paths) if name.isupper()})
PLAN.write_jobs(P.PLAN_DIR)
logger.info(PLAN.summary(P.BENCHMARKS))  # planned jobs per stage, and the expected time from earlier runs
# A job that crashed or was stopped at the deadline left its output with error rows and a marker: put its
# finished rows back in its side file and remove the output, so this run measures only the rest
# (attnbench.workflow.resume). Not while another Snakemake works in this folder.
resume.reopen(P.RESULTS, log=logger.info)
NAME = NAME_PATTERN.pattern.strip("^$")  # the one pattern every sweep, group and backend name matches


def job_file(stage, name):
    return P.JOB.format(stage=stage, name=name)


def job_log(stage, name):
    return P.JOB_LOG.format(stage=stage, name=name)


def job_benchmark(stage, name):
    return P.JOB_BENCHMARK.format(stage=stage, name=name)


ON_GPU = PLAN.device == "cuda"
try:
    CORES = workflow.cores or None  # --cores: unset in some modes (e.g. --lint without a profile)
except WorkflowError:  # a cluster executor without --cores (profiles/slurm): a node's CPUs are not known here
    CORES = None


def job_threads(kind):
    """A job's CPUs by its kind (attnbench.workflow.resources): a CPU timing job takes every core, so timing
    jobs run one at a time; a GPU job a few; a tables job one."""
    return resources.threads(kind, on_gpu=ON_GPU, cores=CORES)


def job_resources(kind, gpus=1, time_limit_s=None):
    """A job's resources by its kind (attnbench.workflow.resources): runtime, mem_mb, its GPUs on the GPU grid
    (a `gpu` token locally, `--gpus` under SLURM), the config's SLURM partition and account."""
    return resources.resources(kind, on_gpu=ON_GPU, slurm=PLAN.config["slurm"], gpus=gpus, time_limit_s=time_limit_s)


# the sweep's own limit on a guarded results job: the SLURM limit is set above it, so the guard's fires first
RESULTS_LIMIT_S = PLAN.config["job_time_limit_s"]
# The one lease mechanism (attnbench.workflow.lease): every job that times something, or uses the GPU, runs
# under `attnbench lease`, which holds its device's timing lock host-wide (a GPU, or the whole CPU) whatever
# --cores says, so timing jobs of this sweep and of any other sweep on the host never overlap.
LEASE = f"attnbench lease --device {PLAN.device} --"
# A job that needs the device but times nothing (compiling kernels, reading the compiler's report): a GPU
# is still leased, the CPU is not locked.
LEASE_UNTIMED = f"attnbench lease --device {PLAN.device} --untimed --"


def stage_outputs(stage, parts=()):
    """A stage's tables rule's named outputs (attnbench.report.stages.declared_outputs): its index, every
    table and figure, the CSV and PNG of each marked for `snakemake --report` in the stage's category, with
    the caption from workflow/report/<stage>.rst and the entry's own caption as a label."""
    stage_dir = P.STAGE_DIR.format(stage=stage)
    files = declared_outputs(stage, stage_dir, parts)
    category = STAGE_REPORTS[stage].title

    def marked(path, kind):
        name = Path(path).stem
        return report(path, caption=f"../report/{stage}.rst", category=category, subcategory=kind,
                      labels=index_labels(stage_dir, kind, name))

    return {"index": files["index"][0],
            "tables": [marked(f, "tables") for f in files["tables"]],
            "table_files": files["table_files"],
            "figures": [marked(f, "figures") for f in files["figures"]],
            "figure_files": files["figure_files"]}


def stage_index(stage):
    return P.STAGE_INDEX.format(stage=stage)


def sweep_folder(wildcards, output):
    """results/<sweep>, from a tables rule's index (results/<sweep>/<stage>/tables/index.json)."""
    return Path(output.index).parents[2]
