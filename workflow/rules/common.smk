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
from attnbench.errors import ConfigError
from attnbench.plan import NAME_PATTERN, build_plan
from attnbench.workflow import paths

min_version("8.20")

RULE_BACKEND_DIR = Path(workflow.basedir, "workflow", "rules", "backends")
try:
    # --configfile files (each with its extends: chain), else the repository's default sweep; --config on top
    CONFIG_FILES = list(workflow.config_settings.configfiles) or [Path(workflow.basedir, "config", "config.yaml")]
    CONFIG = attnbench_config.validate_config(
        attnbench_config.load_files(CONFIG_FILES, dict(workflow.config_settings.config)))
    PLAN = build_plan(CONFIG, rule_backend_files=[p.stem for p in RULE_BACKEND_DIR.glob("*.smk")])
except ConfigError as err:  # one line naming the key and the allowed values, no traceback
    sys.exit(f"attnbench: config error: {err}")
logger.info(PLAN.summary())

# Every path of the sweep (attnbench.workflow.paths), with the sweep name filled in; job wildcards stay.
P = SimpleNamespace(**{name: getattr(paths, name).replace("{sweep}", PLAN.sweep)
                       for name in dir(paths) if name.isupper()})
PLAN.write_jobs(P.PLAN_DIR)
NAME = NAME_PATTERN.pattern.strip("^$")  # the one pattern every sweep, group and backend name matches


def job_file(stage, name):
    return P.JOB.format(stage=stage, name=name)


ON_GPU = PLAN.device == "cuda"
# CPU timing needs the whole machine: a CPU job takes every core, so timing jobs run one at a time.
# A GPU job takes one GPU (a `gpu` token, plus the lease that sets CUDA_VISIBLE_DEVICES) and a few cores.
CORES = workflow.cores or 1  # unset in some modes (e.g. --lint without a profile)
JOB_THREADS = min(4, CORES) if ON_GPU else CORES
# The one lease mechanism (attnbench.workflow.lease): every job that times something, or uses the GPU, runs
# under `attnbench lease`, which holds its device's timing lock host-wide (a GPU, or the whole CPU) whatever
# --cores says, so timing jobs of this sweep and of any other sweep on the host never overlap.
LEASE = f"attnbench lease --device {PLAN.device} --"
