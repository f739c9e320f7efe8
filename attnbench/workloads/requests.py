"""Request streams: the prompt and output lengths of a workload's requests, in arrival order.

Three sources, one shape (:class:`Requests`):

* the Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024; CC BY 4.0), shipped in
  ``attnbench/data/azure-llm-inference-2023/`` and pinned by SHA-256: ``azure-code`` (8,819 requests)
  and ``azure-conv`` (19,366);
* a user's CSV file with the same columns (``ContextTokens`` required; ``GeneratedTokens`` and
  ``TIMESTAMP`` optional), named by its file stem;
* a synthetic distribution, seeded: ``fixed`` (every prompt ``len`` tokens), ``uniform`` (integers in
  ``[min_len, max_len]``) or ``lognormal`` (``exp(N(ln median_len, sigma^2))`` rounded and clipped to
  ``[min_len, max_len]``, the shape production prompt lengths are usually fitted with).

Nothing is downloaded: a trace name that is not shipped is a path, and a path is read only when it is
an existing ``.csv`` file under :data:`MAX_CSV_BYTES`.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

TRACE_FOLDER = "azure-llm-inference-2023"
SHIPPED = {  # name -> (file, SHA-256 of its bytes, attnbench/data/azure-llm-inference-2023/README.md)
    "azure-code": ("AzureLLMInferenceTrace_code.csv", "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"),
    "azure-conv": ("AzureLLMInferenceTrace_conv.csv", "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8"),
}
DISTRIBUTIONS = ("fixed", "uniform", "lognormal")
MAX_CSV_BYTES = 64 * 1024 * 1024
MAX_REQUESTS = 10_000_000  # a synthetic stream longer than this is a mistake in the config, not a workload
CONTEXT, GENERATED, TIMESTAMP = "ContextTokens", "GeneratedTokens", "TIMESTAMP"


class RequestsError(ValueError):
    """A trace or distribution that cannot give request lengths; the message is one line."""


@dataclass(frozen=True)
class Requests:
    """Prompt tokens (``context``) and output tokens (``generated``, 0 where unknown) per request."""

    name: str  # the ``workload`` every row of it carries
    context: np.ndarray  # int64, arrival order
    generated: np.ndarray  # int64, same length

    def __len__(self) -> int:
        return len(self.context)


def _parse_csv(text: bytes | str, source: str) -> tuple[np.ndarray, np.ndarray]:
    import io

    import pandas as pd

    raw = io.BytesIO(text) if isinstance(text, bytes) else io.StringIO(text)
    try:
        df = pd.read_csv(raw, dtype={TIMESTAMP: "string"}, usecols=lambda c: c in (CONTEXT, GENERATED, TIMESTAMP))
    except (ValueError, pd.errors.ParserError) as err:
        raise RequestsError(f"{source}: not a trace CSV ({' '.join(str(err).split())[:160]})") from None
    if CONTEXT not in df:
        raise RequestsError(f"{source}: no {CONTEXT} column; allowed: a CSV with {CONTEXT} "
                            f"(and optionally {GENERATED}, {TIMESTAMP}), one row per request")
    if TIMESTAMP in df:  # arrival order; a stable sort keeps the file's order among equal times
        df = df.sort_values(TIMESTAMP, kind="stable")
    context = pd.to_numeric(df[CONTEXT], errors="coerce")
    generated = pd.to_numeric(df[GENERATED], errors="coerce") if GENERATED in df else pd.Series(0, index=df.index)
    if len(df) == 0 or context.isna().any() or (context < 1).any() or (context % 1 != 0).any():
        raise RequestsError(f"{source}: {CONTEXT} must hold a positive integer in every row ({len(df)} rows)")
    if generated.isna().any() or (generated < 0).any():
        raise RequestsError(f"{source}: {GENERATED} must hold a non-negative integer in every row")
    return context.to_numpy(np.int64), generated.to_numpy(np.int64)


@functools.cache
def shipped_trace(name: str) -> Requests:
    """One of the shipped Azure traces, its bytes checked against the pinned SHA-256."""
    if name not in SHIPPED:
        raise RequestsError(f"trace={name!r} is not shipped; allowed: {', '.join(SHIPPED)}, or a CSV path")
    file, digest = SHIPPED[name]
    data = (files("attnbench.data") / TRACE_FOLDER / file).read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != digest:
        raise RequestsError(f"trace {name!r}: SHA-256 {found} does not match the pinned {digest}; the shipped "
                            f"file {file} was changed (see attnbench/data/{TRACE_FOLDER}/README.md)")
    return Requests(name, *_parse_csv(data, file))


def csv_trace(path: str) -> Requests:
    """A user's trace file: an existing ``.csv`` under :data:`MAX_CSV_BYTES`, named by its file stem."""
    from attnbench.errors import NAME_PATTERN

    file = Path(path)
    if file.suffix != ".csv":
        raise RequestsError(f"trace={path!r} is not allowed; allowed: {', '.join(SHIPPED)}, or a path ending in .csv")
    if not file.is_file():
        raise RequestsError(f"trace={path!r}: no such file")
    if file.stat().st_size > MAX_CSV_BYTES:
        raise RequestsError(f"trace={path!r} is {file.stat().st_size} bytes; allowed: at most {MAX_CSV_BYTES}")
    name = file.stem
    if not NAME_PATTERN.match(name) or name in (*SHIPPED, *DISTRIBUTIONS):
        raise RequestsError(f"trace={path!r}: its file name {name!r} cannot name a workload; allowed: a stem "
                            f"matching {NAME_PATTERN.pattern}, other than {', '.join((*SHIPPED, *DISTRIBUTIONS))}")
    return Requests(name, *_parse_csv(file.read_bytes(), str(path)))


def trace(name_or_path: str) -> Requests:
    """A shipped trace by name, or a CSV file by path."""
    return shipped_trace(name_or_path) if name_or_path in SHIPPED else csv_trace(name_or_path)


def synthetic(distribution: str, n: int, *, seed: int, length: int | None = None, min_len: int = 1,
              max_len: int | None = None, median_len: float | None = None, sigma: float | None = None) -> Requests:
    """``n`` prompt lengths from a seeded distribution (module docstring); ``generated`` is 0."""
    if not 0 < n <= MAX_REQUESTS:
        raise RequestsError(f"a synthetic stream of {n} requests is not allowed; allowed: 1 to {MAX_REQUESTS}")
    rng = np.random.default_rng(seed)
    if distribution == "fixed":
        context = np.full(n, length, dtype=np.int64)
    elif distribution == "uniform":
        context = rng.integers(min_len, max_len, size=n, endpoint=True, dtype=np.int64)
    elif distribution == "lognormal":
        drawn = np.rint(np.exp(rng.normal(np.log(median_len), sigma, size=n)))
        context = np.clip(drawn, min_len, max_len if max_len else None).astype(np.int64)
    else:
        raise RequestsError(f"distribution={distribution!r} is not allowed; allowed: {', '.join(DISTRIBUTIONS)}")
    return Requests(distribution, context, np.zeros(n, dtype=np.int64))
