"""Cost of context extension: attention at extended lengths, and the RoPE scalings themselves.

Attention: ``context.cost.<device>`` is a grid stage like the microbenchmarks (the planner's
``context-cost`` jobs run through ``attnbench microbench``) on fwd / fwd_bwd (causal prefill)
and decode (one query row against a KV cache) cases at extended lengths, numerics off (an fp64
reference at 128k is itself the thing that does not fit). Each row keeps its peak memory (CUDA)
and its roofline label; a backend that no longer fits is an ``oom`` row, so the table shows
where each backend stops fitting and where it turns memory-bound.

RoPE: a scaling method changes only ``inv_freq`` and the attention factor, so
attention cost is the same for every method; what differs is building the
cos/sin tables (per forward for dynamic NTK, whose base depends on the length)
and rotating q and k. :func:`rope_overhead` times exactly that.
"""
from __future__ import annotations

import torch

from attnbench.failures import classify
from attnbench.bench.provenance import environment, timestamp
from attnbench.bench.timing import time_callable
from attnbench.jobs import Job
from attnbench.models.rope import METHODS, RopeConfig, apply_rope, rope_cos_sin, rope_frequencies


def rope_overhead_job(cost_groups: dict, capability: dict, sweep: str, device: str):
    """The RoPE timing job: the cost grid's prefill lengths at its first prefill case's heads and dims."""
    cases = [c for g in cost_groups.values() for c in g.cases if c.mode != "decode"]
    shape = ({"heads_q": cases[0].heads_q, "heads_kv": cases[0].heads_kv, "head_dim": cases[0].head_dim_qk,
              "dtype": cases[0].dtype, "lengths": sorted({c.seq_q for c in cases})} if cases else None)
    return Job("context", "rope-overhead", {"stage": "context-rope", "sweep": sweep, "device": device,
                                            "shape": shape, "original_max_len": capability["train_len"]})


def rope_overhead(lengths: list[int], *, heads_q: int, heads_kv: int, head_dim: int, dtype: torch.dtype,
                  device: str, original_max_len: int, methods=METHODS, min_run_time_s: float = 0.05) -> list[dict]:
    """Per method and length (batch 1): ``tables_ms`` builds inv_freq and the cos/sin tables (paid once for
    a static method, every forward for dynamic NTK); ``rotate_ms`` rotates q and k (paid by every method)."""
    env = environment(device)
    rows = []
    for length in lengths:
        gen = torch.Generator(device="cpu").manual_seed(length)
        q = torch.randn(1, heads_q, length, head_dim, generator=gen).to(device, dtype)
        k = torch.randn(1, heads_kv, length, head_dim, generator=gen).to(device, dtype)
        positions = torch.arange(length, device=device)
        for method in methods:
            factor = 1.0 if method in ("none", "dynamic_ntk") else max(1.0, length / original_max_len)
            cfg = RopeConfig(method=method, factor=factor, original_max_len=original_max_len)

            def tables(cfg=cfg):
                inv, att = rope_frequencies(cfg, head_dim, length)
                return rope_cos_sin(inv, positions, att, dtype)

            row = {"experiment": "rope_overhead", "method": method, "factor": factor, "seq": length,
                   "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": head_dim,
                   "dtype": str(dtype).replace("torch.", ""), "status": "ok", "reason": "",
                   "tables_ms": float("nan"), "rotate_ms": float("nan"), "device_name": env["device_name"],
                   "torch_version": env["torch_version"], "git_sha": env["git_sha"], "timestamp": timestamp()}
            try:
                cos, sin = tables()
                row["tables_ms"] = time_callable(tables, device, cpu_min_run_time_s=min_run_time_s).median * 1e3
                row["rotate_ms"] = time_callable(lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)), device,
                                                 cpu_min_run_time_s=min_run_time_s).median * 1e3
            except torch.OutOfMemoryError as err:
                row.update(status="oom", reason=classify(err)[1])
            rows.append(row)
        del q, k
    return rows
