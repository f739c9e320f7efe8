# Publishing (opt-in, never part of `rule all`): `snakemake publish` logs the sweep to Weights &
# Biases. Offline unless WANDB_API_KEY is set; offline runs land under results/<sweep>/wandb/ and
# upload later with `wandb sync`. The key is read by wandb from the environment and never logged.
import shlex
from pathlib import Path


rule publish:
    input:
        merged=MERGED,
        tables=lambda wildcards: REPORT_INPUTS,
        config=ENV_CONFIG,
        versions=VERSIONS,
        ceilings=CEILINGS,
        report=REPORT_HTML,
    output:
        PUBLISHED,
    log:
        f"{LOGS}/publish.log",
    params:
        results=lambda wildcards, input: Path(input.merged).parent,
        env=lambda wildcards, input: Path(input.config).parent,
        project=SWEEP.config["report"]["wandb"]["project"],
        entity=(
            f"--entity {shlex.quote(SWEEP.config['report']['wandb']['entity'])}"
            if SWEEP.config["report"]["wandb"]["entity"]
            else ""
        ),
        tags=" ".join(f"--tag {shlex.quote(t)}" for t in SWEEP.config["report"]["wandb"]["tags"]),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench publish --results {params.results} --env {params.env} --project {params.project:q} "
        "{params.entity} {params.tags} --out {output} > {log} 2>&1"
