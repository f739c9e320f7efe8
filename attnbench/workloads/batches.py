"""Form a request stream into the batches a serving engine would run, one :class:`Batch` per case.

* **Prefill** (:func:`prefill_batches`): whole prompts, packed in order into batches of at most
  ``token_budget`` tokens (vLLM's ``max_num_batched_tokens``); a batch closes when the next prompt does
  not fit, and that prompt opens the next one. Prompts are clipped to ``max_len`` first (at most the
  budget), so every prompt fits an empty batch.
* **Chunked prefill** (:func:`chunked_batches`): the scheduler of Sarathi-Serve (Agrawal et al., OSDI
  2024) and vLLM's chunked prefill, one step per batch: requests in flight get their next chunk first
  (at most ``chunk`` tokens each), new requests are admitted in order while budget is left, and a
  prompt's chunk attends to the prefix its earlier chunks cached: ``q = chunk``, ``kv = done + chunk``.
* **Decode** (:func:`decode_batches`): ``requests`` consecutive requests per batch, one new token
  each, every one part-way through its output: KV length = prompt + ``g``, ``g`` drawn uniformly from
  ``[0, generated)`` (seeded), so a batch mixes short and long caches as a running engine does.

``order`` is ``arrival`` (the stream's order) or ``sampled`` (a seeded permutation of it, without
replacement). Every function returns exactly ``count`` batches or raises :class:`BatchError`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbench.workloads.requests import Requests

ORDERS = ("arrival", "sampled")


class BatchError(ValueError):
    """A stream too short for the batches asked of it, or a bad order; the message is one line."""


@dataclass(frozen=True)
class Batch:
    lens_q: tuple[int, ...]  # query tokens per sequence
    lens_kv: tuple[int, ...]  # KV tokens per sequence (>= lens_q: the cached prefix plus the new tokens)


def ordered(requests: Requests, order: str, seed: int) -> np.ndarray:
    """Request indices in arrival order, or a seeded permutation of them."""
    if order == "arrival":
        return np.arange(len(requests))
    if order == "sampled":
        return np.random.default_rng(seed).permutation(len(requests))
    raise BatchError(f"order={order!r} is not allowed; allowed: {', '.join(ORDERS)}")


def _too_short(requests: Requests, made: int, count: int, what: str) -> BatchError:
    return BatchError(f"workload {requests.name!r} has {len(requests)} requests: {made} {what} batches, not "
                      f"{count}; allowed: batches <= {made}")


def prefill_batches(requests: Requests, *, token_budget: int, count: int, order: str = "arrival", seed: int = 0,
                    max_len: int | None = None) -> list[Batch]:
    """``count`` batches of whole prompts, each at most ``token_budget`` tokens."""
    cap = min(max_len or token_budget, token_budget)
    batches, current = [], []
    for i in ordered(requests, order, seed):
        n = int(min(requests.context[i], cap))
        if sum(current) + n > token_budget:
            batches.append(Batch(tuple(current), tuple(current)))
            current = []
            if len(batches) == count:
                return batches
        current.append(n)
    if current and len(batches) < count:
        batches.append(Batch(tuple(current), tuple(current)))
    if len(batches) < count:
        raise _too_short(requests, len(batches), count, "prefill")
    return batches


def chunked_batches(requests: Requests, *, token_budget: int, chunk: int, count: int, order: str = "arrival",
                    seed: int = 0, max_len: int | None = None) -> list[Batch]:
    """``count`` scheduler steps of chunked prefill (module docstring), from an empty cache."""
    if not 0 < chunk <= token_budget:
        raise BatchError(f"chunk={chunk} is not allowed; allowed: 1 to token_budget ({token_budget})")
    pending = iter(ordered(requests, order, seed))
    in_flight: list[list[int]] = []  # [tokens done, prompt length]
    batches = []
    while len(batches) < count:
        left, lens_q, lens_kv = token_budget, [], []
        for request in in_flight:
            n = min(request[1] - request[0], chunk, left)
            if n:
                request[0] += n
                left -= n
                lens_q.append(n)
                lens_kv.append(request[0])
        while left > 0:
            i = next(pending, None)
            if i is None:
                break
            length = int(min(requests.context[i], max_len or requests.context[i]))
            n = min(length, chunk, left)
            in_flight.append([n, length])
            left -= n
            lens_q.append(n)
            lens_kv.append(n)
        in_flight = [r for r in in_flight if r[0] < r[1]]
        if not lens_q:
            raise _too_short(requests, len(batches), count, "chunked-prefill")
        batches.append(Batch(tuple(lens_q), tuple(lens_kv)))
    return batches


def decode_batches(requests: Requests, *, size: int, count: int, order: str = "arrival", seed: int = 0,
                   max_len: int | None = None) -> list[Batch]:
    """``count`` batches of ``size`` one-token decode steps, each request part-way through its output."""
    index = ordered(requests, order, seed)
    if len(index) < size * count:
        raise _too_short(requests, len(index) // size, count, f"{size}-request decode")
    index = index[: size * count]
    rng = np.random.default_rng([seed, 1])  # its own stream: the same progress whatever the order's draw
    progress = np.floor(rng.random(len(index)) * requests.generated[index]).astype(np.int64)
    kv = requests.context[index] + progress
    if max_len:
        kv = np.minimum(kv, max_len)
    return [Batch((1,) * size, tuple(int(n) for n in kv[b * size:(b + 1) * size])) for b in range(count)]
