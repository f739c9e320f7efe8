# Report: the notebooks under workflow/notebooks/ (jupytext py:percent sources), executed on the
# aggregated tables into one HTML file with the figures embedded. Stages add their own notebook by
# appending to REPORT_NOTEBOOKS and the tables it reads to REPORT_INPUTS.
from pathlib import Path

REPORT_NOTEBOOKS.insert(0, str(Path(workflow.basedir, "workflow", "notebooks", "microbench.py")))


rule report:
    input:
        notebooks=lambda wildcards: REPORT_NOTEBOOKS,
        merged=MERGED,
        tables=lambda wildcards: REPORT_INPUTS,
    output:
        report(REPORT_HTML, caption="../report/report.rst", category="Report"),
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{BENCHMARKS}/report.tsv"
    params:
        results=lambda wildcards, input: Path(input.merged).parent,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench render --results {params.results} --out {output} {input.notebooks} > {log} 2>&1"


STAGE_TARGETS.append(REPORT_HTML)
