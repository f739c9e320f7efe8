# Timing stability (schemas/stability.schema.yaml): each group of stability.groups timed again in
# stability.processes fresh processes, one job each (the microbench command on the stability job's plan
# file), then the comparison's tables, figure and index.
STABILITY_PARTS = [job.name for job in PLAN.jobs() if job.stage == "stability"]
STABILITY_RESULTS = [P.STABILITY.format(**stability_part(part)) for part in STABILITY_PARTS]


rule stability:
    input:
        job=job_file("stability", "{group}/{index}"),
        ceilings=P.CEILINGS,
    output:
        P.STABILITY,
    log:
        f"{P.LOGS}/stability/{{group}}/{{index}}.log",
    benchmark:
        f"{P.BENCHMARKS}/stability/{{group}}/{{index}}.tsv"
    wildcard_constraints:
        group=NAME,
        index=r"\d+",
    params:
        lease=LEASE,
    threads: job_threads("timing")
    resources:
        **job_resources("timing", time_limit_s=RESULTS_LIMIT_S),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench guard --job {input.job:q} --out {output:q} -- "
        "attnbench microbench --job {input.job:q} --ceilings {input.ceilings:q} --out {output:q} > {log:q} 2>&1"


rule stability_tables:
    input:
        STABILITY_RESULTS,
    output:
        **stage_outputs("stability", STABILITY_PARTS),
    log:
        f"{P.LOGS}/stability/tables.log",
    params:
        results=sweep_folder,
        parts=[word for part in STABILITY_PARTS for word in ("--part", part)],
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables stability --results {params.results:q} {params.parts:q} > {log:q} 2>&1"
