# Aggregation: validate and join every results file (adapters' and rule backends'), then write
# the paper-style tables (md, tex, csv) and the figures (png, svg).
from pathlib import Path

from attnbench.report.figures import FIGURE_NAMES
from attnbench.report.figures import FORMATS as FIGURE_FORMATS
from attnbench.report.tables import FORMATS as TABLE_FORMATS
from attnbench.report.tables import TABLE_NAMES


rule aggregate:
    input:
        results=lambda wildcards: RESULT_FILES,
    output:
        merged=MERGED,
        index=TABLE_INDEX,
        tables=[
            report(
                f"{TABLES}/{name}.csv",
                caption=f"../report/table_{name}.rst",
                category="Tables",
                labels={"table": name},
            )
            for name in TABLE_NAMES
        ],
        other_tables=expand(
            f"{TABLES}/{{name}}.{{ext}}",
            name=TABLE_NAMES,
            ext=[e for e in TABLE_FORMATS if e != "csv"],
        ),
        figures=[
            report(
                f"{FIGURES}/{name}.png",
                caption=f"../report/figure_{name}.rst",
                category="Figures",
                labels={"figure": name},
            )
            for name in FIGURE_NAMES
        ],
        other_figures=expand(
            f"{FIGURES}/{{name}}.{{ext}}",
            name=FIGURE_NAMES,
            ext=[e for e in FIGURE_FORMATS if e != "png"],
        ),
    log:
        f"{LOGS}/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/aggregate.tsv"
    params:
        tables=lambda wildcards, output: Path(output.index).parent,
        figures=lambda wildcards, output: Path(output.figures[0]).parent,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench aggregate --merged {output.merged} --tables {params.tables} --figures {params.figures} "
        "{input.results} > {log} 2>&1"


STAGE_TARGETS.extend([MERGED, TABLE_INDEX])
REPORT_INPUTS.extend([MERGED, TABLE_INDEX])
