# Microbenchmarks: one job per case group, its Python backends timed in one process under `attnbench guard`
# (a crashed job becomes error rows, so the sweep goes on). Backends added as rules live in
# workflow/rules/backends/<name>.smk; the ones the sweep names are included here.


TRITON_PRECOMPILE_GROUPS = PLAN.triton_precompile_groups()


rule microbench:
    input:
        job=job_file("microbench", "{group}"),
        ceilings=P.CEILINGS,
        # groups that time our Triton kernels on a GPU wait for their configs to be compiled (triton.smk)
        precompiled=lambda wildcards: [P.TRITON_PRECOMPILE] if wildcards.group in TRITON_PRECOMPILE_GROUPS else [],
    output:
        P.MICROBENCH,
    log:
        job_log("microbench", "{group}"),
    benchmark:
        job_benchmark("microbench", "{group}")
    wildcard_constraints:
        group=NAME,
    params:
        lease=LEASE,
    threads: job_threads("timing")
    resources:
        **job_resources("timing", time_limit_s=RESULTS_LIMIT_S),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench guard --job {input.job:q} --out {output:q} -- "
        "attnbench microbench --job {input.job:q} --ceilings {input.ceilings:q} --out {output:q} > {log:q} 2>&1"


for _backend in PLAN.rule_backends:

    include: str(RULE_BACKEND_DIR / f"{_backend}.smk")
