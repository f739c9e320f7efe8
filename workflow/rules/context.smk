# Context extension (docs/context.md). Capability: one `attnbench context pretrain` job (a tiny GPT at
# context.capability.train_len), then one `attnbench context evaluate` job per RoPE method (its variants
# with and without a short fine-tune, scored at every evaluation length). Cost: one microbench job per
# context.cost.<device> group (extended lengths, peak memory, oom rows) and the RoPE table/rotation timing.
# Then the PI- and YaRN-shaped tables.
CONTEXT = f"{P.RESULTS}/context"
CONTEXT_METHODS = PLAN.capability["methods"] if PLAN.capability else []
CONTEXT_TABLES = [f"{CONTEXT}/tables/{name}.md" for name in
                  ("perplexity_sliding", "perplexity_truncated", "passkey", "cost", "rope_overhead")]


rule context_pretrain:
    input:
        job=job_file("context", "capability-pretrain"),
    output:
        P.CONTEXT_CHECKPOINT,
    log:
        f"{P.LOGS}/context/pretrain.log",
    benchmark:
        f"{P.BENCHMARKS}/context/pretrain.tsv"
    params:
        # training, not timing: a GPU is leased, but on a CPU no timing lock is taken
        lease=LEASE if ON_GPU else "",
    # one thread on a CPU, so the capability jobs run side by side
    threads: JOB_THREADS if ON_GPU else 1
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context pretrain --job {input.job:q} --threads {threads} --out {output:q} "
        "> {log:q} 2>&1"


rule context_evaluate:
    input:
        job=job_file("context", "capability-{method}"),
        checkpoint=P.CONTEXT_CHECKPOINT,
    output:
        P.CONTEXT_CAPABILITY,
    log:
        f"{P.LOGS}/context/evaluate-{{method}}.log",
    benchmark:
        f"{P.BENCHMARKS}/context/evaluate-{{method}}.tsv"
    wildcard_constraints:
        method=NAME,
    params:
        lease=LEASE if ON_GPU else "",  # evaluation, not timing: as context_pretrain
    threads: JOB_THREADS if ON_GPU else 1
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context evaluate --job {input.job:q} --checkpoint {input.checkpoint:q} "
        "--threads {threads} --out {output:q} > {log:q} 2>&1"


rule context_cost:
    input:
        job=job_file("context-cost", "{group}"),
        ceilings=P.CEILINGS,
    output:
        P.CONTEXT_COST,
    log:
        f"{P.LOGS}/context/cost-{{group}}.log",
    benchmark:
        f"{P.BENCHMARKS}/context/cost-{{group}}.tsv"
    wildcard_constraints:
        group=NAME,
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


rule context_rope_overhead:
    input:
        job=job_file("context", "rope-overhead"),
    output:
        P.CONTEXT_ROPE,
    log:
        f"{P.LOGS}/context/rope_overhead.log",
    params:
        lease=LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context rope-overhead --job {input.job:q} --threads {threads} --out {output:q} "
        "> {log:q} 2>&1"


rule context_tables:
    input:
        capability=expand(P.CONTEXT_CAPABILITY, method=CONTEXT_METHODS),
        cost=expand(P.CONTEXT_COST, group=list(PLAN.context_cost)),
        rope=P.CONTEXT_ROPE,
    output:
        CONTEXT_TABLES,
        capability=f"{CONTEXT}/tables/capability.parquet",
        cost=f"{CONTEXT}/tables/cost.parquet",
    log:
        f"{P.LOGS}/context/tables.log",
    params:
        folder=lambda wildcards, output: Path(output.capability).parent,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench context tables --capability {input.capability:q} --cost {input.cost:q} "
        "--rope-overhead {input.rope:q} --out-dir {params.folder:q} > {log:q} 2>&1"
