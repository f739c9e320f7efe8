# Environment capture: the effective config, versions and provenance, and the roofline ceilings measured
# on this host before any benchmark runs.


rule env:
    input:
        P.PLAN_CONFIG,
    output:
        config=P.ENV_CONFIG,
        versions=report(P.VERSIONS, caption="../report/versions.rst", category="Environment"),
    log:
        f"{P.LOGS}/env.log",
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench env --config-in {input:q} --config-out {output.config:q} --versions-out {output.versions:q} "
        "> {log:q} 2>&1"


rule ceilings:
    output:
        report(P.CEILINGS, caption="../report/ceilings.rst", category="Environment"),
    log:
        f"{P.LOGS}/ceilings.log",
    benchmark:
        f"{P.BENCHMARKS}/ceilings.tsv"
    params:
        device=PLAN.device,
        lease=LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench ceilings --device {params.device:q} --out {output:q} > {log:q} 2>&1"
