# Pretraining experiments (docs/training.md): one `attnbench experiment run` job per experiment the sweep
# selects (divergence, lr_sensitivity, fp8, layouts), each training its runs in one process (finished runs are
# kept, killed ones resume from their checkpoints), then every experiment's paper-style tables and figure and
# the stage's index under results/<sweep>/pretrain/{tables,figures}.
PRETRAIN_EXPERIMENTS = list(PLAN.pretrain)
# an experiment's own wall-clock budget (pretrain.time_limit_s): its SLURM limit is set above it (resources.py)
PRETRAIN_LIMIT_S = PLAN.view["pretrain"]["time_limit_s"]


rule pretrain_experiment:
    input:
        job=job_file("pretrain", "{experiment}"),
        ceilings=P.CEILINGS,
    output:
        runs=P.PRETRAIN_RUNS,
        steps=P.PRETRAIN_STEPS,
    log:
        job_log("pretrain", "{experiment}"),
    benchmark:
        job_benchmark("pretrain", "{experiment}")
    wildcard_constraints:
        experiment=NAME,
    params:
        lease=LEASE,
        folder=lambda w, output: str(Path(output.runs).parent),
    # runs that report tokens/s take the whole machine (CPU) or a whole GPU, like every timing job
    threads: job_threads("timing")
    resources:
        **job_resources("timing", time_limit_s=PRETRAIN_LIMIT_S),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench experiment run --job {input.job:q} --out {params.folder:q} "
        "--ceilings {input.ceilings:q} --no-progress > {log:q} 2>&1"


rule pretrain_tables:
    input:
        runs=expand(P.PRETRAIN_RUNS, experiment=PRETRAIN_EXPERIMENTS),
        steps=expand(P.PRETRAIN_STEPS, experiment=PRETRAIN_EXPERIMENTS),
    output:
        **stage_outputs("pretrain", PRETRAIN_EXPERIMENTS),
    log:
        f"{P.LOGS}/pretrain/tables.log",
    params:
        results=sweep_folder,
        parts=[word for name in PRETRAIN_EXPERIMENTS for word in ("--part", name)],
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables pretrain --results {params.results:q} {params.parts:q} > {log:q} 2>&1"
