# Aggregation: validate and join every microbench results file (the adapters' jobs and the rule backends'),
# pair the backends each job timed side by side (results/<sweep>/microbench/pairs.parquet), then write the
# paper-style tables (md, tex, csv) and the figures (png, svg), their claims within report.min_margin.
from attnbench.report.figures import FIGURE_NAMES
from attnbench.report.figures import FORMATS as FIGURE_FORMATS
from attnbench.report.tables import FORMATS as TABLE_FORMATS
from attnbench.report.tables import TABLE_NAMES

MICROBENCH_TABLES = P.STAGE_TABLES.format(stage="microbench")
MICROBENCH_FIGURES = P.STAGE_FIGURES.format(stage="microbench")
from pathlib import Path

MICROBENCH_RESULTS = [P.MICROBENCH.format(group=g) for g in PLAN.microbench] + [
    P.MICROBENCH_RULE.format(backend=b, group=g) for b, groups in PLAN.rule_backends.items() for g in groups]


rule aggregate:
    input:
        results=MICROBENCH_RESULTS,
    output:
        merged=P.MERGED,
        pairs=P.PAIRS,
        index=P.STAGE_INDEX.format(stage="microbench"),
        tables=[
            report(
                f"{MICROBENCH_TABLES}/{name}.csv",
                caption=f"../report/table_{name}.rst",
                category="Microbenchmarks",
                labels={"table": name},
            )
            for name in TABLE_NAMES
        ],
        other_tables=expand(
            f"{MICROBENCH_TABLES}/{{name}}.{{ext}}",
            name=TABLE_NAMES,
            ext=[e for e in TABLE_FORMATS if e != "csv"],
        ),
        figures=[
            report(
                f"{MICROBENCH_FIGURES}/{name}.png",
                caption=f"../report/figure_{name}.rst",
                category="Microbenchmarks",
                labels={"figure": name},
            )
            for name in FIGURE_NAMES
        ],
        other_figures=expand(
            f"{MICROBENCH_FIGURES}/{{name}}.{{ext}}",
            name=FIGURE_NAMES,
            ext=[e for e in FIGURE_FORMATS if e != "png"],
        ),
    log:
        f"{P.LOGS}/aggregate.log",
    benchmark:
        f"{P.BENCHMARKS}/aggregate.tsv"
    params:
        tables=lambda wildcards, output: Path(output.index).parent,
        figures=lambda wildcards, output: Path(output.figures[0]).parent,
        min_margin=PLAN.config["report"]["min_margin"],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench aggregate --merged {output.merged:q} --pairs {output.pairs:q} --tables {params.tables:q} "
        "--figures {params.figures:q} --min-margin {params.min_margin} {input.results:q} > {log:q} 2>&1"
