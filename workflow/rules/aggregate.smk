# Aggregation: validate and join every microbench results file (the adapters' jobs and the rule backends')
# into one table, then the stage's tables (the paper-style ones, the FA3-README-style backend tables, our
# Triton kernel against the best backends), figures and index.
MICROBENCH_RESULTS = [P.MICROBENCH.format(group=g) for g in PLAN.microbench] + [
    P.MICROBENCH_RULE.format(backend=b, group=g) for b, groups in PLAN.rule_backends.items() for g in groups]


rule aggregate:
    input:
        MICROBENCH_RESULTS,
    output:
        P.MERGED,
    log:
        f"{P.LOGS}/aggregate.log",
    benchmark:
        f"{P.BENCHMARKS}/aggregate.tsv"
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench aggregate --merged {output:q} {input:q} > {log:q} 2>&1"


rule microbench_tables:
    input:
        P.MERGED,
    output:
        **stage_outputs("microbench"),
    log:
        f"{P.LOGS}/microbench-tables.log",
    benchmark:
        f"{P.BENCHMARKS}/microbench-tables.tsv"
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables microbench --results {params.results:q} > {log:q} 2>&1"
