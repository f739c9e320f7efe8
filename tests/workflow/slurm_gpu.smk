# The GPU path under SLURM, on a cluster whose GPUs are fake (tests/workflow/test_slurm.py): JOBS jobs, each
# asking for one GPU the way the workflow's GPU rules do (attnbench.workflow.resources on the GPU grid), each
# running under `attnbench lease --device cuda` as they do; hold_gpu.py records what SLURM gave it, while it held it.
from pathlib import Path

from attnbench.workflow import resources

JOBS = int(config.get("jobs", 6))
HOLD_S = float(config.get("hold_s", 6))


rule all:
    input:
        expand("seen/{i}.json", i=range(JOBS)),


rule hold_gpu:
    output:
        "seen/{i}.json",
    params:
        hold_s=HOLD_S,
        script=Path(workflow.basedir, "hold_gpu.py"),
    threads: resources.threads("timing", on_gpu=True, cores=None)
    resources:
        **resources.resources("timing", on_gpu=True, slurm={}),
    shell:
        "exec attnbench lease --device cuda -- python {params.script:q} {output:q} {params.hold_s:q}"
