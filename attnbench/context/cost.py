"""Cost of context extension: attention at extended lengths, and the RoPE scalings themselves.

Attention: the microbench harness (:func:`attnbench.bench.microbench.run_group`)
on fwd / fwd_bwd (causal prefill) and decode (one query row against a KV cache)
cases at extended lengths, numerics off (an fp64 reference at 128k is itself
the thing that does not fit). Each row keeps its peak memory (CUDA) and its
roofline label; a backend that no longer fits is an ``oom`` row, so the table
shows where each backend stops fitting and where it turns memory-bound. The
grids use the microbench group syntax, under ``context.cost.<device>``.

RoPE: a scaling method changes only ``inv_freq`` and the attention factor, so
attention cost is the same for every method; what differs is building the
cos/sin tables (per forward for dynamic NTK, whose base depends on the length)
and rotating q and k. :func:`rope_overhead` times exactly that.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

from attnbench.bench.failures import classify
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.bench.provenance import environment, timestamp
from attnbench.bench.timing import time_callable
from attnbench.config import ConfigError, MicrobenchPlan, microbench_plan
from attnbench.kernels.registry import backend_names
from attnbench.models.rope import METHODS, RopeConfig, apply_rope, rope_cos_sin, rope_frequencies


def cost_plan(context: dict, device: str) -> MicrobenchPlan:
    """The ``context.cost.<device>`` grid, expanded and checked like a microbench grid."""
    spec = context["cost"][device]
    known = backend_names()
    lists = {f"context.cost.{device}.backends": spec["backends"]}
    lists.update({f"context.cost.{device}.groups.{g}.backends": grid["backends"]
                  for g, grid in spec["groups"].items() if "backends" in grid})
    for where, names in lists.items():
        for name in names:
            if name not in known:
                raise ConfigError(f"{where}: backend={name!r} is not known; allowed: {', '.join(known)}")
    try:
        return microbench_plan({"microbench": {device: spec}}, device)
    except ValueError as err:
        raise ConfigError(str(err).replace("microbench.", "context.cost.", 1)) from None


def run_cost(plan: MicrobenchPlan, group: str, options: RunOptions, backends: list[str] | None = None,
             log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> list[dict]:
    """Results rows (the microbench schema) for one group; numerics are always off here."""
    if group not in plan.groups:
        raise ConfigError(f"group={group!r} is not in context.cost.{plan.device}.groups; allowed: {', '.join(plan.groups)}")
    options.numerics = False
    options.group = group
    rows = run_group(plan.groups[group], backends or plan.group_backends[group], options, log)
    for row in rows:
        row["experiment"] = "context_cost"
    return rows


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
