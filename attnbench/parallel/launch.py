"""``attnbench context-parallel``: start the job's ranks with torchrun, within a time limit, and complete its rows.

The command the rule runs. It starts ``python -m torch.distributed.run --standalone
--nproc-per-node N -m attnbench.parallel.worker`` (a free rendezvous port, so jobs on one host
do not collide; on CUDA the lease has set ``CUDA_VISIBLE_DEVICES`` to N GPUs), keeps NVLink
multicast off for it (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``, unless set otherwise: on shared hosts multicast can take every GPU
out of service), and kills the whole process group after ``timeout_s`` (or at the sweep deadline,
``$ATTNBENCH_DEADLINE``, when that comes first; a job started after it runs nothing).

Rank 0 writes its rows to a partial file as items finish; once torchrun exits, every planned
item without a row gets an ``error`` row saying how the job ended (exit status or time limit,
and the last error line of the ranks), and the results file is written atomically: an earlier
file is replaced only by a complete one. A CUDA host with fewer GPUs than the job's ranks gets
``unavailable`` rows and starts nothing.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from attnbench.bench.provenance import timestamp
from attnbench.bench.results import write_atomic
from attnbench.case import Case
from attnbench.envvars import DEADLINE_ENV, deadline
from attnbench.parallel.columns import frame
from attnbench.parallel.documents import Documents
from attnbench.parallel.sharding import Sharding

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TERM_GRACE_S = 30


def worker_command(job_path: str, partial: str, world: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            "-m", "attnbench.parallel.worker", "--job", job_path, "--out", partial]


def run_ranks(cmd: list[str], env: dict, timeout_s: float) -> tuple[str, str]:
    """Run torchrun in its own process group, relaying its output; (how it ended, its last error line)."""
    errors: collections.deque[str] = collections.deque(maxlen=1)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)

    def relay():
        for line in proc.stdout:
            sys.stderr.write(line)
            if "attnbench: rank" in line or "Error" in line:
                errors.append(line.strip())

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
        ended = "exited 0" if code == 0 else f"exited with code {code}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        ended = f"killed at its time limit ({timeout_s:.4g} s)"
    finally:
        if proc.poll() is None:  # this process was stopped: take the ranks down with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    return ended, (errors[0] if errors else "")


def missing_rows(job: dict, done: set[str], status: str, reason: str) -> list[dict]:
    """A row of ``status`` for every planned item that has none."""
    from attnbench.parallel.worker import base_row

    rows = []
    for item in job["items"]:
        if item["row_id"] in done:
            continue
        case = Case(**item["case"])
        documents = Documents(tuple(item["documents"])) if item["documents"] else None
        row = base_row(job, item, case, documents, Sharding(item["sharding"], job["world_size"], case.seq_kv))
        row.update(status=status, reason=reason[:800], timestamp=timestamp())
        rows.append(row)
    return rows


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def launch(job: dict, job_path: str, out: str) -> pd.DataFrame:
    """Run the job's ranks and return the complete rows (also written to ``out``)."""
    world = job["world_size"]
    if job["device"] == "cuda" and visible_gpus() < world:
        df = frame(missing_rows(job, set(), "unavailable", f"needs {world} GPUs; this host shows {visible_gpus()}"))
        write_atomic(df, out)
        return df
    limit, timeout_s = deadline(), job["settings"]["timeout_s"]
    if limit is not None:
        if time.time() >= limit:
            df = frame(missing_rows(job, set(), "error", f"not run: the sweep deadline (${DEADLINE_ENV}) had passed"))
            write_atomic(df, out)
            return df
        timeout_s = min(timeout_s, limit - time.time())
    partial = Path(out).with_name(f".{Path(out).stem}.partial.parquet")
    partial.unlink(missing_ok=True)
    env = {**MULTICAST_OFF, **os.environ, "OMP_NUM_THREADS": str(job["settings"]["threads"])}
    ended, last = run_ranks(worker_command(job_path, str(partial), world), env, timeout_s)
    kept = pd.read_parquet(partial) if partial.is_file() else None
    done = set(kept["row_id"]) if kept is not None else set()
    reason = f"not measured: the job's ranks {ended}" + (f" ({last})" if last else "")
    missing = missing_rows(job, done, "error", reason)
    rows = (kept.to_dict("records") if kept is not None else []) + missing
    df = frame(rows)
    write_atomic(df, out)
    partial.unlink(missing_ok=True)
    print(f"attnbench context-parallel: ranks {ended}; {len(done)} rows measured, {len(missing)} filled in; "
          f"wrote {out}", file=sys.stderr)
    return df
