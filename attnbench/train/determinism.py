"""Deterministic training runs (``train.deterministic``): the same config, trained twice, gives the same weights.

PyTorch's reproducibility notes (https://pytorch.org/docs/stable/notes/randomness.html) name three switches:
``torch.use_deterministic_algorithms(True)`` (an op with a deterministic alternative uses it, e.g. CUDA's
``index_put_`` with ``accumulate`` and ``scatter_add_``; an op with none raises ``RuntimeError``, which makes the
run an ``error`` row naming the op), cuDNN's ``deterministic`` flag with its autotuner off, and, on CUDA 10.2 and
later, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, read when the process first uses cuBLAS. The guarantee covers
PyTorch's own ops only: kernels it does not know (fa4, the project's Triton kernels, FlexAttention's Triton
templates) run as they are, so a deterministic replicate arm measures whether they repeat.

Golden et al. (2024, "Is Flash Attention Stable?") compare a kernel swap's weight divergence against the
run-to-run floor; with the floor made zero, what is left of a kernel swap is the kernel's numerics.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

import torch

CUBLAS_WORKSPACE_CONFIG = ":4096:8"  # the setting PyTorch's notes give for deterministic cuBLAS


def prepare_process(deterministic: Iterable[bool]) -> None:
    """Before any CUDA work of a process that trains deterministic runs: set ``CUBLAS_WORKSPACE_CONFIG``
    (kept where the caller's environment already sets it), which cuBLAS reads only once."""
    if any(deterministic):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool) -> Iterator[None]:
    """PyTorch's deterministic algorithms and cuDNN's deterministic mode while the block runs (nothing when
    ``enabled`` is false), restored afterwards: one process trains runs that are and runs that are not."""
    if not enabled:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
