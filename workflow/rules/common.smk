# Load and validate the config once, at parse time, before any job starts; define the paths and
# the lists the stage files fill in. Helpers live in attnbench.report.pipeline (tested Python).
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import min_version, validate

from attnbench.config import ConfigError
from attnbench.report import pipeline

min_version("8.20")

# No --configfile: the repository's default sweep, with any --config key=value merged on top.
if not config.get("microbench"):
    config.update(pipeline.default_config(config, Path(workflow.basedir, "config", "config.yaml")))

RULE_BACKEND_DIR = Path(workflow.basedir, "workflow", "rules", "backends")
try:
    validate(config, schema="../schemas/config.schema.yaml")
    SCHEMA_ERROR = None
except WorkflowError as err:  # reported below as one line naming the key, by attnbench's checker
    SCHEMA_ERROR = err
try:
    SWEEP = pipeline.load_sweep(config, [p.stem for p in RULE_BACKEND_DIR.glob("*.smk")])
except ConfigError as err:  # one line naming the key and the allowed values, no traceback
    sys.exit(f"attnbench: config error: {err}")
if SCHEMA_ERROR is not None:
    raise SCHEMA_ERROR
logger.info(SWEEP.summary())
# The merged config (defaults filled, device resolved), for the env rule to write as results/<sweep>/env/config.yaml.
CONFIG_SNAPSHOT = SWEEP.snapshot(Path(".snakemake", "attnbench"))

RESULTS = f"results/{SWEEP.name}"
REPORTS = f"reports/{SWEEP.name}"
ENV = f"{RESULTS}/env"
ENV_CONFIG = f"{ENV}/config.yaml"
VERSIONS = f"{ENV}/versions.json"
CEILINGS = f"{ENV}/ceilings.json"
MERGED = f"{RESULTS}/microbench.parquet"  # every results row of the sweep, joined
TABLES = f"{RESULTS}/tables"
TABLE_INDEX = f"{TABLES}/index.json"
FIGURES = f"{RESULTS}/figures"
REPORT_HTML = f"{REPORTS}/report.html"
PUBLISHED = f"{RESULTS}/wandb/published.json"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"
ON_GPU = SWEEP.device == "cuda"
# CPU timing needs the whole machine: a CPU job takes every core, so jobs run one at a time.
# A GPU job takes one GPU (a `gpu` token plus a lease that sets CUDA_VISIBLE_DEVICES) and a few cores.
CORES = workflow.cores or 1  # unset in some modes (e.g. --lint without a profile)
JOB_THREADS = min(4, CORES) if ON_GPU else CORES
GPU_LEASE = "--gpu-lease" if ON_GPU else ""

# The stage contract (docs/pipeline.md): stage files append to these lists; rules read them
# through functions, so the order in which the stage files are included does not matter.
STAGE_TARGETS = []  # files `rule all` builds
RESULT_FILES = SWEEP.results_files(RESULTS)  # microbench-shaped results the aggregate joins
REPORT_NOTEBOOKS = []  # jupytext sources rendered, in order, into reports/<sweep>/report.html
REPORT_INPUTS = []  # aggregated tables those notebooks read
