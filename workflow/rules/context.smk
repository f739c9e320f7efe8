# Context extension (docs/context.md). Capability: one `attnbench context pretrain` job (a tiny GPT at
# context.capability.train_len), then one `attnbench context evaluate` job per RoPE method (its variants
# with and without a short fine-tune, scored at every evaluation length). Cost: one `attnbench context
# cost` job per context.cost.<device> group (the microbench harness at extended lengths, with peak
# memory and oom rows) and the RoPE table/rotation timing. Then the PI- and YaRN-shaped tables.
from pathlib import Path

from attnbench.context.experiment import capability_spec

CONTEXT = f"{RESULTS}/context"
CONTEXT_METHODS = capability_spec(SWEEP.config["context"], SWEEP.device)["methods"]
CONTEXT_COST_GROUPS = list(SWEEP.config["context"]["cost"][SWEEP.device]["groups"])
CONTEXT_TABLES = [f"{CONTEXT}/tables/{name}.md" for name in
                  ("perplexity_sliding", "perplexity_truncated", "passkey", "cost", "rope_overhead")]
# The capability jobs train tiny models: one thread each, so they run side by side on a CPU; timing
# jobs (cost, rope overhead) take every core, as the microbench jobs do.
CONTEXT_TRAIN_THREADS = JOB_THREADS if ON_GPU else 1
CONTEXT_LEASE = "attnbench lease --" if ON_GPU else ""


rule context_pretrain:
    input:
        config=ENV_CONFIG,
    output:
        f"{CONTEXT}/pretrain.pt",
    log:
        f"{LOGS}/context/pretrain.log",
    benchmark:
        f"{BENCHMARKS}/context/pretrain.tsv"
    params:
        lease=CONTEXT_LEASE,
    threads: CONTEXT_TRAIN_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context pretrain --config {input.config} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule context_evaluate:
    input:
        config=ENV_CONFIG,
        checkpoint=f"{CONTEXT}/pretrain.pt",
    output:
        f"{CONTEXT}/capability/{{method}}.parquet",
    log:
        f"{LOGS}/context/evaluate-{{method}}.log",
    benchmark:
        f"{BENCHMARKS}/context/evaluate-{{method}}.tsv"
    wildcard_constraints:
        method="|".join(CONTEXT_METHODS),
    params:
        lease=CONTEXT_LEASE,
    threads: CONTEXT_TRAIN_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context evaluate --config {input.config} --checkpoint {input.checkpoint} "
        "--method {wildcards.method} --threads {threads} --out {output} > {log} 2>&1"


rule context_cost:
    input:
        config=ENV_CONFIG,
        ceilings=CEILINGS,
    output:
        f"{CONTEXT}/cost/{{group}}.parquet",
    log:
        f"{LOGS}/context/cost-{{group}}.log",
    benchmark:
        f"{BENCHMARKS}/context/cost-{{group}}.tsv"
    wildcard_constraints:
        group="|".join(CONTEXT_COST_GROUPS),
    params:
        lease=CONTEXT_LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context cost --config {input.config} --group {wildcards.group} "
        "--ceilings {input.ceilings} --threads {threads} --out {output} > {log} 2>&1"


rule context_rope_overhead:
    input:
        config=ENV_CONFIG,
    output:
        f"{CONTEXT}/rope_overhead.parquet",
    log:
        f"{LOGS}/context/rope_overhead.log",
    params:
        lease=CONTEXT_LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context rope-overhead --config {input.config} --threads {threads} "
        "--out {output} > {log} 2>&1"


rule context_tables:
    input:
        capability=expand(f"{CONTEXT}/capability/{{method}}.parquet", method=CONTEXT_METHODS),
        cost=expand(f"{CONTEXT}/cost/{{group}}.parquet", group=CONTEXT_COST_GROUPS),
        rope=f"{CONTEXT}/rope_overhead.parquet",
    output:
        CONTEXT_TABLES,
        capability=f"{CONTEXT}/tables/capability.parquet",
        cost=f"{CONTEXT}/tables/cost.parquet",
    log:
        f"{LOGS}/context/tables.log",
    params:
        folder=lambda wildcards, output: Path(output.capability).parent,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench context tables --capability {input.capability} --cost {input.cost} "
        "--rope-overhead {input.rope} --out-dir {params.folder} > {log} 2>&1"


STAGE_TARGETS.extend(CONTEXT_TABLES)
