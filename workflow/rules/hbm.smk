# HBM traffic (docs/hbm.md): one `attnbench hbm` job per (hbm group, backend), each timing its cases and
# running one Nsight Compute process; then the merged table, the KV / training-step byte ledger and the
# figures. Without a GPU or ncu the jobs write rows with status unavailable and the reason, so the CPU
# sweep builds the same files.
import os
import re

from attnbench.hbm.figures import FIGURES as HBM_FIGURES
from attnbench.hbm.plan import hbm_plan

HBM_PLAN = hbm_plan(SWEEP.config)
HBM = f"{RESULTS}/hbm"
HBM_TABLE = f"{HBM}/hbm.parquet"
HBM_LEDGER = f"{HBM}/ledger.parquet"
HBM_FIGURE_FILES = [f"{HBM}/figures/{name}" for name in HBM_FIGURES]


# On a GPU, one job (one ncu process) per (group, backend), so a backend that hangs costs only its job;
# without one, nothing is profiled and one job per group ("all" its backends) writes the unavailable rows.
HBM_JOBS = HBM_PLAN.jobs() if ON_GPU else [(group, "all") for group in HBM_PLAN.groups]
HBM_PARTS = [f"{HBM}/parts/{group}/{backend}.parquet" for group, backend in HBM_JOBS]
HBM_GROUP_PATTERN = "|".join(re.escape(g) for g in dict.fromkeys(HBM_PLAN.groups))
HBM_BACKEND_PATTERN = "|".join(re.escape(b) for b in dict.fromkeys(b for _, b in HBM_JOBS))


rule hbm:
    input:
        config=ENV_CONFIG,
        ceilings=CEILINGS,
    output:
        f"{HBM}/parts/{{group}}/{{backend}}.parquet",
    log:
        f"{LOGS}/hbm/{{group}}/{{backend}}.log",
    benchmark:
        f"{BENCHMARKS}/hbm/{{group}}/{{backend}}.tsv"
    wildcard_constraints:
        group=HBM_GROUP_PATTERN,
        backend=HBM_BACKEND_PATTERN,
    params:
        lease="attnbench lease --" if ON_GPU else "",
        backends=lambda w: "" if w.backend == "all" else f"--backend {w.backend}",
    threads: JOB_THREADS
    resources:
        gpu=int(ON_GPU),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "{params.lease} attnbench hbm --config {input.config} --group {wildcards.group} {params.backends} "
        "--ceilings {input.ceilings} --out {output} > {log} 2>&1"


rule hbm_table:
    input:
        HBM_PARTS,
    output:
        HBM_TABLE,
    log:
        f"{LOGS}/hbm/table.log",
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench hbm-table --out {output} {input} > {log} 2>&1"


rule hbm_ledger:
    input:
        config=ENV_CONFIG,
        hbm=HBM_TABLE,
    output:
        HBM_LEDGER,
    log:
        f"{LOGS}/hbm/ledger.log",
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench ledger --config {input.config} --hbm {input.hbm} --out {output} > {log} 2>&1"


rule hbm_figures:
    input:
        hbm=HBM_TABLE,
        ledger=HBM_LEDGER,
    output:
        HBM_FIGURE_FILES,
    log:
        f"{LOGS}/hbm/figures.log",
    params:
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench hbm-figures --hbm {input.hbm} --ledger {input.ledger} --out {params.folder} > {log} 2>&1"


STAGE_TARGETS.extend([HBM_TABLE, HBM_LEDGER, *HBM_FIGURE_FILES])
