# Context extension (docs/context.md). Capability: one `attnbench context pretrain` job (a tiny GPT at
# context.capability.train_len), then one `attnbench context evaluate` job per RoPE method (its variants
# with and without a short fine-tune, scored at every evaluation length). Cost: one microbench job per
# context.cost.<device> group (extended lengths, peak memory, oom rows) and the RoPE table/rotation timing.
# Then the parts merged, and the PI- and YaRN-shaped tables, the cost tables, the perplexity figure and the
# stage's index.
CONTEXT_METHODS = PLAN.capability["methods"] if PLAN.capability else []
CONTEXT_COST_RESULTS = expand(P.CONTEXT_COST, group=list(PLAN.context_cost))


rule context_pretrain:
    input:
        job=job_file("context", "capability-pretrain"),
    output:
        P.CONTEXT_CHECKPOINT,
    log:
        job_log("context", "capability-pretrain"),
    benchmark:
        job_benchmark("context", "capability-pretrain")
    params:
        # training, not timing: a GPU is leased, but on a CPU no timing lock is taken
        lease=LEASE if ON_GPU else "",
    threads: job_threads("untimed")
    resources:
        **job_resources("untimed"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench context pretrain --job {input.job:q} --threads {threads} --out {output:q} "
        "> {log:q} 2>&1"


rule context_evaluate:
    input:
        job=job_file("context", "capability-{method}"),
        checkpoint=P.CONTEXT_CHECKPOINT,
    output:
        P.CONTEXT_CAPABILITY,
    log:
        job_log("context", "capability-{method}"),
    benchmark:
        job_benchmark("context", "capability-{method}")
    wildcard_constraints:
        method=NAME,
    params:
        lease=LEASE if ON_GPU else "",  # evaluation, not timing: as context_pretrain
    threads: job_threads("untimed")
    resources:
        **job_resources("untimed"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench context evaluate --job {input.job:q} --checkpoint {input.checkpoint:q} "
        "--threads {threads} --out {output:q} > {log:q} 2>&1"


rule context_cost:
    input:
        job=job_file("context-cost", "{group}"),
        ceilings=P.CEILINGS,
    output:
        P.CONTEXT_COST,
    log:
        job_log("context-cost", "{group}"),
    benchmark:
        job_benchmark("context-cost", "{group}")
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


rule context_rope_overhead:
    input:
        job=job_file("context", "rope-overhead"),
    output:
        P.CONTEXT_ROPE,
    log:
        job_log("context", "rope-overhead"),
    params:
        lease=LEASE,
    threads: job_threads("timing")
    resources:
        **job_resources("timing"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench context rope-overhead --job {input.job:q} --threads {threads} --out {output:q} "
        "> {log:q} 2>&1"


rule context_merge:
    input:
        capability=expand(P.CONTEXT_CAPABILITY, method=CONTEXT_METHODS),
        cost=CONTEXT_COST_RESULTS,
    output:
        capability=P.CONTEXT_CAPABILITY_ALL,
        cost=P.CONTEXT_COST_ALL,
    log:
        f"{P.LOGS}/context/merge.log",
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench context merge --capability {input.capability:q} --cost {input.cost:q} "
        "--out-capability {output.capability:q} --out-cost {output.cost:q} > {log:q} 2>&1"


rule context_tables:
    input:
        P.CONTEXT_CAPABILITY_ALL,
        P.CONTEXT_COST_ALL,
        [P.CONTEXT_ROPE] if PLAN.capability else [],
    output:
        **stage_outputs("context"),
    log:
        f"{P.LOGS}/context/tables.log",
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables context --results {params.results:q} > {log:q} 2>&1"
