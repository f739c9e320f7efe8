"""What each rule's job asks a scheduler for: the one place for every runtime, memory, CPU and GPU request.

Every rule of ``workflow/rules/*.smk`` names its kind and gets its ``threads`` and ``resources`` from here
(``common.smk``'s ``job_threads`` and ``job_resources``). Snakemake's local executor (profiles/default) only
counts the ``gpu`` tokens; Snakemake's SLURM executor (profiles/slurm) turns ``runtime`` (minutes) into
``sbatch -t``, ``mem_mb`` into ``--mem``, ``gpu`` into ``--gpus``, ``threads`` into ``--cpus-per-task``,
``slurm_partition`` and ``slurm_account`` (the config's ``slurm`` keys) into ``-p`` and ``-A``, and passes
``slurm_extra`` on. ``snakemake --set-resources <rule>:mem_mb=...`` overrides one rule's request.

The kinds (:data:`KINDS`):

* ``timing``: a job that times something under the device's timing lease (microbench, stability, context
  cost, RoPE overhead, ceilings, hbm, pretraining experiments, which report tokens/s, context parallelism).
  On a GPU it asks for its GPUs (``gpu=1``, or N for an N-rank job) and :data:`GPU_JOB_THREADS` CPUs. On a
  CPU it asks for the whole node (``--exclusive``): CPU timing needs the machine, as the host-wide CPU lock
  (:mod:`attnbench.workflow.lease`) ensures locally; under SLURM the node is the job's by exclusivity, and
  the lease still takes the node-local lock, which then waits only for a process SLURM did not start.
* ``untimed``: needs the device but times nothing (the Triton compiler report, the
  context-capability training and evaluation): its GPU on a GPU; CPUs only, shared, on a CPU.
* ``compile``: compiles kernels in parallel processes (Triton precompilation): every CPU it is given, and
  its GPU on a GPU; never timed.
* ``light``: reads files and writes tables, figures or the report: one CPU, never a GPU.

Where the numbers come from:

* ``runtime``: the longest job of its kind measured on one H200 (config/README.md's sweep table: a paper
  microbench group ~400 s, the h200-backends ``fwd-slices`` group 190 s; a pretraining call of the
  h200-pretrain sweep under 9 min, its experiments ~46 min in all) with ample room, since a job past its
  SLURM limit is killed without rows. Where the sweep sets a limit of its own (``job_time_limit_s`` for
  results jobs, ``pretrain.time_limit_s`` for experiments), the request is that limit plus
  :data:`GRACE_MIN`, so the job's own limit always fires first and writes its ``timeout`` (or truncated)
  rows, exactly as on a local host.
* ``mem_mb``: the largest peak RSS of the kind's jobs in the smoke sweep on 2 CPU cores (the ``max_rss`` of
  Snakemake's benchmark files, ``results/reference/slurm/benchmarks/``: 1.7 GB for timing jobs, the
  two-rank context-parallel job; 0.9 GB for compile-free training; 0.8 GB for the report, 0.5 GB for
  tables), times four or more for the default sweep's larger CPU shapes; on a GPU, room for the CUDA context
  and libraries, a few GB of host memory per process (not measured here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    runtime_min: int  # SLURM time limit when the sweep sets none of its own
    cpu_mem_mb: int   # host memory of the job on a CPU grid
    gpu_mem_mb: int   # host memory of the job on a GPU grid


KINDS = {
    "timing": Request(runtime_min=60, cpu_mem_mb=8000, gpu_mem_mb=32000),
    "untimed": Request(runtime_min=60, cpu_mem_mb=4000, gpu_mem_mb=32000),
    "compile": Request(runtime_min=60, cpu_mem_mb=8000, gpu_mem_mb=32000),
    "light": Request(runtime_min=20, cpu_mem_mb=4000, gpu_mem_mb=4000),
}
GPU_JOB_THREADS = 4  # a GPU job's CPUs: its Python process, data loading, the compiler's workers
GRACE_MIN = 5  # the SLURM limit's margin over the sweep's own: Snakemake's start in the job, writing the rows
CPU_EXCLUSIVE = "--exclusive"  # a CPU timing job has its node to itself


def threads(kind: str, *, on_gpu: bool, cores: int | None) -> int:
    """A job's CPUs. ``cores`` is ``--cores``: this host's CPUs locally; a node's when given to a cluster
    executor, else None (then a CPU timing job asks for one CPU and gets the node by exclusivity)."""
    _request(kind)
    if kind == "light":
        return 1
    if kind == "compile":
        return cores or GPU_JOB_THREADS
    if on_gpu:
        return min(GPU_JOB_THREADS, cores or GPU_JOB_THREADS)
    return (cores or 1) if kind == "timing" else 1


def resources(kind: str, *, on_gpu: bool, slurm: dict, gpus: int = 1, time_limit_s: float | None = None) -> dict:
    """A rule's ``resources``: ``runtime`` and ``mem_mb``, ``gpu`` for a job that uses the GPU grid's devices
    (``gpus`` of them; 0: none), the partition and account when the config names them, and the whole node
    for a CPU timing job. ``time_limit_s``: the limit the sweep itself puts on the job, if any."""
    request = _request(kind)
    out = {"runtime": runtime_min(request, time_limit_s),
           "mem_mb": request.gpu_mem_mb if on_gpu else request.cpu_mem_mb}
    if on_gpu and kind != "light" and gpus:
        out["gpu"] = gpus
    if not on_gpu and kind == "timing":
        out["slurm_extra"] = CPU_EXCLUSIVE
    if slurm.get("partition"):
        out["slurm_partition"] = slurm["partition"]
    if slurm.get("account"):
        out["slurm_account"] = slurm["account"]
    return out


def runtime_min(request: Request, time_limit_s: float | None) -> int:
    """The SLURM time limit in minutes: the sweep's own limit plus :data:`GRACE_MIN`, else the kind's."""
    if time_limit_s is None:
        return request.runtime_min
    return math.ceil(time_limit_s / 60) + GRACE_MIN


def _request(kind: str) -> Request:
    if kind not in KINDS:
        raise ValueError(f"job kind {kind!r} is not known; allowed: {', '.join(KINDS)}")
    return KINDS[kind]
