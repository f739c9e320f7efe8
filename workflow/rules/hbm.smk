# HBM traffic (docs/hbm.md): one `attnbench hbm` job per (hbm group, backend) on a GPU, each timing its cases
# and running one Nsight Compute process; then the merged table, the KV / training-step byte ledger and the
# figures. Without a GPU or ncu the jobs write rows with status unavailable and the reason (one job per
# group), so the CPU sweep builds the same files.
import os

from attnbench.report.hbm import FIGURES as HBM_FIGURES

HBM_PARTS = [P.HBM_PART.format(group=group, backend=backends[0] if len(backends) == 1 else "all")
             for group, backends in PLAN.hbm_parts()]
HBM_FIGURE_FILES = [f"{P.RESULTS}/hbm/figures/{name}" for name in HBM_FIGURES]


rule hbm:
    input:
        job=job_file("hbm", "{group}/{backend}"),
        ceilings=P.CEILINGS,
    output:
        P.HBM_PART,
    log:
        f"{P.LOGS}/hbm/{{group}}/{{backend}}.log",
    benchmark:
        f"{P.BENCHMARKS}/hbm/{{group}}/{{backend}}.tsv"
    wildcard_constraints:
        group=NAME,
        backend=NAME,
    params:
        lease=LEASE,
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
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
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench ledger --job {input.job:q} --hbm {input.hbm:q} --out {output:q} > {log:q} 2>&1"


rule hbm_figures:
    input:
        hbm=P.HBM_TABLE,
        ledger=P.HBM_LEDGER,
    output:
        HBM_FIGURE_FILES,
    log:
        f"{P.LOGS}/hbm/figures.log",
    params:
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench hbm-figures --hbm {input.hbm:q} --ledger {input.ledger:q} --out {params.folder:q} "
        "> {log:q} 2>&1"
