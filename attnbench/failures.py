"""One backend call's failure as the harness's status words: ``oom``, ``unsupported`` or ``error``.

Out of memory is ``torch.OutOfMemoryError`` on a GPU, and on a CPU the allocator's ``RuntimeError``
("can't allocate memory") or Python's ``MemoryError``.

Shared by the microbenchmark, the HBM profiler and the pretraining numerics table, so that the same
failure reads the same in every table. SDPA with one pinned kernel raises "No available kernel" and
gives its reasons as warnings (``attnbench.kernels.sdpa``): that is ``unsupported``, with the reasons.
SDPA on nested tensors raises "No viable backend" (its reasons go to the log): ``unsupported`` too.
"""
from __future__ import annotations

import torch

OOM_REASON_CHARS = 300  # an out-of-memory message lists the allocator's state: its head is enough
REASON_CHARS = 800
CPU_OOM = "can't allocate memory"  # c10's DefaultCPUAllocator: "... DefaultCPUAllocator: can't allocate memory: ..."


def one_line(err: BaseException, caught=()) -> str:
    """``Type: message`` on one line, followed by the warnings the call raised (SDPA's reasons)."""
    text = f"{type(err).__name__}: {err}".strip().replace("\n", " ")
    if caught:
        text += " | " + " | ".join(str(w.message).replace("\n", " ") for w in caught)
    return text[:REASON_CHARS]


def first_line(err: BaseException) -> str:
    """``Type: first line of the message``: for a reason that stands in a sentence or a table cell."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"


def classify(err: BaseException, caught=()) -> tuple[str, str]:
    """(status, reason) for an exception raised while building or running one backend on one case."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)) or (
            isinstance(err, RuntimeError) and CPU_OOM in str(err)):
        return "oom", one_line(err)[:OOM_REASON_CHARS]
    if isinstance(err, NotImplementedError):
        return "unsupported", one_line(err)
    if isinstance(err, RuntimeError) and ("No available kernel" in str(err) or "No viable backend" in str(err)):
        return "unsupported", one_line(err, caught)
    return "error", one_line(err, caught if isinstance(err, RuntimeError) else ())
