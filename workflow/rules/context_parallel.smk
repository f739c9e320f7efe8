# Context parallelism (docs/context-parallel.md): one `attnbench context-parallel` job per world size N of
# context_parallel.world_sizes, each torchrun with N ranks (on a GPU host one GPU a rank, under an N-GPU
# lease; on a CPU host N gloo processes at the section's CPU sizes, PyTorch's context_parallel rows saying
# why it cannot run there), then the merged table with the scaling efficiency, its tables and figures.
# The jobs run one after another (each waits for the previous world size's file), so that no two share the
# host's GPU links while they are timed. A GPU host with fewer GPUs than N runs no ranks for that job: its
# rows are `unavailable` with the reason. Target: `context_parallel_tables`.
from attnbench.report.context_parallel import FIGURE_NAMES as CP_FIGURES
from attnbench.report.context_parallel import TABLE_NAMES as CP_TABLE_NAMES
from attnbench.report.tables import FORMATS as CP_TABLE_FORMATS
from attnbench.workflow.lease import visible_devices

CP_WORLDS = [job.payload["world_size"] for job in PLAN.context_parallel]
CP_HOST_GPUS = len(visible_devices()) if ON_GPU else 0
CP_TABLES = P.STAGE_TABLES.format(stage="context_parallel")
CP_FIGURES_DIR = P.STAGE_FIGURES.format(stage="context_parallel")
CP_OUTPUTS = [P.CP_TABLE, f"{CP_TABLES}/index.json", *[f"{CP_FIGURES_DIR}/{name}.png" for name in CP_FIGURES]]


# each job waits for the previous world size's file; it holds N GPUs where the host has them, else none
CP_AFTER = {world: [P.CP_PART.format(world=previous)] for previous, world in zip(CP_WORLDS, CP_WORLDS[1:])}
CP_GPUS = {world: world if ON_GPU and world <= CP_HOST_GPUS else 0 for world in CP_WORLDS}
CP_LEASE = {world: f"attnbench lease --gpus {world} --" if gpus else "" for world, gpus in CP_GPUS.items()}


rule context_parallel:
    input:
        job=job_file("context_parallel", "n{world}"),
        after=lambda wildcards: CP_AFTER.get(int(wildcards.world), []),
    output:
        P.CP_PART,
    log:
        f"{P.LOGS}/context_parallel/n{{world}}.log",
    benchmark:
        f"{P.BENCHMARKS}/context_parallel/n{{world}}.tsv"
    wildcard_constraints:
        world=r"[0-9]+",
    params:
        lease=lambda wildcards: CP_LEASE[int(wildcards.world)],
    threads: JOB_THREADS
    resources:
        gpu=lambda wildcards: CP_GPUS[int(wildcards.world)],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench context-parallel --job {input.job:q} --out {output:q} > {log:q} 2>&1"


rule context_parallel_tables:
    input:
        expand(P.CP_PART, world=CP_WORLDS),
    output:
        merged=P.CP_TABLE,
        index=f"{CP_TABLES}/index.json",
        tables=expand(f"{CP_TABLES}/{{name}}.{{ext}}", name=CP_TABLE_NAMES, ext=CP_TABLE_FORMATS),
        figures=[f"{CP_FIGURES_DIR}/{name}.png" for name in CP_FIGURES],
    log:
        f"{P.LOGS}/context_parallel/tables.log",
    params:
        tables=lambda wildcards, output: Path(output.index).parent,
        figures=lambda wildcards, output: Path(output.figures[0]).parent,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench context-parallel-table --out {output.merged:q} --tables {params.tables:q} "
        "--figures {params.figures:q} {input:q} > {log:q} 2>&1"
