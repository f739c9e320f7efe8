"""Offline, pinned training data as byte-level tokens, with a seeded split and order.

Sources (``pretrain.data.source``):

* ``shakespeare``: the corpus shipped in :mod:`attnbench.data` (public domain; SHA-256 pinned);
* ``file``: any file by path (``pretrain.data.path``), read as bytes;
* ``synthetic``: an order-k Markov chain over ``vocab`` symbols with ``branching``
  successors per context and Dirichlet(1) transition probabilities, generated from
  ``pretrain.data.seed``. Its expected per-token loss under the true model (the
  conditional entropy, weighted by how often each context occurs in the validation
  split) is known, so a run can be judged against the floor.
* ``synthetic-stream``: the same chain, but every training batch is drawn from it afresh
  (:class:`MarkovStream`), so no window is seen twice however long the run: a corpus read
  many times over is memorised, and its validation loss then measures memorisation, not
  the slow drift a long run is for (Fishman et al. 2024 train on 2T tokens).

Split: the first ``1 - val_fraction`` of the bytes train, the rest validate
(contiguous, so no window straddles both). Order: the batch of step ``t`` is drawn
from a generator seeded with ``(data_seed, t)`` (``train.data_seed``, apart from the
model's ``train.init_seed``), so it depends on nothing else: a resumed run sees the same
batches, and two runs with the same data seed see the same data in the same order.
Validation windows are fixed, evenly spaced and shared by every run.

A training run reads its batches through :class:`BatchSource`; :class:`TokenData` is one,
and a stage may hand the loop another (the context stage's passkey mixture,
:class:`attnbench.context.passkey.PasskeyMixture`).
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from attnbench.errors import ConfigError, reject_unknown_keys
from attnbench.data import CORPORA

SOURCES = ("shakespeare", "file", "synthetic", "synthetic-stream")
SYMBOL_OFFSET = 64  # synthetic symbol i is byte 64 + i ("@", "A", "B", ...)
MIN_BYTES = 1024  # a corpus shorter than this cannot fill a training and a validation window
MAX_CONTEXTS = 1 << 20  # synthetic vocab ** order: the transition table is (contexts, branching)
STREAM_BURN_IN = 64  # chain steps a stream window discards: it starts from a state the chain reaches, not a uniform one
STREAM_BLOCK = 16  # training batches one pass of the stream's chain draws: its step loop is paid once for them all


@dataclass(frozen=True)
class SyntheticConfig:
    vocab: int = 16        # symbols (<= 64)
    order: int = 2         # context length k: the next symbol depends on the previous k (k >= 2 needs attention)
    branching: int = 3     # successors per context
    tokens: int = 400_000  # length of the generated sequence


@dataclass(frozen=True)
class DataConfig:
    source: str = "shakespeare"
    path: str | None = None        # source: file
    val_fraction: float = 0.1
    seed: int = 1234               # synthetic generator seed (the batch order follows train.data_seed)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ConfigError(f"data.source={self.source!r} is not allowed; allowed: {', '.join(SOURCES)}")
        if self.source == "file" and not self.path:
            raise ConfigError("data.path is required with data.source: file")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction={self.val_fraction!r} is not allowed; allowed: 0 < x < 1")

    @classmethod
    def from_dict(cls, values: dict) -> "DataConfig":
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "data")
        values = dict(values)
        if isinstance(values.get("synthetic"), dict):
            reject_unknown_keys(values["synthetic"], [f.name for f in dataclasses.fields(SyntheticConfig)],
                                "data.synthetic")
            values["synthetic"] = SyntheticConfig(**values["synthetic"])
        return cls(**values)


def check_source(cfg: DataConfig, where: str) -> None:
    """What a run would find out only when it starts, checked at planning time: a ``file`` source is a
    readable file of at least :data:`MIN_BYTES` bytes; a synthetic chain's table fits in memory."""
    if cfg.source == "file":
        path = Path(cfg.path)
        if not path.is_file():
            raise ConfigError(f"{where}.path={cfg.path!r} is not a file (relative paths start at the working "
                              f"directory, {Path.cwd()}); allowed: a readable text file")
        try:
            with path.open("rb"):
                pass
        except OSError as err:
            raise ConfigError(f"{where}.path={cfg.path!r} cannot be read ({err.strerror}); "
                              "allowed: a readable file") from None
        size = path.stat().st_size
        if size < MIN_BYTES:
            raise ConfigError(f"{where}.path={cfg.path!r} has {size} bytes; "
                              f"allowed: a file of at least {MIN_BYTES} bytes")
    elif cfg.source in ("synthetic", "synthetic-stream"):
        s = cfg.synthetic
        if s.vocab ** s.order > MAX_CONTEXTS or s.branching > s.vocab:
            raise ConfigError(f"{where}.synthetic: vocab={s.vocab}, order={s.order}, branching={s.branching} is not "
                              f"allowed; allowed: vocab ** order <= {MAX_CONTEXTS} and branching <= vocab")


