# `snakemake compare --config baseline=<results file or sweep folder under results/>`: this sweep's microbench
# rows against a committed baseline (attnbench compare). The target fails when some row is slower beyond both
# its 95% interval and report.compare_threshold, so a library upgrade that slows a kernel is a failed target.
from attnbench.plan import baseline_input


rule compare:
    input:
        base=baseline_input(PLAN.config),
        new=P.MERGED,
    output:
        P.COMPARE,
    log:
        f"{P.LOGS}/compare.log",
    params:
        threshold=PLAN.config["report"]["compare_threshold"],
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench compare {input.base:q} {input.new:q} --threshold {params.threshold:q} --out {output:q} "
        "> {log:q} 2>&1 || {{ cat {log:q} >&2; exit 1; }}"
