"""The context-parallel stage's rows: every results column (:data:`attnbench.bench.results.COLUMNS`) plus
:data:`CP_COLUMNS`, typed by :func:`frame`; :func:`merge` joins the world sizes' files
(``attnbench context-parallel-merge``) and fills ``scaling_efficiency`` and ``speedup_vs_1`` from the N=1 row
of the same case, documents and backend.

How the shared columns read here: ``seq_q = seq_kv`` is the whole (packed) sequence; ``flops``
the FLOPs of the whole call (:func:`flops`), ``tflops`` the total rate over every GPU;
``ms_median`` (and ``ms_p20``, ``ms_p80``, ``cv``, ``n_reps``) the slowest rank's time per
repetition; ``peak_mem_bytes`` the largest rank's peak; ``rel_err``, ``max_abs_err`` and
``rel_err_d{q,k,v}`` against fp64 on the gathered sequence; ``backend_version`` the block
kernel's. Byte and roofline columns are not modelled for a sharded call and stay empty.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from attnbench.bench import conventions
from attnbench.bench.results import MEASURED, to_frame, typed_columns
from attnbench.case import Case
from attnbench.parallel.documents import Documents

CP_COLUMNS: dict[str, tuple[str, str]] = {
    "row_id": ("string", "stable id of (case, documents, sharding, backend, world size): one row each"),
    "world_size": ("integer", "ranks N (one GPU each on CUDA; processes on CPU)"),
    "sharding": ("string", "contiguous, zigzag or striped (attnbench.parallel.sharding)"),
    "kernel": ("string", "the per-block kernel (ring) or the SDPA kernel PyTorch's context_parallel pins"),
    "rotation": ("string", "how K/V move: ring-p2p (our ring), allgather or alltoall (PyTorch's set_rotate_method)"),
    "seq_local": ("integer", "tokens per rank"),
    "packing": ("string", "dense, or packed documents: their count, mean, min and max length (the results "
                          "column workload stays the case's: fixed, the grid's lengths)"),
    "doc_lengths": ("string", "document lengths, ';'-joined (empty when dense)"),
    "tflops_per_gpu": ("number", "tflops / world_size"),
    "scaling_efficiency": ("number", "tflops_per_gpu over the N=1 row's tflops (same case, documents, backend); "
                                     "filled by attnbench context-parallel-merge"),
    "speedup_vs_1": ("number", "the N=1 row's ms_median over this row's; filled by attnbench context-parallel-merge"),
    "phase_method": ("string", "how computation and communication were split: ring rows in a serialised pass "
                               "(every exchange waited for before computing) timed with cuda-events or "
                               "wall-clock; PyTorch's context_parallel on CUDA from the profiler's kernel times "
                               "(NCCL kernels against the rest); or none"),
    "serial_ms": ("number", "median time of the serialised call, slowest rank, ms (ring)"),
    "compute_ms_max": ("number", "per-rank computation per call (block kernels and merges), the slowest rank's, ms"),
    "compute_ms_mean": ("number", "the same, mean over ranks, ms"),
    "comm_ms": ("number", "communication per call, the slowest rank's, ms"),
    "exposed_comm_ms": ("number", "max(0, ms_median - compute_ms_max): time of the overlapped call not covered "
                                  "by the slowest rank's computation, ms"),
    "comm_compute_ratio": ("number", "comm_ms / compute_ms_max"),
    "imbalance": ("number", "compute_ms_max / compute_ms_mean: per-rank load imbalance (1 = balanced)"),
    "work_imbalance": ("number", "the block plan's max / mean per-rank score elements (the modelled imbalance)"),
    "per_rank_compute_ms": ("string", "compute_ms of every rank, ';'-joined in rank order"),
    "n_blocks": ("integer", "kernel calls per forward on the busiest rank (ring)"),
    "comm_bytes_per_rank": ("number", "bytes one rank sends per call (ring: attnbench.parallel.ring.comm_bytes)"),
    "comm_gbps": ("number", "comm_bytes_per_rank / comm_ms / 1e9"),
    "peak_mem_bytes_mean": ("number", "peak allocated device memory during one call, mean over ranks (CUDA)"),
    "per_rank_peak_mem_bytes": ("string", "every rank's peak, ';'-joined (CUDA)"),
    "device_mem_bytes": ("number", "total memory of one GPU (CUDA)"),
    "numerics_status": ("string", "checked, off, or why skipped (e.g. the sequence is over numerics_max_seq)"),
    "rel_err_unsharded": ("number", "the same kernel's error on one device, whole sequence, same dtype"),
    "err_ratio_vs_unsharded": ("number", "worst of output and gradient errors over the unsharded kernel's: "
                                         "what sharding and merging add"),
}

# what identifies a row's problem apart from world size and sharding: the N=1 baseline is joined on it
BASELINE_KEYS = ("case_id", "packing", "doc_lengths", "backend")


def flops(case: Case, documents: Documents | None) -> float:
    """FLOPs of the call (:func:`attnbench.bench.conventions.flops`), summed over documents when packed:
    only work inside a document counts, as only it is computed."""
    if documents is None:
        return conventions.flops(case)
    return sum(conventions.flops(replace(case, seq_q=n, seq_kv=n)) for n in documents.lengths)


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows to a frame: results columns first, then :data:`CP_COLUMNS`, typed."""
    return typed_columns(to_frame(rows), CP_COLUMNS)


def merge(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """One frame of every world size's rows, with the efficiency against the N=1 row filled."""
    df = frame(pd.concat(parts, ignore_index=True).to_dict("records")) if parts else frame([])
    base = df[(df["world_size"] == 1) & df["status"].isin(MEASURED)]
    base = base.drop_duplicates(list(BASELINE_KEYS)).set_index(list(BASELINE_KEYS))
    keys = pd.MultiIndex.from_frame(df[list(BASELINE_KEYS)].astype(object))
    one_tflops = base["tflops_per_gpu"].reindex(keys).to_numpy(dtype=float)
    one_ms = base["ms_median"].reindex(keys).to_numpy(dtype=float)
    measured = df["status"].isin(MEASURED).to_numpy()
    df["scaling_efficiency"] = np.where(measured, df["tflops_per_gpu"].to_numpy(dtype=float) / one_tflops, np.nan)
    df["speedup_vs_1"] = np.where(measured, one_ms / df["ms_median"].to_numpy(dtype=float), np.nan)
    return df
