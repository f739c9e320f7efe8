"""attnbench: the sweep from config to executed report (docs/pipeline.md).

common (load, validate and plan once; write each job's plan file) -> env (effective config, versions,
ceilings) -> microbench (one job per group, plus backends added as rules) -> aggregate (tables,
figures) -> stability -> hbm -> pretrain -> context -> context_parallel -> report (one executed report, a
section per stage); `snakemake publish` logs the sweep to Weights & Biases. The stage files are
included explicitly, in data-flow order; a stage the sweep does not run plans no jobs.
"""


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/hbm.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/context.smk"
include: "workflow/rules/context_parallel.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/publish.smk"


report: "workflow/report/workflow.rst"


rule all:
    default_target: True
    input:
        P.REPORT_HTML,
