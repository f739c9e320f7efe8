"""attnbench: the sweep from config to executed report (docs/pipeline.md).

common (load, validate and plan once; write each job's plan file) -> env (effective config, versions,
ceilings, their tables) -> microbench (one job per group, plus backends added as rules) -> aggregate
(the joined rows; the stage's tables and figures, claims within report.min_margin) -> stability (each
pass its own process; whether the passes agree within their intervals) -> compare (opt-in: `snakemake
compare --config baseline=<path>`) -> hbm -> triton (its configs compiled before the microbench jobs
that time it; the compiler report after) -> pretrain -> context -> context_parallel
(opt-in: one torchrun job of N ranks per world size) -> report (one executed report, a
section per stage); `snakemake publish` logs every stage to Weights & Biases. Every stage writes its
tables, figures and results/<sweep>/<stage>/tables/index.json, which the report, `snakemake --report`
and publishing read. The stage files are included explicitly, in data-flow order; a stage the sweep
does not run plans no jobs. Adding one: workflow/rules/ADD_STAGE.md.
"""


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/stability.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/hbm.smk"
include: "workflow/rules/triton.smk"
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
        # Every guarded results job as well: Snakemake never regenerates a missing intermediate file whose
        # downstream outputs exist, so a job whose output is missing (reopened by attnbench.workflow.resume
        # after a crash or the sweep deadline, or deleted to be measured again) runs again only if the
        # default target names it; its new rows then make the stage's tables and the report newer.
        MICROBENCH_RESULTS,
        STABILITY_RESULTS,
        CONTEXT_COST_RESULTS,
