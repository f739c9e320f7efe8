# HBM traffic (docs/hbm.md): one `attnbench hbm` job per (hbm group, backend) on a GPU, each timing its cases
# and running one Nsight Compute process; then the merged table, the KV / training-step byte ledger and the
# stage's tables, figures and index. Without a GPU or ncu the jobs write rows with status unavailable and the
# reason (one job per group), so the CPU sweep builds the same files.
HBM_PARTS = [P.HBM_PART.format(group=group, backend=backends[0] if len(backends) == 1 else "all")
             for group, backends in PLAN.hbm_parts()]


rule hbm:
    input:
        job=job_file("hbm", "{group}/{backend}"),
        ceilings=P.CEILINGS,
    output:
        P.HBM_PART,
    log:
        job_log("hbm", "{group}/{backend}"),
    benchmark:
        job_benchmark("hbm", "{group}/{backend}")
    wildcard_constraints:
        group=NAME,
        backend=NAME,
    params:
        lease=LEASE,
    threads: job_threads("timing")
    resources:
        **job_resources("timing"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench hbm --job {input.job:q} --ceilings {input.ceilings:q} --out {output:q} "
        "> {log:q} 2>&1"


rule hbm_table:
    input:
        HBM_PARTS,
    output:
        P.HBM_TABLE,
    log:
        f"{P.LOGS}/hbm/table.log",
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench hbm-table --out {output:q} {input:q} > {log:q} 2>&1"


rule hbm_ledger:
    input:
        job=job_file("hbm", "ledger"),
        hbm=P.HBM_TABLE,
    output:
        P.HBM_LEDGER,
    log:
        f"{P.LOGS}/hbm/ledger.log",
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench ledger --job {input.job:q} --hbm {input.hbm:q} --out {output:q} > {log:q} 2>&1"


rule hbm_tables:
    input:
        hbm=P.HBM_TABLE,
        ledger=P.HBM_LEDGER,
    output:
        **stage_outputs("hbm"),
    log:
        f"{P.LOGS}/hbm/tables.log",
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables hbm --results {params.results:q} > {log:q} 2>&1"
