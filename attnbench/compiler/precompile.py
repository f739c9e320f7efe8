"""Compile every autotuning config the sweep's Triton cases need, in parallel processes, ahead of timing.

Triton compiles a config on first use and caches it on disk (``~/.triton/cache``); the autotuner of a
microbench job would compile each of its configs in turn, in the timed job's process. Compiling them
here first, one process per CPU core but one, leaves the timed jobs only cache hits: on the H200
host 184 configs took 24 s on 15 processes this way (docs/triton.md).
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

from attnbench.case import Case
from attnbench.failures import one_line

COMPILE_SEQ = 256  # a short sequence compiles the same kernels: the shapes are runtime arguments


def tasks_for(cases: list[Case], backends: list[str]) -> list[tuple]:
    """(kind, dtype, head_dim, heads_q, heads_kv, causal, config index) for every kernel config the
    (case, backend) pairs can launch; kinds follow :data:`attnbench.kernels.triton.tuning.TABLES`."""
    from attnbench.kernels.triton import tuning

    kinds = set()
    for case in cases:
        if case.dtype not in ("fp16", "bf16") or case.head_dim_qk != case.head_dim_v or case.page_size:
            continue
        key = (case.dtype, case.head_dim_qk, case.heads_q, case.heads_kv, case.causal)
        if "triton-fp8" in backends and not case.has_backward:
            kinds.add(("fp8", *key))
        if {"triton", "triton-dq-atomic", "triton-dq-separate"} & set(backends):
            kinds.add(("fwd", *key))
            if case.has_backward:
                kinds |= {(kind, *key) for kind in ("bwd", "dkdv", "dq")}
    return sorted((*k, i) for k in kinds if k[2] in tuning.TABLES[k[0]]
                  for i in range(len(tuning.TABLES[k[0]][k[2]])))


def compile_task(task: tuple) -> tuple[tuple, float, str]:
    """In a worker process: compile one config of one kernel variant into Triton's cache."""
    kind, dtype, head_dim, heads_q, heads_kv, causal, index = task
    start = time.time()
    try:
        import torch

        from attnbench.kernels.triton import launch, tuning
        from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv

        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

        def draw(heads):
            return torch.randn(1, heads, COMPILE_SEQ, head_dim, device="cuda", dtype=torch_dtype)

        q, o, do = draw(heads_q), draw(heads_q), draw(heads_q)
        k, v = draw(heads_kv), draw(heads_kv)
        scale = head_dim ** -0.5
        config = tuning.TABLES[kind][head_dim][index]
        if kind == "fwd":
            launch.forward(q, k, v, causal=causal, scale=scale, config=config, compile_only=True)
        elif kind == "fp8":
            (q8, k8, v8), _ = quantize_qkv(q, k, v, BLOCK_ROWS)
            launch.fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=torch_dtype, config=config,
                               compile_only=True)
        else:  # bwd: the atomic dQ path's kernel; dkdv, dq: the separate path's two
            lse = torch.zeros(1, heads_q, COMPILE_SEQ, device="cuda")
            launch.backward(do, q, k, v, o, lse, causal=causal, scale=scale, compile_only=True,
                            dq_mode="atomic" if kind == "bwd" else "separate",
                            config=None if kind == "dq" else config, dq_config=config if kind == "dq" else None)
        return task, time.time() - start, ""
    except Exception as err:
        return task, time.time() - start, one_line(err)


def precompile(tasks: list[tuple], workers: int | None = None, timeout_s: float = 600) -> list[dict]:
    """Compile ``tasks`` on ``workers`` spawned processes; one row per task (seconds, error)."""
    if not tasks:
        return []
    workers = workers or max(1, min(len(tasks), (os.cpu_count() or 2) - 1))
    keys = ("kind", "dtype", "head_dim", "heads_q", "heads_kv", "causal", "config")
    rows = []
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(compile_task, task): task for task in tasks}
        done, pending = concurrent.futures.wait(futures, timeout=timeout_s)
        for future in done:
            task, seconds, error = future.result()
            rows.append({**dict(zip(keys, task)), "compile_s": seconds, "status": "error" if error else "ok",
                         "reason": error})
        for future in pending:  # left to the timed job, which compiles what it needs on first use
            future.cancel()
            rows.append({**dict(zip(keys, futures[future])), "compile_s": float("nan"), "status": "skipped",
                         "reason": f"not compiled within {timeout_s:g} s"})
    return rows
