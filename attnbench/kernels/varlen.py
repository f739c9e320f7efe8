"""The varlen view of a case: token rows of every segment end to end, with their offsets.

Every native ragged path takes the same thing: flash-attention's ``cu_seqlens`` API, FlashInfer's
ragged wrappers (``indptr``), PyTorch's nested jagged tensors (``offsets``) and the project's Triton
kernel: q rows (total query tokens, Hq, D), k and v rows (total KV tokens, Hkv, D) and int32 offsets
of each segment. A segment is a sequence of a ragged batch, a document of the ``document`` variant,
or a batch row of a dense case (:meth:`attnbench.case.Case.segments`). :func:`varlen_view` builds it
in ``build()``, outside the timed call; :func:`to_case_layout` puts output rows back in the case's
layout (packed BHSD for a ragged case, BHSD otherwise) for the numerics.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.case import Case, Tensors, cu_seqlens
from attnbench.workloads.pages import token_rows


@dataclass(frozen=True)
class Varlen:
    q: torch.Tensor  # (total_q, Hq, D), contiguous
    k: torch.Tensor  # (total_kv, Hkv, D)
    v: torch.Tensor  # (total_kv, Hkv, Dv)
    cu_q: torch.Tensor  # (segments + 1,) int32
    cu_kv: torch.Tensor
    max_q: int
    max_kv: int
    lens_q: tuple[int, ...]
    lens_kv: tuple[int, ...]


def varlen_view(case: Case, t: Tensors) -> Varlen:
    segments = case.segments()
    lens_q, lens_kv = tuple(q for q, _ in segments), tuple(kv for _, kv in segments)
    device = t.q.device
    q, k, v = (token_rows(x.detach()).contiguous() for x in (t.q, t.k, t.v))
    return Varlen(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_kv, device), max(lens_q), max(lens_kv),
                  lens_q, lens_kv)


def to_case_layout(case: Case, rows: torch.Tensor) -> torch.Tensor:
    """Output rows (total_q, Hq, Dv) -> the case's layout: (1, Hq, total_q, Dv) packed, or (B, Hq, Sq, Dv)."""
    if case.ragged:
        return rows.transpose(0, 1).unsqueeze(0)
    return rows.unflatten(0, (case.batch, case.seq_q)).transpose(1, 2)
