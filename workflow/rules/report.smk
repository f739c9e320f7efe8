# Report: one executed report for the whole sweep, one section per stage in data-flow order
# (attnbench.report.stages.SECTIONS, workflow/notebooks/<section>.py, jupytext py:percent), rendered from the
# planned stages' indexes and the files they list; a section whose stages are not planned says so in one line.
from attnbench.report.notebook import section_sources
from attnbench.report.stages import reported_stages

REPORT_NOTEBOOKS = section_sources(Path(workflow.basedir, "workflow", "notebooks"))
REPORT_STAGES = reported_stages(PLAN)  # the planned stages that plan jobs, in data-flow order


rule report:
    input:
        notebooks=REPORT_NOTEBOOKS,
        indexes=[stage_index("env")] + [stage_index(stage) for stage in REPORT_STAGES],
    output:
        report(P.REPORT_HTML, caption="../report/report.rst", category="Report"),
    log:
        f"{P.LOGS}/report.log",
    benchmark:
        f"{P.BENCHMARKS}/report.tsv"
    params:
        results=lambda wildcards, input: Path(input.indexes[0]).parents[2],
        notebooks=lambda wildcards, input: Path(input.notebooks[0]).parent,
        stages=[word for stage in REPORT_STAGES for word in ("--stage", stage)],
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench render --results {params.results:q} --out {output:q} --notebooks {params.notebooks:q} "
        "{params.stages:q} > {log:q} 2>&1"
