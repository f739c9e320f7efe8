# Pretraining experiments (docs/training.md): one `attnbench experiment run` job per experiment the sweep
# selects (divergence, lr_sensitivity, fp8, layouts), each training its runs in one process (finished runs are
# kept, killed ones resume from their checkpoints), then its paper-style tables and figure under
# results/<sweep>/pretrain/{tables,figures}.
from attnbench.report.pretrain import report_files as pretrain_report_files

PRETRAIN = f"{P.RESULTS}/pretrain"


rule pretrain_experiment:
    input:
        job=job_file("pretrain", "{experiment}"),
        ceilings=P.CEILINGS,
    output:
        runs=P.PRETRAIN_RUNS,
        steps=P.PRETRAIN_STEPS,
    log:
        f"{P.LOGS}/pretrain/{{experiment}}.log",
    benchmark:
        f"{P.BENCHMARKS}/pretrain/{{experiment}}.tsv"
    wildcard_constraints:
        experiment=NAME,
    params:
        lease=LEASE,
        folder=lambda w, output: str(Path(output.runs).parent),
    # runs that report tokens/s take the whole machine (CPU) or a whole GPU, like every timing job
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench experiment run --job {input.job:q} --out {params.folder:q} "
        "--ceilings {input.ceilings:q} --no-progress > {log:q} 2>&1"


for _experiment in PLAN.pretrain:

    rule:
        name:
            f"pretrain_report_{_experiment}"
        input:
            runs=P.PRETRAIN_RUNS.format(experiment=_experiment),
            steps=P.PRETRAIN_STEPS.format(experiment=_experiment),
        output:
            pretrain_report_files(PRETRAIN, _experiment),
        log:
            f"{P.LOGS}/pretrain/report-{_experiment}.log",
        params:
            experiment=_experiment,
            source=lambda w, input: str(Path(input.runs).parent),
            folder=lambda w, output: str(Path(output[0]).parents[1]),
        conda:
            "../envs/attnbench.yaml"
        shell:
            "exec attnbench experiment report --name {params.experiment:q} --in {params.source:q} "
            "--out {params.folder:q} > {log:q} 2>&1"
