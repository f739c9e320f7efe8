"""Perplexity of a causal LM over long text, the two ways the context-extension papers measure it.

* Sliding window (Press et al. 2022; Chen et al. 2023 "PI", section 3.2, stride S = 256):
  windows of the evaluation length move by ``stride``; each token is scored once,
  in the first window that reaches it, so every scored token after the first
  window sees at least ``window - stride`` tokens of context (at least one when
  ``stride == window``, the non-overlapping case).
* Truncated window (Peng et al. 2023 "YaRN", section 4.3.1): each document is cut
  to its first ``length`` tokens and every token of that one window is scored.

The model is any ``model(tokens (B, S) int64) -> logits (B, S, V)``; scores are
natural-log negative log-likelihoods, summed in float64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

LanguageModel = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Score:
    nll_sum: float
    n_tokens: int

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood per token (nats)."""
        return self.nll_sum / self.n_tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


def _token_nll(model: LanguageModel, windows: Tensor) -> Tensor:
    """(B, S-1) NLL of tokens 1..S-1 of each window given the tokens before it."""
    with torch.no_grad():
        logits = model(windows)
    targets = windows[:, 1:].to(logits.device)
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none").cpu()


def sliding_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(begin, first scored position) per window; all windows are ``window`` long, the last one ends at n_tokens."""
    if not 1 <= stride <= window:
        raise ValueError(f"stride={stride} must be in 1..window ({window})")
    if n_tokens < window:
        raise ValueError(f"the evaluation text has {n_tokens} tokens, fewer than the window ({window})")
    spans, scored_to = [], 1  # token 0 has no context and is never scored
    begin = 0
    while True:
        begin = min(begin, n_tokens - window)
        spans.append((begin, scored_to))
        scored_to = begin + window
        if scored_to >= n_tokens:
            return spans
        begin = min(begin + stride, scored_to - 1)  # stride == window: keep one token of context


def sliding_window_score(model: LanguageModel, tokens: Tensor, window: int, stride: int,
                         batch_size: int = 1) -> Score:
    """Score every token of ``tokens`` (1-D) once with windows of ``window`` moved by ``stride``."""
    spans = sliding_windows(tokens.numel(), window, stride)
    nll_sum, count = 0.0, 0
    for i in range(0, len(spans), batch_size):
        chunk = spans[i:i + batch_size]
        windows = torch.stack([tokens[b:b + window] for b, _ in chunk])
        nll = _token_nll(model, windows)  # position j of nll predicts token b + j + 1
        for row, (b, first) in enumerate(chunk):
            scored = nll[row, first - b - 1:]
            nll_sum += scored.double().sum().item()
            count += scored.numel()
    return Score(nll_sum, count)


def truncated_window_score(model: LanguageModel, docs: Tensor, length: int, batch_size: int = 1) -> Score:
    """Score all tokens of the first ``length`` tokens of each row of ``docs`` (N, >= length)."""
    if docs.shape[1] < length:
        raise ValueError(f"documents have {docs.shape[1]} tokens, fewer than the window ({length})")
    nll_sum, count = 0.0, 0
    for i in range(0, docs.shape[0], batch_size):
        nll = _token_nll(model, docs[i:i + batch_size, :length])
        nll_sum += nll.double().sum().item()
        count += nll.numel()
    return Score(nll_sum, count)


def document_starts(n_tokens: int, length: int, n_docs: int) -> list[int]:
    """``n_docs`` evenly spaced offsets of ``length``-token windows in a held-out text (the "documents")."""
    if n_tokens < length:
        raise ValueError(f"the evaluation text has {n_tokens} tokens, fewer than the window ({length})")
    last = n_tokens - length
    return [round(i * last / max(n_docs - 1, 1)) for i in range(n_docs)]