def _markov_chain(cfg: SyntheticConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(successors (contexts, branching), their probabilities): each context's ``branching`` distinct next
    symbols and Dirichlet(1) weights; a context is the last ``order`` symbols in base ``vocab``."""
    if not 2 <= cfg.vocab <= 64 or cfg.order < 1 or not 1 <= cfg.branching <= cfg.vocab:
        raise ConfigError(f"data.synthetic={cfg} is not allowed; allowed: 2 <= vocab <= 64, order >= 1, "
                          "1 <= branching <= vocab")
    contexts = cfg.vocab ** cfg.order
    successors = np.stack([rng.choice(cfg.vocab, cfg.branching, replace=False) for _ in range(contexts)])
    return successors, rng.dirichlet(np.ones(cfg.branching), size=contexts)


def markov_tokens(cfg: SyntheticConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(symbols (tokens,), per-position entropy in nats of the true next-symbol distribution)."""
    rng = np.random.default_rng(seed)
    successors, probs = _markov_chain(cfg, rng)
    contexts = cfg.vocab ** cfg.order
    entropy = -(probs * np.log(probs)).sum(axis=1)  # (contexts,) nats
    cumulative = probs.cumsum(axis=1).tolist()  # python lists: the chain is sequential, scalar numpy is slower
    succ, ent = successors.tolist(), entropy.tolist()
    draws = rng.random(cfg.tokens).tolist()
    out = [int(s) for s in rng.integers(0, cfg.vocab, cfg.order)]
    per_position = [0.0] * cfg.order
    state = 0
    for s in out:
        state = state * cfg.vocab + s
    last = cfg.branching - 1
    for t in range(cfg.order, cfg.tokens):
        symbol = succ[state][min(bisect.bisect_left(cumulative[state], draws[t]), last)]
        out.append(symbol)
        per_position.append(ent[state])
        state = (state * cfg.vocab + symbol) % contexts
    return np.asarray(out, dtype=np.int64), np.asarray(per_position)


class BatchSource(Protocol):
    """What the training loop reads: seeded training batches, fixed validation batches, and an identity.

    ``name`` and ``sha256`` identify the data in run summaries and in the run's identity hash, so
    they must change whenever the batches would.
    """

    name: str
    sha256: str
    loss_floor: float

    def train_batch(self, step: int, seed: int, batch_size: int, seq_len: int, device: str): ...

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int, device: str): ...


