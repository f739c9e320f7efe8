"""What each attention variant computes, once: the mask and the score change every backend must match.

Positions are those of one sequence (or document), causal alignment bottom-right: query row ``i`` of
a sequence with ``q`` queries and ``kv`` keys sits at position ``p = i + kv - q``, and key ``j`` at
``j``. With ``s = (q_i . k_j) * scale``:

==================  ==========================================================================
``none``            keep ``j <= p`` when causal, every key otherwise
``sliding_window``  causal and ``j >= p - window`` (flash-attention's ``window_size = (window, 0)``,
                    FlashInfer's ``window_left = window``; Mistral 7B, Jiang et al. 2023)
``softcap``         ``s -> softcap * tanh(s / softcap)`` (Gemma 2, Team et al. 2024; flash-attention's
                    ``softcap``, FlashInfer's ``logits_soft_cap``)
``alibi``           causal, ``s -> s - slope_h * (p - j)`` with the geometric slopes of Press et al.
                    2022 (:func:`alibi_slopes`; FlashInfer's ``get_alibi_slopes``). FlashInfer adds
                    ``slope_h * (j - i)``: the same scores shifted by a constant per row, which the
                    softmax removes
``document``        the independent segments are the documents (:meth:`attnbench.case.Case.segments`),
                    each plain causal or not: nothing to apply inside one
``prefix_lm``       keep ``j <= p`` or ``j < prefix_len`` (T5's prefix LM, Raffel et al. 2020)
==================  ==========================================================================

:class:`Semantics` carries one case's variant; :meth:`Semantics.keep`, :meth:`Semantics.bias` and
:meth:`Semantics.transform` act on score blocks of any rows and keys, which is how the fp64 reference
and the eager baseline apply them block by block.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.case import Case


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi slopes (Press et al. 2022): ``2^(-8 i / n)`` for ``i = 1..n`` when ``n`` is a power of two;
    otherwise those of the next lower power of two ``m`` followed by every other slope of ``2m``."""
    m = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * i / m) for i in range(1, m + 1)]
    slopes += [2.0 ** (-4.0 * i / m) for i in range(1, 2 * (heads - m), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


@dataclass(frozen=True)
class Semantics:
    """One case's mask and score change, applied to blocks of rows of one segment."""

    variant: str = "none"
    causal: bool = False
    window: int = 0
    softcap: float = 0.0
    prefix_len: int = 0
    heads_q: int = 1

    @staticmethod
    def of(case: Case) -> "Semantics":
        causal = case.implied_causal if case.variant != "none" else case.causal
        return Semantics(case.variant, causal, case.window, case.softcap, case.prefix_len, case.heads_q)

    @property
    def masked(self) -> bool:
        return self.causal or self.variant in ("sliding_window", "prefix_lm")

    def keep(self, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor | None:
        """Which (query position ``p[:, None]``, key ``j[None, :]``) pairs attend; None: all of them."""
        p, j = p[:, None], j[None, :]
        if self.variant == "prefix_lm":
            return (j <= p) | (j < self.prefix_len)
        if not self.causal:
            return None
        keep = j <= p
        if self.variant == "sliding_window":
            keep = keep & (j >= p - self.window)
        return keep

    def bias(self, p: torch.Tensor, j: torch.Tensor, heads: slice, dtype) -> torch.Tensor | None:
        """ALiBi's additive bias for query heads ``heads``: (heads, rows, keys); None for other variants."""
        if self.variant != "alibi":
            return None
        slopes = alibi_slopes(self.heads_q)[heads].to(device=p.device, dtype=dtype)
        return -slopes[:, None, None] * (p[:, None] - j[None, :]).to(dtype)

    def transform(self, scores: torch.Tensor) -> torch.Tensor:
        """The score change before the mask (softcap); identity for other variants."""
        if self.variant == "softcap":
            return self.softcap * torch.tanh(scores / self.softcap)
        return scores

    def key_limit(self, last_p: int, kv: int) -> int:
        """Keys [0, limit) hold every key any row up to position ``last_p`` can see: the prefix a block
        of rows needs (all ``kv`` without a mask)."""
        if not self.masked:
            return kv
        limit = last_p + 1
        if self.variant == "prefix_lm":
            limit = max(limit, self.prefix_len)
        return min(kv, limit)


def dense_mask(sem: Semantics, device, q_len: int, kv_len: int, heads: slice | None = None,
               dtype=torch.float32) -> torch.Tensor | None:
    """The whole (q_len, kv_len) mask of one segment for a backend that takes a dense one: bool when the
    variant only masks, an additive float bias (heads, q, kv) for ALiBi (-inf where masked)."""
    p = torch.arange(q_len, device=device) + (kv_len - q_len)
    j = torch.arange(kv_len, device=device)
    keep = sem.keep(p, j)
    bias = sem.bias(p, j, heads if heads is not None else slice(None), dtype)
    if bias is None:
        return keep
    return bias if keep is None else bias.masked_fill(~keep, float("-inf"))
