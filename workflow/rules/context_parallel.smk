# Context parallelism (docs/context-parallel.md; opt-in: not among the default `stages`): one
# `attnbench context-parallel` job per world size N of context_parallel.world_sizes, each torchrun with N
# ranks (on a GPU host one GPU a rank, under an N-GPU lease, all or none; on a CPU host N gloo processes at
# the section's CPU sizes under the CPU timing lock, PyTorch's context_parallel rows saying why it cannot run
# there), then the merged rows with the scaling efficiency, and the stage's tables, figures and index.
# The jobs run one after another (each waits for the previous world size's file), so that no two share the
# host's GPU links while they are timed. A GPU host with fewer GPUs than N runs no ranks for that job (no
# lease: nothing is timed): its rows are `unavailable` with the reason. Target: `context_parallel_tables`.
from attnbench.workflow.lease import visible_devices

CP_WORLDS = [job.payload["world_size"] for job in PLAN.context_parallel]
CP_HOST_GPUS = len(visible_devices()) if ON_GPU and CP_WORLDS else 0

# each job waits for the previous world size's file; it holds N GPUs where the host has them, else none
CP_AFTER = {world: [P.CP_PART.format(world=previous)] for previous, world in zip(CP_WORLDS, CP_WORLDS[1:])}
CP_GPUS = {world: world if ON_GPU and world <= CP_HOST_GPUS else 0 for world in CP_WORLDS}
CP_LEASE = {world: (f"attnbench lease --device cuda --gpus {world} --" if CP_GPUS[world] else "") if ON_GPU
            else LEASE for world in CP_WORLDS}


rule context_parallel:
    input:
        job=job_file("context_parallel", "n{world}"),
        after=lambda wildcards: CP_AFTER.get(int(wildcards.world), []),
    output:
        P.CP_PART,
    log:
        job_log("context_parallel", "n{world}"),
    benchmark:
        job_benchmark("context_parallel", "n{world}")
    wildcard_constraints:
        world=r"[0-9]+",
    params:
        lease=lambda wildcards: CP_LEASE[int(wildcards.world)],
    threads: job_threads("timing")
    resources:
        **job_resources("timing", gpus=0),
        gpu=lambda wildcards: CP_GPUS[int(wildcards.world)],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench context-parallel --job {input.job:q} --out {output:q} > {log:q} 2>&1"


rule context_parallel_merge:
    input:
        expand(P.CP_PART, world=CP_WORLDS),
    output:
        P.CP_TABLE,
    log:
        f"{P.LOGS}/context_parallel/merge.log",
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench context-parallel-merge --out {output:q} {input:q} > {log:q} 2>&1"


rule context_parallel_tables:
    input:
        P.CP_TABLE,
    output:
        **stage_outputs("context_parallel"),
    log:
        f"{P.LOGS}/context_parallel/tables.log",
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables context_parallel --results {params.results:q} > {log:q} 2>&1"
