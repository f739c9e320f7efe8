"""The per-rank program: ``torchrun --nproc-per-node N -m attnbench.parallel.worker --job J --out O``.

Every rank runs every item of the job (:mod:`attnbench.parallel.plan`) in the same order:

1. draw the whole sequence's inputs (every rank the same, from the case's seed), keep its shard
   (:meth:`attnbench.parallel.backends.CPBackend.prepare`) and free the rest;
2. one call, which is the first warm-up and, on CUDA, the peak-memory measurement;
3. the timed repetitions (:func:`attnbench.parallel.timing.time_ranks`);
4. computation against communication per rank: ring backends in serialised calls
   (:class:`attnbench.parallel.comm.PhaseTimer`), PyTorch's context_parallel on CUDA from the
   profiler's kernel times (:func:`attnbench.parallel.comm.kernel_time_split`);
5. numerics up to ``numerics_max_seq``: the shards gathered against fp64 on the whole sequence,
   and the same kernel's unsharded error as the yardstick (:mod:`attnbench.parallel.numerics`).

A failure on any rank is the item's status on all (:func:`attnbench.failures.classify`; the ranks
agree before the next item); an ``oom`` marks the longer sequences of the same kind ``oom``
without running them. Rank 0 writes the rows after every item, atomically, so a job stopped
midway keeps what it finished. Process-group calls time out after ``collective_timeout_s``:
a rank left waiting for a failed peer ends the job instead of hanging it, and the launcher
writes the rows it did not finish (:mod:`attnbench.parallel.launch`).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from attnbench.bench.inputs import make_tensors
from attnbench.bench.provenance import environment, sm_clock_mhz, timestamp
from attnbench.bench.results import MEASURED, empty_row, write_atomic
from attnbench.case import Case, Tensors
from attnbench.failures import classify, one_line
from attnbench.parallel import numerics
from attnbench.parallel.backends import Prepared, get_cp_backend
from attnbench.parallel.blocks import rank_work
from attnbench.parallel.columns import flops, frame
from attnbench.parallel.comm import PhaseTimer, kernel_time_split
from attnbench.parallel.documents import Documents
from attnbench.parallel.plan import STAGE
from attnbench.parallel.ring import Ring, ring_attention
from attnbench.parallel.sharding import Sharding
from attnbench.parallel.timing import gather_floats, time_ranks


def base_row(job: dict, item: dict, case: Case, documents: Documents | None, sharding: Sharding) -> dict:
    """Everything known before running: identity, the case, provenance, FLOPs."""
    backend = get_cp_backend(item["backend"])
    row = empty_row() | case.fields() | environment(job["device"])
    row.update(sweep=job["sweep"], group=item["group"], case_id=case.case_id, backend=backend.name,
               backend_version=backend.version(), compute_dtype=case.dtype, flops=flops(case, documents),
               row_id=item["row_id"], world_size=sharding.world, sharding=sharding.name, kernel=backend.kernel_name,
               rotation=getattr(backend, "rotation", "ring-p2p"), seq_local=sharding.local,
               packing=documents.describe() if documents else "dense",
               doc_lengths=";".join(map(str, documents.lengths)) if documents else "", status="ok", reason="")
    work = rank_work(sharding, case.causal, documents) if backend.name.startswith("ring-") else None
    if work:
        row["work_imbalance"] = max(work) / statistics.fmean(work)
    return row


def _seed(case: Case, base: int) -> int:
    return (int(case.case_id, 16) + base) % (2 ** 31)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _phases(prepared: Prepared, device: str, reps: int) -> dict:
    """Per-rank computation and communication per call, every rank's, and how they were measured.

    Ring: the serialised call (median over ``reps``), timed span by span (:class:`PhaseTimer`).
    PyTorch's context_parallel on CUDA: the profiler's kernel time of one overlapped call, NCCL
    kernels against the rest (:func:`kernel_time_split`). Otherwise nothing is split.
    """
    if prepared.serialised is not None:
        timer = PhaseTimer(device)
        method = f"{timer.method} (serialised pass)"
        compute, comm, wall = [], [], []
        for _ in range(reps):
            timer.reset()
            dist.barrier()
            start = time.perf_counter()
            prepared.serialised(timer)
            _sync(device)
            wall.append(time.perf_counter() - start)
            spent = timer.totals_s()
            compute.append(spent["compute"])
            comm.append(spent["comm"])
        mine = [statistics.median(compute), statistics.median(comm), statistics.median(wall)]
    elif device == "cuda":
        method = "profiler kernel time, NCCL against the rest (overlapped call)"
        dist.barrier()
        try:
            spent = kernel_time_split(prepared.run)
        except RuntimeError as err:  # the profiler is optional to a row: its time and numerics still count
            return {"phase_method": f"none (profiler failed: {one_line(err)[:200]})"}
        mine = [spent["compute"], spent["comm"], float("nan")]
    else:
        return {"phase_method": "none (no split of PyTorch's context_parallel without the CUDA profiler)"}
    per_rank = gather_floats(mine)
    compute_ms = [r[0] * 1e3 for r in per_rank]
    found = {"phase_method": method, "compute_ms_max": max(compute_ms), "compute_ms_mean": statistics.fmean(compute_ms),
             "comm_ms": max(r[1] for r in per_rank) * 1e3, "serial_ms": max(r[2] for r in per_rank) * 1e3,
             "per_rank_compute_ms": ";".join(f"{c:.4g}" for c in compute_ms)}
    found["imbalance"] = found["compute_ms_max"] / found["compute_ms_mean"] if found["compute_ms_mean"] else math.nan
    found["comm_compute_ratio"] = found["comm_ms"] / found["compute_ms_max"] if found["compute_ms_max"] else math.nan
    if found["comm_ms"] > 0 and math.isfinite(prepared.comm_bytes):
        found["comm_gbps"] = prepared.comm_bytes / (found["comm_ms"] / 1e3) / 1e9
    return found


def _unsharded(item: dict, case: Case, full: Tensors, documents: Documents | None):
    """The same block kernel on the whole sequence, on this rank alone (a ring of one)."""
    kernel = get_cp_backend(item["backend"]).kernel()
    ring = Ring(Sharding("contiguous", 1, case.seq_kv), 0, kernel, case.causal, case.scale, documents)

    def layout(x):
        return x if kernel.layout == "bhsd" else x.transpose(1, 2).contiguous()

    grad = case.has_backward
    q, k, v = (layout(x).detach().requires_grad_(grad) for x in (full.q, full.k, full.v))
    out = ring_attention(q, k, v, ring)
    grads = torch.autograd.grad(out, (q, k, v), layout(full.dout)) if grad else None

    def back(x):
        return x.detach() if kernel.layout == "bhsd" else x.detach().transpose(1, 2)

    return back(out), (tuple(back(g) for g in grads) if grads else None)


def _numerics(job: dict, item: dict, case: Case, documents, prepared: Prepared, rank: int) -> dict:
    """Errors of the gathered output (and gradients) against fp64; filled on rank 0."""
    out, grads = prepared.result()
    layout = prepared.layout
    out = numerics.gather_shards(out, layout)
    grads = tuple(numerics.gather_shards(g, layout) for g in grads) if grads else None
    if rank != 0:
        return {}
    full = make_tensors(case, job["device"], seed=_seed(case, job["seed"]), requires_grad=False)
    full64 = Tensors(*(None if x is None else x.double() for x in (full.q, full.k, full.v, full.dout)))
    ref_out, ref_grads = numerics.document_reference(full64, case, documents)
    got = numerics.errors(out, grads, ref_out, ref_grads)
    base = numerics.errors(*_unsharded(item, case, full, documents), ref_out, ref_grads)
    found = {"numerics_status": "checked", "rel_err": got[0].rel_err, "max_abs_err": got[0].max_abs_err,
             "rel_err_unsharded": base[0].rel_err}
    pairs = [(got[0], base[0])]
    if got[1]:
        found.update({f"rel_err_d{n}": e.rel_err for n, e in zip("qkv", got[1])})
        pairs += list(zip(got[1], base[1]))
    ratios = [a.rel_err / b.rel_err if b.rel_err > 0 else (1.0 if a.rel_err == 0 else math.inf) for a, b in pairs]
    found["err_ratio_vs_unsharded"] = max(ratios)
    if not all(math.isfinite(e.rel_err) for e, _ in pairs):
        found.update(status="numerics_fail", reason="non-finite output or gradient")
    elif found["err_ratio_vs_unsharded"] > job["max_err_ratio"]:
        found.update(status="numerics_fail", reason=f"error {found['err_ratio_vs_unsharded']:.3g}x the unsharded "
                                                    f"kernel's; allowed: at most max_err_ratio={job['max_err_ratio']}")
    return found


def measure(job: dict, item: dict, case: Case, documents, sharding: Sharding, rank: int) -> dict:
    """Run one item on this rank; the row's measured fields (rank 0's are the ones written)."""
    device, settings = job["device"], job["settings"]
    backend = get_cp_backend(item["backend"])
    start = time.perf_counter()
    full = make_tensors(case, device, seed=_seed(case, job["seed"]), requires_grad=False)
    prepared = backend.prepare(case, full, sharding, documents, rank)
    del full
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    try:
        prepared.run()
        _sync(device)
        found = {"setup_s": time.perf_counter() - start, "sm_clock_start_mhz": sm_clock_mhz()}
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else float("nan")
        timing, _ = time_ranks(prepared.run, device, max(0, settings["warmup"] - 1), settings["reps"])
        found.update(timer=timing.method, ms_median=timing.median * 1e3, ms_p20=timing.quantile(0.2) * 1e3,
                     ms_p80=timing.quantile(0.8) * 1e3, cv=timing.cv, n_reps=timing.n,
                     sm_clock_end_mhz=sm_clock_mhz(), comm_bytes_per_rank=prepared.comm_bytes)
        per_rank = gather_floats([peak, prepared.n_blocks])
        peaks = [r[0] for r in per_rank]
        blocks = max(r[1] for r in per_rank)
        found["n_blocks"] = int(blocks) if math.isfinite(blocks) else None
        if device == "cuda":
            found.update(peak_mem_bytes=max(peaks), peak_mem_bytes_mean=statistics.fmean(peaks),
                         per_rank_peak_mem_bytes=";".join(str(int(p)) for p in peaks),
                         device_mem_bytes=torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        found.update(_phases(prepared, device, settings["serial_reps"]))
        if "compute_ms_max" in found:
            found["exposed_comm_ms"] = max(0.0, found["ms_median"] - found["compute_ms_max"])
        if not settings["numerics"]:
            found["numerics_status"] = "off"
        elif case.seq_kv > settings["numerics_max_seq"]:
            found["numerics_status"] = f"skipped: sequence over numerics_max_seq={settings['numerics_max_seq']}"
        else:
            found.update(_numerics(job, item, case, documents, prepared, rank))
        return found
    finally:
        prepared.close()


def _agree(status: str, reason: str, rank: int) -> tuple[str, str]:
    """Every rank's (status, reason) -> the first failure's, as every rank's outcome (one all-gather)."""
    outcomes = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, (status, reason))
    for r, (s, why) in enumerate(outcomes):
        if s not in MEASURED:
            return s, why if r == rank or not why else f"rank {r}: {why}"
    return status, reason


