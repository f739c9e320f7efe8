# Our Triton kernels (docs/triton.md). On a GPU, every autotuning config the sweep's timed triton cases need is
# compiled first, in parallel processes (`attnbench triton precompile`), so the microbench jobs that time them
# find Triton's cache warm; the triton stage then writes the compiler's report on the kernels of its groups, and
# its table and index (the report's Triton section also sets the triton rows of the microbench groups beside the
# best other backend).


rule triton_precompile:
    input:
        job=job_file("precompile", "triton"),
    output:
        P.TRITON_PRECOMPILE,
    log:
        job_log("precompile", "triton"),
    benchmark:
        job_benchmark("precompile", "triton")
    params:
        lease=LEASE_UNTIMED,
    threads: job_threads("compile")
    resources:
        **job_resources("compile"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench triton precompile --job {input.job:q} --out {output:q} > {log:q} 2>&1"


rule triton_report:
    input:
        job=job_file("triton", "compiler"),
    output:
        P.TRITON_COMPILER,
    log:
        job_log("triton", "compiler"),
    benchmark:
        job_benchmark("triton", "compiler")
    params:
        lease=LEASE_UNTIMED,
    threads: job_threads("untimed")
    resources:
        **job_resources("untimed"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec {params.lease} attnbench triton report --job {input.job:q} --out {output:q} > {log:q} 2>&1"


rule triton_tables:
    input:
        P.TRITON_COMPILER,
    output:
        **stage_outputs("triton"),
    log:
        job_log("triton", "tables"),
    params:
        results=sweep_folder,
    threads: job_threads("light")
    resources:
        **job_resources("light"),
    conda:
        "../envs/attnbench.yaml"
    shell:
        "exec attnbench tables triton --results {params.results:q} > {log:q} 2>&1"
