# A backend added as a rule: c-naive, attention forward in plain C (c-naive/attention.c).
#
# The recipe for any backend that is not a Python adapter (a CUDA binary, another framework):
#   1. `attnbench rule-backend cases` writes the group's cases as TSV;
#   2. the backend's own command reads them and prints one timings line per case;
#   3. `attnbench rule-backend ingest` turns those lines into results rows (FLOPs, bytes,
#      roofline, provenance), validated against workflow/schemas/results.schema.yaml;
#   4. the output path is results/<sweep>/microbench/<name>/<group>.parquet, so the aggregate
#      rule joins it with no other edit once the config lists the backend under
#      microbench.<device>.rule_backends: {<name>: [<groups>]}.
# When the command cannot be built here, every row is `unavailable` with the reason.


rule c_naive:
    input:
        config=ENV_CONFIG,
        ceilings=CEILINGS,
        source=Path(workflow.basedir, "workflow", "rules", "backends", "c-naive", "attention.c"),
    output:
        f"{RESULTS}/microbench/c-naive/{{group}}.parquet",
    log:
        f"{LOGS}/microbench/c-naive/{{group}}.log",
    benchmark:
        f"{BENCHMARKS}/microbench/c-naive/{{group}}.tsv"
    params:
        work=lambda wildcards: f"{RESULTS}/backends/c-naive/{wildcards.group}",
    threads: 1
    conda:
        "../../envs/attnbench.yaml"
    shell:
        """
        mkdir -p {params.work}
        attnbench rule-backend cases --config {input.config} --group {wildcards.group} \
            --out {params.work}/cases.tsv 2> {log}
        if cc -O3 -std=c11 -o {params.work}/attention {input.source} -lm 2>> {log}; then
            {params.work}/attention < {params.work}/cases.tsv > {params.work}/timings.tsv 2>> {log} || true
            attnbench rule-backend ingest --config {input.config} --group {wildcards.group} --backend c-naive \
                --timings {params.work}/timings.tsv --ceilings {input.ceilings} --family fused \
                --version "$(cc --version | head -n 1)" --out {output} 2>> {log}
        else
            attnbench rule-backend ingest --config {input.config} --group {wildcards.group} --backend c-naive \
                --unavailable "no working C compiler (cc) on this host; install one (e.g. conda c-compiler)" \
                --ceilings {input.ceilings} --out {output} 2>> {log}
        fi
        """
