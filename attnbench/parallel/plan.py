"""The ``context_parallel`` config section -> one job per world size (``plan/context_parallel/n<N>.json``).

A job holds every item its torchrun runs: (group, case, documents, sharding, backend), in group
order, then by sequence length, so that a time-limited run loses the longest cases first and a
case that runs out of memory marks the longer ones of its kind as ``oom`` without running them.
With one rank every sharding is the same layout, so the N=1 job runs each case once
(``contiguous``): the baseline every N is compared with (``scaling_efficiency``).

A group is a grid (:func:`attnbench.workloads.grid.expand_group`) plus this stage's keys:
``backends``, ``shardings`` and ``world_sizes`` narrow the section's lists (a group of very long
sequences may skip the one-GPU baseline), ``documents`` packs the sequence (:func:`documents_for`).
"""
from __future__ import annotations

import hashlib
import json

from attnbench.case import WORKLOAD_DEFAULTS, Case, CaseError
from attnbench.errors import ConfigError, check_backend_names, check_name, reject_unknown_keys
from attnbench.jobs import Job
from attnbench.parallel.backends import CP_BACKENDS
from attnbench.parallel.documents import Documents, DocumentsError, synthetic_lengths
from attnbench.parallel.sharding import Sharding, ShardingError
from attnbench.workloads.grid import GROUP_KEYS, GRID_KEYS, GridError, expand_group

STAGE = "context_parallel"
GROUP_EXTRA_KEYS = ("shardings", "documents", "world_sizes")
DOCUMENT_KEYS = ("lengths", "distribution", "mean", "sigma", "min_len", "seed")
SETTINGS = ("warmup", "reps", "serial_reps", "numerics", "numerics_max_seq", "threads", "timeout_s",
            "collective_timeout_s")


