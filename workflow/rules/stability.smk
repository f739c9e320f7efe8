# Stability (timing fidelity across processes): each pass of a stability group (stability.groups, a microbench
# group of the device's grid) is its own `attnbench microbench` process (its own CUDA context, allocator,
# compile caches and clock history), timed under the lease like every timing job; then one table of whether
# the passes' medians agree within their intervals, and of the paired ratios per pass (attnbench.report.stability).
from attnbench.report.stability import TABLE_NAMES as STABILITY_TABLE_NAMES

STABILITY_TABLE_DIR = P.STAGE_TABLES.format(stage="stability")
STABILITY_PASSES = [P.STABILITY.format(group=g, index=i) for g in PLAN.stability
                    for i in range(1, PLAN.view["stability"]["processes"] + 1)]
STABILITY_TABLES = [f"{STABILITY_TABLE_DIR}/{name}.{ext}" for name in STABILITY_TABLE_NAMES
                    for ext in TABLE_FORMATS + ("parquet",)] + [P.STAGE_INDEX.format(stage="stability")]


rule stability_pass:
    input:
        job=job_file("stability", "{group}/{index}"),
        ceilings=P.CEILINGS,
    output:
        P.STABILITY,
    log:
        f"{P.LOGS}/stability/{{group}}/{{index}}.log",
    benchmark:
        f"{P.BENCHMARKS}/stability/{{group}}/{{index}}.tsv"
    wildcard_constraints:
        group=NAME,
        index=r"\d+",
    params:
        lease=LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench guard --job {input.job:q} --out {output:q} -- "
        "attnbench microbench --job {input.job:q} --ceilings {input.ceilings:q} --out {output:q} > {log:q} 2>&1"


rule stability_table:
    input:
        STABILITY_PASSES,
    output:
        STABILITY_TABLES,
    log:
        f"{P.LOGS}/stability/table.log",
    params:
        folder=lambda wildcards, output: Path(output[-1]).parent,
        threshold=PLAN.config["report"]["compare_threshold"],
        min_margin=PLAN.config["report"]["min_margin"],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench stability-table --out-dir {params.folder:q} --threshold {params.threshold} "
        "--min-margin {params.min_margin} {input:q} > {log:q} 2>&1"


rule stability:
    input:
        STABILITY_TABLES,
