# Publishing (opt-in, never part of `rule all`): `snakemake publish` logs every planned stage's tables and
# figures, one results artifact and a W&B Report with the report's sections to Weights & Biases. Offline unless
# WANDB_API_KEY is set; offline runs land under results/<sweep>/wandb/ and upload later with `wandb sync`, the
# Report's spec in the run's files (`attnbench wandb-report` builds it then). The key is read by wandb from the
# environment and never logged.
WANDB = PLAN.config["report"]["wandb"]


rule publish:
    input:
        config=P.ENV_CONFIG,
        ceilings=P.CEILINGS,
        indexes=[stage_index("env")] + [stage_index(stage) for stage in REPORT_STAGES],
        report=P.REPORT_HTML,
    output:
        P.PUBLISHED,
    log:
        f"{P.LOGS}/publish.log",
    params:
        results=lambda wildcards, input: Path(input.indexes[0]).parents[2],
        stages=[word for stage in REPORT_STAGES for word in ("--stage", stage)],
        project=WANDB["project"],
        entity=["--entity", WANDB["entity"]] if WANDB["entity"] else [],
        tags=[word for tag in WANDB["tags"] for word in ("--tag", tag)],
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench publish --results {params.results:q} {params.stages:q} --project {params.project:q} "
        "{params.entity:q} {params.tags:q} --out {output:q} > {log:q} 2>&1"