def documents_for(spec: dict | None, total: int, where: str) -> Documents | None:
    """A group's ``documents`` for a sequence of ``total`` tokens: ``lengths`` (a list that sums to the
    sequence), or a synthetic ``distribution`` (:func:`attnbench.parallel.documents.synthetic_lengths`).

    The hook for trace-driven lengths: any source that yields a list of lengths feeds
    :meth:`Documents.from_lengths` here.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping; allowed keys: {', '.join(DOCUMENT_KEYS)}")
    reject_unknown_keys(spec, DOCUMENT_KEYS, where)
    try:
        if "lengths" in spec:
            extra = sorted(set(spec) - {"lengths"})
            if extra:
                raise ConfigError(f"{where}: {extra[0]!r} next to lengths; allowed: lengths alone, or a distribution")
            return Documents.from_lengths(spec["lengths"], total)
        if "distribution" not in spec or "mean" not in spec:
            raise ConfigError(f"{where}: give lengths, or distribution and mean (allowed keys: "
                              f"{', '.join(DOCUMENT_KEYS)})")
        lengths = synthetic_lengths(total, distribution=spec["distribution"], mean=spec["mean"],
                                    sigma=spec.get("sigma", 1.0), min_len=spec.get("min_len", 1),
                                    seed=spec.get("seed", 0))
        return Documents.from_lengths(lengths, total)
    except (DocumentsError, TypeError) as err:
        raise ConfigError(f"{where}: {err}") from None


def row_id(case: Case, documents: Documents | None, sharding: str, backend: str, world: int) -> str:
    key = json.dumps([case.case_id, list(documents.lengths) if documents else None, sharding, backend, world])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _group_items(name: str, spec: dict, section: dict, where: str, max_cases: int) -> list[dict]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping (a grid with optional backends, shardings, documents)")
    reject_unknown_keys(spec, (*GROUP_KEYS, *GROUP_EXTRA_KEYS, *GRID_KEYS), where)
    try:
        cases, backends = expand_group({k: v for k, v in spec.items() if k not in GROUP_EXTRA_KEYS}, where, max_cases)
    except (GridError, CaseError) as err:
        raise ConfigError(str(err)) from None
    backends = check_backend_names(backends, CP_BACKENDS, f"{where}.backends") if backends is not None else section["backends"]
    shardings = spec.get("shardings", section["shardings"])
    if not isinstance(shardings, list) or not shardings or any(s not in ("contiguous", "zigzag", "striped")
                                                             for s in shardings):
        raise ConfigError(f"{where}.shardings={shardings!r} is not allowed; allowed: a non-empty list of "
                          "contiguous, zigzag, striped")
    worlds = spec.get("world_sizes", section["world_sizes"])
    if not isinstance(worlds, list) or not worlds or any(w not in section["world_sizes"] for w in worlds):
        raise ConfigError(f"{where}.world_sizes={worlds!r} is not allowed; allowed: a non-empty list of the "
                          f"section's world_sizes ({', '.join(map(str, section['world_sizes']))})")
    items = []
    for case in sorted(cases, key=lambda c: c.seq_kv):  # stable: grid order within one length
        if case.mode == "decode" or case.seq_q != case.seq_kv:
            raise ConfigError(f"{where}: {case.label()}: allowed: mode fwd or fwd_bwd with seq_q == seq_kv "
                              "(one sequence sharded over the ranks)")
        varied = [k for k, default in WORKLOAD_DEFAULTS.items() if getattr(case, k) != default]
        if varied:  # the ring's block kernels compute plain (causal) attention: a variant would be mislabelled
            raise ConfigError(f"{where}: {', '.join(varied)} is not allowed in this stage; allowed: a dense grid, "
                              "packed documents under `documents`")
        documents = documents_for(spec.get("documents"), case.seq_kv, f"{where}.documents")
        items.append({"group": name, "case": case.fields(), "documents": list(documents.lengths) if documents else None,
                      "shardings": shardings, "backends": backends, "world_sizes": worlds})
    return items


def _check_layout(case: Case, sharding: str, world: int, where: str) -> None:
    try:
        Sharding(sharding, world, case.seq_kv)
    except ShardingError as err:
        raise ConfigError(f"{where}: {case.label()}: {err}") from None


def context_parallel_jobs(section: dict, view: dict) -> list:
    """The section's jobs, one per world size; every group, sharding and backend checked first.

    ``view`` is the device view of the config (:func:`attnbench.plan.device_view`): sweep, device,
    seed, max_cases and max_err_ratio come from its top level."""
    max_cases = view["max_cases"]
    check_backend_names(section["backends"], CP_BACKENDS, f"{STAGE}.backends")
    groups = section["groups"]
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{STAGE}.groups must be a non-empty mapping of group name to grid")
    items = []
    for name, spec in groups.items():
        items += _group_items(check_name(name, f"{STAGE}.groups"), spec, section, f"{STAGE}.groups.{name}", max_cases)
    jobs = []
    for world in section["world_sizes"]:
        rows = []
        for item in (i for i in items if world in i["world_sizes"]):
            case = Case(**item["case"])
            documents = Documents(tuple(item["documents"])) if item["documents"] else None
            for sharding in (["contiguous"] if world == 1 else item["shardings"]):
                _check_layout(case, sharding, world, f"{STAGE}.groups.{item['group']}")
                for backend in item["backends"]:
                    rows.append({"group": item["group"], "case": item["case"], "documents": item["documents"],
                                 "sharding": sharding, "backend": backend,
                                 "row_id": row_id(case, documents, sharding, backend, world)})
        if len(rows) > max_cases:
            raise ConfigError(f"{STAGE}: {len(rows)} rows at world size {world}; allowed: at most "
                              f"max_cases={max_cases}")
        jobs.append(Job(STAGE, f"n{world}", {
            "stage": STAGE, "sweep": view["sweep"], "device": view["device"], "world_size": world,
            "seed": view["seed"], "max_err_ratio": view["max_err_ratio"],
            "settings": {k: section[k] for k in SETTINGS}, "items": rows}))
    return jobs
