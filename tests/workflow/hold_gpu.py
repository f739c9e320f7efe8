"""Hold the GPU a job was leased for a while, and record what the scheduler gave it (tests/workflow/slurm_gpu.smk).

usage: python hold_gpu.py OUT.json SECONDS
"""
import json
import os
import sys
import time

KEYS = ("CUDA_VISIBLE_DEVICES", "ATTNBENCH_LEASE", "SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")

start = time.time()
time.sleep(float(sys.argv[2]))
with open(sys.argv[1], "w") as out:
    json.dump({**{key: os.environ.get(key) for key in KEYS}, "start": start, "end": time.time()}, out)
