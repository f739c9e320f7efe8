"""Loading the checkpoints attnbench writes, without running code from them.

``torch.load`` unpickles: a checkpoint from anyone else could run code on load. Every checkpoint is
read with ``weights_only=True`` (tensors, containers and plain values only: what attnbench saves) and
checked to be a mapping with the keys its reader needs. A file that fails either way (truncated by a
kill, a foreign or hostile pickle, another program's file) is moved aside to ``<name>.rejected`` with
one warning, and the caller starts over as if there were none: a bad file never blocks every later
run until someone deletes it by hand.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Iterable

import torch

from attnbench.files import InputError

REJECTED_SUFFIX = ".rejected"


class CheckpointError(InputError):
    """A checkpoint that cannot be used (it has been moved aside); one line naming the file."""


def _reject(path: Path) -> Path:
    aside = path.with_name(path.name + REJECTED_SUFFIX)
    os.replace(path, aside)
    return aside


def load_checkpoint(path: str | Path, keys: Iterable[str], map_location="cpu") -> dict | None:
    """The checkpoint at ``path`` (a mapping with every one of ``keys``), or None when there is none.

    Raises :class:`CheckpointError` (after moving the file aside) for a file that is not such a checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with warnings.catch_warnings():  # the unpickler's own warnings about a foreign file: the error says it
            warnings.simplefilter("ignore")
            value = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # the unpickler of untrusted bytes raises anything (KeyError, EOFError, RuntimeError, ...)
        why = f"{type(err).__name__}: {' '.join(str(err).split())[:120]}".rstrip(": ")
        raise CheckpointError(f"{path} is not a checkpoint attnbench can load safely ({why}); "
                              f"moved it to {_reject(path)}") from None
    missing = sorted(set(keys) - set(value)) if isinstance(value, dict) else []
    lacks = f"a {type(value).__name__}, not a mapping" if not isinstance(value, dict) else \
        (f"no {missing[0]!r}" if missing else "")
    if lacks:
        raise CheckpointError(f"{path} is a checkpoint of something else ({lacks}); moved it to {_reject(path)}")
    return value


def resume_checkpoint(path: str | Path, keys: Iterable[str], map_location="cpu") -> dict | None:
    """:func:`load_checkpoint` for resuming: a rejected file is one warning, and the run starts over (None)."""
    try:
        return load_checkpoint(path, keys, map_location)
    except CheckpointError as err:
        print(f"attnbench: warning: {err}; starting the run over", file=sys.stderr, flush=True)
        return None


def load_weights(path: str | Path) -> dict:
    """A weights file (a ``state_dict``: name -> tensor), loaded as :func:`load_checkpoint` does."""
    value = load_checkpoint(path, ())
    if value is None:
        raise CheckpointError(f"{path}: weights file does not exist")
    return value
