# Pretraining experiments (docs/training.md): one `attnbench experiment run` job per experiment
# (divergence, lr_sensitivity, fp8, layouts), each training its runs in one process (finished runs are
# kept, killed ones resume from their checkpoints), then its paper-style tables and figure under
# results/<sweep>/pretrain/{tables,figures}. CPU-sized by default; `pretrain.cuda` scales it on a GPU.
from pathlib import Path

from attnbench.train.experiments import EXPERIMENTS as PRETRAIN_EXPERIMENTS
from attnbench.train.figures import report_files as pretrain_report_files

PRETRAIN = f"{RESULTS}/pretrain"


rule pretrain_experiment:
    input:
        config=ENV_CONFIG,
        ceilings=CEILINGS,
    output:
        runs=f"{PRETRAIN}/{{experiment}}/runs.parquet",
        steps=f"{PRETRAIN}/{{experiment}}/steps.parquet",
    log:
        f"{LOGS}/pretrain/{{experiment}}.log",
    benchmark:
        f"{BENCHMARKS}/pretrain/{{experiment}}.tsv"
    wildcard_constraints:
        experiment="|".join(PRETRAIN_EXPERIMENTS),
    params:
        lease="attnbench lease --" if ON_GPU else "",
        folder=lambda w, output: str(Path(output.runs).parent),
    # On a CPU, one thread per job: the tiny model gains nothing from a second thread (it spins), and two
    # experiments run side by side (their CPU tokens/s are indicative only; the GPU run is the measurement).
    threads: JOB_THREADS if ON_GPU else 1
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench experiment run --config {input.config} --name {wildcards.experiment} "
        "--out {params.folder} --ceilings {input.ceilings} --threads {threads} --no-progress > {log} 2>&1"


for _experiment in PRETRAIN_EXPERIMENTS:

    rule:
        name:
            f"pretrain_report_{_experiment}"
        input:
            runs=f"{PRETRAIN}/{_experiment}/runs.parquet",
            steps=f"{PRETRAIN}/{_experiment}/steps.parquet",
        output:
            pretrain_report_files(PRETRAIN, _experiment),
        log:
            f"{LOGS}/pretrain/report-{_experiment}.log",
        params:
            experiment=_experiment,
            source=lambda w, input: str(Path(input.runs).parent),
            folder=lambda w, output: str(Path(output[0]).parents[1]),
        conda:
            "../envs/attnbench.yaml"
        shell:
            "attnbench experiment report --name {params.experiment} --in {params.source} --out {params.folder} "
            "> {log} 2>&1"

    STAGE_TARGETS.extend(pretrain_report_files(PRETRAIN, _experiment))
