# Environment capture: the effective config, versions and provenance, and the roofline ceilings measured
# on this host before any benchmark runs; then their tables (ceilings, provenance, backends) and index.


rule env:
    input:
        P.PLAN_CONFIG,
    output:
        config=P.ENV_CONFIG,
        versions=P.VERSIONS,
    log:
        f"{P.LOGS}/env.log",
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench env --config-in {input:q} --config-out {output.config:q} --versions-out {output.versions:q} "
        "> {log:q} 2>&1"


rule ceilings:
    output:
        P.CEILINGS,
    log:
        f"{P.LOGS}/ceilings.log",
    benchmark:
        f"{P.BENCHMARKS}/ceilings.tsv"
    params:
        device=PLAN.device,
        lease=LEASE,
    threads: job_threads("timing")
    resources:
        **job_resources("timing"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench ceilings --device {params.device:q} --out {output:q} > {log:q} 2>&1"


rule env_tables:
    input:
        versions=P.VERSIONS,
        ceilings=P.CEILINGS,
    output:
        **stage_outputs("env"),
    log:
        f"{P.LOGS}/env-tables.log",
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables env --results {params.results:q} > {log:q} 2>&1"
