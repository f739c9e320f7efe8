"""Synthetic passkey retrieval (Mohtashami and Jaggi 2023; used by PI, section 3.4, and YaRN, section 4.3.2).

A document of exactly ``length`` byte tokens hides a random ``digits``-digit key
at a chosen depth inside repeated filler text and ends with a question whose
answer is the key. The model retrieves the key when greedy decoding after the
question reproduces every digit; with the correct prefix fed back that is the
same as every digit being the argmax at its position, so one forward scores a
document (no generation loop). The wording is this project's own; only the task
design follows the papers.

:class:`PasskeyMixture` is the training data of the capability experiment: text windows with
a share of each batch replaced by passkey documents, handed to the one training loop
(:func:`attnbench.train.loop.train`) as its batch source.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnbench.context.perplexity import LanguageModel
from attnbench.train.data import TokenData

INTRO = b"Find the key in this text.\n"
FILLER = b"The hills are quiet and the river runs on. The day is long and the road is old. "
NEEDLE = b"\nThe key is {key}. Remember {key}.\n"
QUESTION = b"\nWhat is the key? The key is "


@dataclass(frozen=True)
class PasskeyBatch:
    tokens: Tensor        # (N, length) int64 byte tokens
    answer_start: Tensor  # (N,) index of the first key digit
    depth: Tensor         # (N,) needle position / length
    digits: int


def _document(length: int, key: str, depth: float) -> tuple[bytes, int, int]:
    needle = NEEDLE.replace(b"{key}", key.encode())
    fixed = len(INTRO) + len(needle) + len(QUESTION) + len(key)
    room = length - fixed
    if room < 0:
        raise ValueError(f"passkey length={length} is too short; allowed: >= {fixed} tokens")
    filler = (FILLER * (room // len(FILLER) + 1))[:room]
    cut = round(depth * room)
    text = INTRO + filler[:cut] + needle + filler[cut:] + QUESTION + key.encode()
    return text, len(INTRO) + cut, len(text) - len(key)


def min_length(digits: int = 5) -> int:
    """The shortest document that fits the intro, the needle and the question."""
    return len(INTRO) + len(NEEDLE.replace(b"{key}", b"0" * digits)) + len(QUESTION) + digits


def make_batch(n: int, length: int, *, digits: int = 5, seed: int = 0, depths: list[float] | None = None) -> PasskeyBatch:
    """``n`` documents of ``length`` tokens; keys uniform over ``digits`` digits (leading zeros allowed).

    ``depths`` (fractions in [0, 1]) places the needles; by default they are uniform at random.
    """
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, 10 ** digits, (n,), generator=gen).tolist()
    where = torch.rand(n, generator=gen).tolist() if depths is None else [depths[i % len(depths)] for i in range(n)]
    rows, starts, needle_at = [], [], []
    for key, depth in zip(keys, where):
        text, at, answer = _document(length, f"{key:0{digits}d}", depth)
        rows.append(torch.frombuffer(bytearray(text), dtype=torch.uint8).long())
        starts.append(answer)
        needle_at.append(at / length)
    return PasskeyBatch(torch.stack(rows), torch.tensor(starts), torch.tensor(needle_at), digits)


class PasskeyMixture:
    """A :class:`~attnbench.train.data.BatchSource`: ``text``'s training windows with ``round(fraction x batch)``
    rows of every batch replaced by passkey documents of the window's length (keys and depths drawn from
    ``(seed, step)``, so a resumed run sees the same batches); validation batches are ``text``'s."""

    def __init__(self, text: TokenData, fraction: float, digits: int = 5):
        self.text, self.fraction, self.digits = text, fraction, digits
        self.name = f"{text.name}+passkey(fraction={fraction:g},digits={digits})"
        self.sha256, self.loss_floor = text.sha256, float("nan")

    def train_batch(self, step: int, seed: int, batch_size: int, seq_len: int, device: str):
        x, y = self.text.train_batch(step, seed, batch_size, seq_len, device)
        rows = round(self.fraction * batch_size)
        if rows:
            docs = make_batch(rows, seq_len + 1, digits=self.digits, seed=seed * 1_000_003 + step).tokens
            x, y = x.clone(), y.clone()
            x[:rows], y[:rows] = docs[:, :-1].to(device), docs[:, 1:].to(device)
        return x, y

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int, device: str):
        return self.text.val_batches(n_batches, batch_size, seq_len, device)


@dataclass(frozen=True)
class PasskeyScore:
    accuracy: float        # share of documents whose every key digit is the greedy choice
    digit_accuracy: float  # share of key digits that are
    n: int


def score(model: LanguageModel, batch: PasskeyBatch, batch_size: int = 1) -> PasskeyScore:
    """Greedy retrieval accuracy of ``model`` on ``batch`` (teacher-forced argmax over the key digits)."""
    hits = []
    offsets = torch.arange(batch.digits)
    for i in range(0, batch.tokens.shape[0], batch_size):
        tokens = batch.tokens[i:i + batch_size]
        with torch.no_grad():
            logits = model(tokens)
        pos = batch.answer_start[i:i + batch_size, None] + offsets  # (b, digits) positions of the key
        rows = torch.arange(tokens.shape[0])[:, None]
        predicted = logits[rows.to(logits.device), (pos - 1).to(logits.device)].argmax(-1).cpu()
        hits.append(predicted == tokens[rows, pos])
    hit = torch.cat(hits)
    return PasskeyScore(hit.all(-1).float().mean().item(), hit.float().mean().item(), hit.shape[0])
