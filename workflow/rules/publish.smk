# Publishing (opt-in, never part of `rule all`): `snakemake publish` logs the sweep to Weights & Biases.
# Offline unless WANDB_API_KEY is set; offline runs land under results/<sweep>/wandb/ and upload later with
# `wandb sync`. The key is read by wandb from the environment and never logged.
WANDB = PLAN.config["report"]["wandb"]


rule publish:
    input:
        merged=P.MERGED,
        config=P.ENV_CONFIG,
        versions=P.VERSIONS,
        ceilings=P.CEILINGS,
        report=P.REPORT_HTML,
    output:
        P.PUBLISHED,
    log:
        f"{P.LOGS}/publish.log",
    params:
        results=lambda wildcards, input: Path(input.merged).parent,
        env=lambda wildcards, input: Path(input.config).parent,
        project=WANDB["project"],
        entity=["--entity", WANDB["entity"]] if WANDB["entity"] else [],
        tags=[word for tag in WANDB["tags"] for word in ("--tag", tag)],
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench publish --results {params.results:q} --env {params.env:q} --project {params.project:q} "
        "{params.entity:q} {params.tags:q} --out {output:q} > {log:q} 2>&1"