def _shape_key(item: dict) -> tuple:
    """Items that differ only in length: an oom at one length skips the longer ones."""
    fields = {k: v for k, v in item["case"].items() if k not in ("seq_q", "seq_kv")}
    # as JSON: a case's workload fields may be lists, which a tuple key could not hash
    return (item["group"], item["backend"], item["sharding"], json.dumps(fields, sort_keys=True),
            item["documents"] is not None)


def run_job(job: dict, out: str | None, log=lambda s: print(s, file=sys.stderr, flush=True)) -> list[dict]:
    """Every item of the job on this rank (the process group is up); rank 0 writes ``out`` after each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows, went_oom = [], {}
    for item in job["items"]:
        case = Case(**item["case"])
        documents = Documents(tuple(item["documents"])) if item["documents"] else None
        sharding = Sharding(item["sharding"], world, case.seq_kv)
        row = base_row(job, item, case, documents, sharding)
        backend = get_cp_backend(item["backend"])
        key = _shape_key(item)
        status, reason = "ok", ""
        if key in went_oom:
            status, reason = "oom", f"not run: this shape already ran out of memory at S={went_oom[key]}"
        else:
            ok, why = backend.available(job["device"])
            if ok:
                ok, why = backend.supports(case, sharding.name, documents)
                status = "ok" if ok else "unsupported"
            else:
                status = "unavailable"
            reason = why if not ok else ""
        if status == "ok":
            try:
                row.update(measure(job, item, case, documents, sharding, rank))
                status, reason = row["status"], row["reason"]
            except Exception as err:  # one item's failure is its row; the job goes on
                status, reason = classify(err)
                if job["device"] == "cuda":
                    torch.cuda.empty_cache()
        status, reason = _agree(status, reason, rank)
        if status == "oom":
            went_oom.setdefault(key, case.seq_kv)
        row.update(status=status, reason=reason[:800], timestamp=timestamp())
        if row.get("ms_median") and status in MEASURED:
            row["tflops"] = row["flops"] / (row["ms_median"] / 1e3) / 1e12
            row["tflops_per_gpu"] = row["tflops"] / world
        rows.append(row)
        if rank == 0:
            if out:
                write_atomic(frame(rows), out)
            text = f"{row['ms_median']:.3g} ms, {row['tflops']:.3g} TFLOP/s" if status == "ok" else reason[:120]
            log(f"cp n{world} {item['backend']:18s} {item['sharding']:10s} {case.label()}: {status} {text}")
    return rows


def init_process_group(device: str, timeout_s: float) -> int:
    """nccl on CUDA (one GPU per rank: LOCAL_RANK), gloo on CPU; returns the rank."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return dist.get_rank()


def main(argv: list[str] | None = None) -> int:
    from attnbench.plan import read_job

    parser = argparse.ArgumentParser(prog="python -m attnbench.parallel.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--job", required=True, help="the job's plan file (plan/context_parallel/n<N>.json)")
    parser.add_argument("--out", required=True, help="results parquet (rank 0 writes it)")
    args = parser.parse_args(argv)
    job = read_job(args.job, (STAGE,))
    settings = job["settings"]
    if job["device"] == "cpu":
        torch.set_num_threads(settings["threads"])
    init_process_group(job["device"], settings["collective_timeout_s"])
    try:
        if dist.get_world_size() != job["world_size"]:
            raise SystemExit(f"attnbench: {args.job} is for {job['world_size']} ranks; torchrun started "
                             f"{dist.get_world_size()}")
        run_job(job, args.out)
    except Exception as err:
        print(f"attnbench: rank {dist.get_rank()}: {one_line(err)}", file=sys.stderr)
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
