"""attnbench: the sweep from config to executed report (docs/pipeline.md).

env (config, versions, ceilings) -> microbench (one job per backend x group, plus rule-based
backends) -> aggregate (tables, figures) -> report (executed notebooks); `snakemake publish`
logs the result to Weights & Biases. Every stage is a workflow/rules/*.smk file, included by
glob, that appends what `rule all` must build to STAGE_TARGETS (defined in common.smk).
"""
from pathlib import Path


include: "workflow/rules/common.smk"


for _stage in sorted(Path(workflow.basedir, "workflow", "rules").glob("*.smk")):
    if _stage.name != "common.smk":

        include: str(_stage)


report: "workflow/report/workflow.rst"


rule all:
    default_target: True
    input:
        STAGE_TARGETS,
