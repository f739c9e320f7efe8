# Environment capture: the effective config every job reads, versions and provenance, and the
# roofline ceilings measured on this host before any benchmark runs.


rule env:
    input:
        CONFIG_SNAPSHOT,
    output:
        config=ENV_CONFIG,
        versions=report(VERSIONS, caption="../report/versions.rst", category="Environment"),
    log:
        f"{LOGS}/env.log",
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench env --config-in {input} --config-out {output.config} "
        "--versions-out {output.versions} > {log} 2>&1"


rule ceilings:
    output:
        report(CEILINGS, caption="../report/ceilings.rst", category="Environment"),
    log:
        f"{LOGS}/ceilings.log",
    benchmark:
        f"{BENCHMARKS}/ceilings.tsv"
    params:
        device=SWEEP.device,
        lease="attnbench lease --" if ON_GPU else "",
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench ceilings --device {params.device} --out {output} > {log} 2>&1"


STAGE_TARGETS.extend([ENV_CONFIG, VERSIONS, CEILINGS])
