"""Packed variable-length batches: several documents in one sequence, attention only within a document.

A packed sequence of ``total`` tokens holds documents of the given lengths back to back; the
boundaries are ``cu_seqlens`` (cumulative lengths starting at 0, the convention of
flash-attention's varlen functions). Query ``i`` sees key ``j`` only when both lie in one
document (and, causal, ``j <= i``): the document-causal mask of packed pretraining (Llama 3,
Dubey et al. 2024, section 3.2; its context parallelism, section 3.3.2, shards such batches).

Where lengths come from:

* :meth:`Documents.from_lengths` takes any list of lengths: the hook for trace-driven lengths
  (``attnbench.workloads``) and for lengths written in a config;
* :func:`synthetic_lengths` draws them from a seeded distribution (lognormal, uniform or fixed)
  until they fill the sequence, the last one cut to fit.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from itertools import accumulate

DISTRIBUTIONS = ("lognormal", "uniform", "fixed")


class DocumentsError(ValueError):
    """Lengths that do not describe a packed sequence."""


@dataclass(frozen=True)
class Documents:
    lengths: tuple[int, ...]

    @classmethod
    def from_lengths(cls, lengths, total: int | None = None) -> "Documents":
        """Documents of these lengths (positive integers); ``total``, when given, must be their sum."""
        lengths = tuple(lengths)
        if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
            raise DocumentsError(f"document lengths {list(lengths)[:8]}...: allowed: a non-empty list of positive "
                                 "integers")
        if total is not None and sum(lengths) != total:
            raise DocumentsError(f"document lengths sum to {sum(lengths)}; allowed: lengths that sum to the "
                                 f"sequence length {total}")
        return cls(lengths)

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def cu_seqlens(self) -> tuple[int, ...]:
        """Document starts and the end: ``(0, n0, n0 + n1, ..., total)``."""
        return (0, *accumulate(self.lengths))

    def segments(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``[start, end)`` cut at document boundaries: ``(seg_start, seg_end, document index)`` each."""
        cu = self.cu_seqlens
        out = []
        doc = bisect.bisect_right(cu, start) - 1
        while start < end:
            stop = min(end, cu[doc + 1])
            out.append((start, stop, doc))
            start, doc = stop, doc + 1
        return out

    def describe(self) -> str:
        """One line for a results row: count, mean and range of the lengths."""
        n = len(self.lengths)
        return f"{n} docs, mean {self.total / n:.0f}, min {min(self.lengths)}, max {max(self.lengths)}"


def synthetic_lengths(total: int, *, distribution: str, mean: float, sigma: float = 1.0, min_len: int = 1,
                      seed: int = 0) -> list[int]:
    """Document lengths drawn until they fill ``total`` tokens; the last one is cut to fit.

    * ``lognormal``: ``exp(N(mu, sigma^2))`` with ``mu = ln(mean) - sigma^2 / 2``, so the mean
      length is ``mean`` (document lengths of web corpora are roughly lognormal);
    * ``uniform``: uniform on ``[min_len, 2 mean - min_len]``;
    * ``fixed``: every document ``mean`` long.

    Each draw is rounded and at least ``min_len``. The same arguments give the same lengths on
    every machine (``random.Random(seed)``).
    """
    if distribution not in DISTRIBUTIONS:
        raise DocumentsError(f"distribution={distribution!r} is not allowed; allowed: {', '.join(DISTRIBUTIONS)}")
    if not mean >= 1 or not min_len >= 1 or min_len > mean:
        raise DocumentsError(f"mean={mean!r}, min_len={min_len!r}: allowed: 1 <= min_len <= mean")
    rng = random.Random(seed)
    mu = math.log(mean) - sigma ** 2 / 2

    def draw() -> int:
        if distribution == "lognormal":
            value = rng.lognormvariate(mu, sigma)
        elif distribution == "uniform":
            value = rng.uniform(min_len, 2 * mean - min_len)
        else:
            value = mean
        return max(min_len, round(value))

    lengths, filled = [], 0
    while filled < total:
        n = min(draw(), total - filled)
        lengths.append(n)
        filled += n
    return lengths