@dataclass
class TokenData:
    """Byte tokens split into train and validation, with what identifies them."""

    name: str
    sha256: str  # of the bytes the tokens came from
    train: torch.Tensor  # uint8 (n_train,)
    val: torch.Tensor  # uint8 (n_val,)
    loss_floor: float = float("nan")  # nats per token on the val split (synthetic only)

    def train_batch(self, step: int, seed: int, batch_size: int, seq_len: int, device: str):
        """(x, y) int64 (B, S): random windows of the train split, a pure function of (seed, step)."""
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.train) - seq_len - 1, (batch_size,), generator=gen)
        return self._windows(self.train, starts, seq_len, device)

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int, device: str):
        """``n_batches`` fixed (x, y) batches at evenly spaced offsets of the val split."""
        count = n_batches * batch_size
        last = len(self.val) - seq_len - 1
        if last < 0:
            raise ConfigError(f"the validation split ({len(self.val)} tokens) is shorter than train.seq_len={seq_len}; "
                              "raise data.val_fraction or shorten the sequence")
        starts = torch.linspace(0, last, count).long()
        return [self._windows(self.val, starts[i * batch_size:(i + 1) * batch_size], seq_len, device)
                for i in range(n_batches)]

    @staticmethod
    def _windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int, device: str):
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, S + 1)
        chunk = tokens[idx].long()
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def _alias_table(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of one distribution over ``n`` outcomes, by Vose's algorithm (Vose 1991, IEEE TSE
    17(9)): (keep, alias), where column j keeps outcome j with chance ``keep[j]`` and otherwise gives ``alias[j]``,
    so that picking a column uniformly gives outcome i with chance ``probs[i]``."""
    n = len(probs)
    scaled, keep, alias = probs * n, np.ones(n), np.arange(n)
    small, large = [j for j in range(n) if scaled[j] < 1], [j for j in range(n) if scaled[j] >= 1]
    while small and large:
        j, donor = small.pop(), large.pop()
        keep[j], alias[j] = scaled[j], donor
        scaled[donor] -= 1 - scaled[j]
        (small if scaled[donor] < 1 else large).append(donor)
    return keep, alias  # columns left over in either list keep their own outcome (1 up to rounding)


@dataclass
class MarkovStream:
    """A synthetic Markov chain (:func:`_markov_chain`) as a :class:`BatchSource` whose training batches are fresh
    draws. One pass of the chain draws :data:`STREAM_BLOCK` steps' batches at once (block ``t // STREAM_BLOCK``,
    from a generator seeded with (data seed, data_seed, block)): each row the chain run from a uniformly drawn
    context for :data:`STREAM_BURN_IN` steps and then ``seq_len + 1`` more, and step ``t``'s batch is the block's
    rows ``(t mod STREAM_BLOCK) * batch_size`` onwards. So a resumed run sees the same batches and every step new
    ones. Validation windows come the same way from a generator of their own, the same for every run;
    ``loss_floor`` is the mean entropy of the true next-symbol distribution over their targets (the expected loss
    of the chain itself). Symbols are bytes ``SYMBOL_OFFSET + i``, as in ``synthetic``."""

    name: str
    sha256: str  # of the transition table
    seed: int
    successors: np.ndarray  # (contexts, branching)
    keep: np.ndarray  # (contexts, branching) Walker's alias table (_alias_table): the chance each column keeps its
    alias: np.ndarray  # (contexts, branching) own successor, and the successor it gives otherwise
    next_context: np.ndarray  # (contexts * branching,) the context after each (context, successor)
    entropy: np.ndarray  # (contexts,) nats
    loss_floor: float = float("nan")  # set by val_batches
    _block: tuple = field(default=(), repr=False, compare=False)  # (its key, its symbols): the last block drawn

    @classmethod
    def build(cls, cfg: SyntheticConfig, seed: int) -> "MarkovStream":
        successors, probs = _markov_chain(cfg, np.random.default_rng(seed))
        table = hashlib.sha256(successors.astype(np.int64).tobytes() + probs.tobytes()).hexdigest()
        keep, alias = zip(*(_alias_table(p) for p in probs))
        next_context = (np.arange(len(successors))[:, None] * cfg.vocab + successors) % len(successors)
        return cls(f"synthetic-stream(v={cfg.vocab},k={cfg.order},b={cfg.branching},seed={seed})", table, seed,
                   successors, np.stack(keep), np.stack(alias), next_context.ravel(),
                   -(probs * np.log(probs)).sum(axis=1))

    def windows(self, rng: np.random.Generator, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(symbols (rows, length), entropy (rows, length) of the distribution each symbol was drawn from).

        Every row's next symbol at once, by Walker's alias method: one uniform u per row and step picks column
        ``floor(u * branching)`` of its context's table, which keeps its own successor if the rest of the draw,
        ``frac(u * branching)``, is below ``keep`` and otherwise takes ``alias`` (Vose 1991, "A linear algorithm
        for generating random numbers with a given distribution", IEEE TSE 17(9))."""
        steps, branching = STREAM_BURN_IN + length, self.successors.shape[1]
        context = rng.integers(0, len(self.successors), rows)
        draws = rng.random((steps, rows)) * branching  # one row of draws per chain step
        symbols, entropy = np.empty((steps, rows), np.int64), np.empty((steps, rows))
        successors, keep, alias = self.successors.reshape(-1), self.keep.reshape(-1), self.alias.reshape(-1)
        for t in range(steps):  # sequential in t, vectorised over rows
            entropy[t] = self.entropy[context]
            column = draws[t].astype(np.int64)
            first = context * branching
            drawn = first + np.where(draws[t] - column < keep[first + column], column, alias[first + column])
            symbols[t], context = successors[drawn], self.next_context[drawn]
        return (np.ascontiguousarray(symbols[STREAM_BURN_IN:].T),
                np.ascontiguousarray(entropy[STREAM_BURN_IN:].T))

    def _batch(self, symbols: np.ndarray, device: str):
        tokens = torch.from_numpy(symbols + SYMBOL_OFFSET)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def train_batch(self, step: int, seed: int, batch_size: int, seq_len: int, device: str):
        block, row = divmod(step, STREAM_BLOCK)
        drawn = self._block
        if not drawn or drawn[0] != (seed, batch_size, seq_len, block):
            symbols, _ = self.windows(np.random.default_rng((self.seed, seed, block)), STREAM_BLOCK * batch_size,
                                      seq_len + 1)
            drawn = self._block = ((seed, batch_size, seq_len, block), symbols)
        return self._batch(drawn[1][row * batch_size:(row + 1) * batch_size], device)

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int, device: str):
        # a generator no training block uses: training seeds three integers, this one two
        symbols, entropy = self.windows(np.random.default_rng((self.seed, 1 << 32)), n_batches * batch_size,
                                        seq_len + 1)
        self.loss_floor = float(entropy[:, 1:].mean())  # the targets are positions 1 .. seq_len
        return [self._batch(symbols[i * batch_size:(i + 1) * batch_size], device) for i in range(n_batches)]


