# Report: one executed report for the whole sweep (workflow/notebooks/<stage>.py, jupytext py:percent, in
# data-flow order), rendered from every planned stage's tables and figures into one HTML file.
from attnbench.report.pretrain import report_files as pretrain_report_files

REPORT_STAGE_FILES = {
    "microbench": [P.MERGED, P.STAGE_INDEX.format(stage="microbench")] if PLAN.microbench else [],
    "hbm": [P.HBM_TABLE, P.HBM_LEDGER, *HBM_FIGURE_FILES] if PLAN.hbm else [],
    "pretrain": [f for e in PLAN.pretrain for f in pretrain_report_files(PRETRAIN, e)],
    "context": CONTEXT_TABLES if PLAN.capability else [],
    "context_parallel": CP_OUTPUTS if PLAN.context_parallel else [],
}
REPORT_NOTEBOOKS = [str(Path(workflow.basedir, "workflow", "notebooks", name))
                    for name in ["microbench.py"] + (["context_parallel.py"] if PLAN.context_parallel else [])]


rule report:
    input:
        notebooks=REPORT_NOTEBOOKS,
        config=P.ENV_CONFIG,
        versions=P.VERSIONS,
        ceilings=P.CEILINGS,
        stages=[f for files in REPORT_STAGE_FILES.values() for f in files],
    output:
        report(P.REPORT_HTML, caption="../report/report.rst", category="Report"),
    log:
        f"{P.LOGS}/report.log",
    benchmark:
        f"{P.BENCHMARKS}/report.tsv"
    params:
        results=lambda wildcards, input: Path(input.config).parents[1],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench render --results {params.results:q} --out {output:q} {input.notebooks:q} > {log:q} 2>&1"
