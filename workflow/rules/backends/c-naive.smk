# A backend added as a rule: c-naive, attention forward in plain C (c-naive/attention.c).
#
# The recipe for any backend that is not a Python adapter (a CUDA binary, another framework):
#   1. `attnbench rule-backend cases` writes the job's cases as TSV;
#   2. the backend's own command reads them and prints one timings line per case;
#   3. `attnbench rule-backend ingest` turns those lines into results rows (FLOPs, bytes,
#      roofline, provenance), validated against workflow/schemas/results.schema.yaml;
#   4. the output path is P.MICROBENCH_RULE (results/<sweep>/microbench/<name>/<group>.parquet), so the
#      aggregate rule joins it with no other edit once the config lists the backend under
#      microbench.<device>.rule_backends: {<name>: [<groups>]}.
# The rule compiles its own source (an edit of attention.c reruns it); when the command cannot be built
# here, every row is `unavailable` with the reason.


rule c_naive:
    input:
        job=job_file("microbench-rule", "c-naive/{group}"),
        ceilings=P.CEILINGS,
        source=Path(workflow.basedir, "workflow", "rules", "backends", "c-naive", "attention.c"),
    output:
        P.MICROBENCH_RULE.replace("{backend}", "c-naive"),
    log:
        job_log("microbench-rule", "c-naive/{group}"),
    benchmark:
        job_benchmark("microbench-rule", "c-naive/{group}")
    wildcard_constraints:
        group=NAME,
    params:
        work=lambda wildcards: f"{P.RESULTS}/backends/c-naive/{wildcards.group}",
        lease=LEASE,
    # the whole machine, as every CPU timing job takes: nothing else of this sweep runs while it times, and
    # the timing command holds the host's timing lock (LEASE) against other sweeps
    threads: job_threads("timing")
    resources:
        **job_resources("timing"),
    conda:
        "../../envs/attnbench.yaml"
    shell:
        """
        mkdir -p {params.work:q}
        attnbench rule-backend cases --job {input.job:q} --out {params.work:q}/cases.tsv 2> {log:q}
        if cc -O3 -std=c11 -o {params.work:q}/attention {input.source:q} -lm 2>> {log:q}; then
            {params.lease} {params.work:q}/attention < {params.work:q}/cases.tsv > {params.work:q}/timings.tsv 2>> {log:q} || true
            attnbench rule-backend ingest --job {input.job:q} --timings {params.work:q}/timings.tsv \
                --ceilings {input.ceilings:q} --family fused --version "$(cc --version | head -n 1)" \
                --out {output:q} 2>> {log:q}
        else
            attnbench rule-backend ingest --job {input.job:q} --ceilings {input.ceilings:q} \
                --unavailable "no working C compiler (cc) on this host; install one (e.g. conda c-compiler)" \
                --out {output:q} 2>> {log:q}
        fi
        """
