# Our Triton kernels' compiler report (schemas/triton.schema.yaml, docs/triton.md): the stage's rule that
# writes results/<sweep>/triton/compiler.parquet (registers, spills, shared memory per compiled kernel of the
# triton cases of triton.groups) is the triton stage's own; this file turns it into the stage's table and index.
# The report's Triton section also sets the triton rows of the microbench groups beside the best other backend.


rule triton_tables:
    input:
        P.TRITON_COMPILER,
    output:
        **stage_outputs("triton"),
    log:
        f"{P.LOGS}/triton/tables.log",
    params:
        results=sweep_folder,
    conda:
        "../envs/attnbench.yaml"
    shell:
        "attnbench tables triton --results {params.results:q} > {log:q} 2>&1"
