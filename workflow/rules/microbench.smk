# Microbenchmarks: one job per (Python backend, case group), each a call of `attnbench microbench`
# under `attnbench guard` (a crashed job becomes error rows, so the sweep goes on). Backends added
# as rules live in workflow/rules/backends/<name>.smk and are included here.
from pathlib import Path


rule microbench:
    input:
        config=ENV_CONFIG,
        ceilings=CEILINGS,
    output:
        f"{RESULTS}/microbench/{{backend}}/{{group}}.parquet",
    log:
        f"{LOGS}/microbench/{{backend}}/{{group}}.log",
    benchmark:
        f"{BENCHMARKS}/microbench/{{backend}}/{{group}}.tsv"
    wildcard_constraints:
        backend=SWEEP.wildcard_pattern("backend"),
        group=SWEEP.wildcard_pattern("group"),
    params:
        lease=GPU_LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench guard {params.lease} --config {input.config} --group {wildcards.group} "
        "--backend {wildcards.backend} --out {output} -- "
        "attnbench microbench --config {input.config} --group {wildcards.group} "
        "--backend {wildcards.backend} --ceilings {input.ceilings} --out {output} > {log} 2>&1"


for _backend in sorted(RULE_BACKEND_DIR.glob("*.smk")):

    include: str(_backend)


STAGE_TARGETS.extend(RESULT_FILES)