def _split(raw: np.ndarray, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    cut = int(len(raw) * (1 - val_fraction))
    tokens = torch.from_numpy(raw.astype(np.uint8))
    return tokens[:cut], tokens[cut:], cut


@functools.lru_cache(maxsize=4)  # an experiment's runs share their data: read (and hash) it once per process
def load_tokens(cfg: DataConfig) -> TokenData | MarkovStream:
    """Read or generate the bytes, record their SHA-256, split them (read-only tensors: callers index, never write);
    for ``synthetic-stream``, the chain that draws every batch afresh."""
    if cfg.source == "synthetic-stream":
        return MarkovStream.build(cfg.synthetic, cfg.seed)
    if cfg.source == "synthetic":
        symbols, entropy = markov_tokens(cfg.synthetic, cfg.seed)
        raw = (symbols + SYMBOL_OFFSET).astype(np.uint8)
        train, val, cut = _split(raw, cfg.val_fraction)
        floor = float(entropy[cut + 1:].mean())  # targets of the val split are positions cut+1 ...
        s = cfg.synthetic
        name = f"synthetic-markov(v={s.vocab},k={s.order},b={s.branching},n={s.tokens},seed={cfg.seed})"
        return TokenData(name, hashlib.sha256(raw.tobytes()).hexdigest(), train, val, floor)
    if cfg.source == "shakespeare":
        data, name = CORPORA["shakespeare"].read(), "shakespeare"
    else:
        path = Path(cfg.path)
        if not path.is_file():
            raise ConfigError(f"data.path={cfg.path!r} is not a file")
        data, name = path.read_bytes(), f"file:{path.name}"
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) < MIN_BYTES:
        raise ConfigError(f"data source {name} has {len(raw)} bytes; at least {MIN_BYTES} are needed")
    train, val, _ = _split(raw, cfg.val_fraction)
    return TokenData(name, hashlib.sha256(data).hexdigest(), train, val, math.nan)
