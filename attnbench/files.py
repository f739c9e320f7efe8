"""The files a command is given: read with one-line errors, and never overwritten by its outputs.

Every input a command reads (a results parquet, a JSON plan, ceilings or receipt file) goes through
:func:`read_parquet` or :func:`read_json`: a missing, empty, truncated, corrupt or foreign file is one
:class:`InputError` line naming the file, never a traceback. :func:`refuse_overwrite` runs before any
command's work (``attnbench.cli.main``): an output path that is one of the inputs is refused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

# argparse destinations, by role, of every subcommand (a destination a command lacks is skipped)
INPUT_ARGS = ("config", "job", "ceilings", "checkpoint", "inputs", "parts", "hbm", "ledger", "microbench", "capability",
              "cost", "rope_overhead", "timings", "config_in", "results", "env", "notebooks", "input", "have",
              "spec", "rows", "base", "new")
OUTPUT_ARGS = ("out", "merged", "out_dir", "out_capability", "out_cost", "config_out", "versions_out", "keep_notebook")


class InputError(ValueError):
    """An input file that cannot be used; the message is one line naming it."""


def _short(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"


def _existing(path: Path, what: str) -> None:
    if not path.exists():
        raise InputError(f"{path}: {what} does not exist")
    if not path.is_file():
        raise InputError(f"{path}: is not a file; allowed: a {what}")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file; allowed: a {what} (rerun the step that writes it)")


def read_parquet(path: str | Path, what: str = "results file (parquet)"):
    """A parquet file as a DataFrame; one line for anything that is not one."""
    import pandas as pd
    import pyarrow

    path = Path(path)
    _existing(path, what)
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pyarrow.ArrowException) as err:
        raise InputError(f"{path}: not a readable {what} ({_short(err)})") from None


def read_json(path: str | Path, what: str = "JSON file"):
    """A JSON file's value; one line for anything that is not one."""
    path = Path(path)
    _existing(path, what)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a {what} ({_short(err)})") from None


RESULTS_ROOT = Path("results")  # everything the pipeline writes, results/<sweep>/...
REFERENCE_ROOT = RESULTS_ROOT / "reference"  # the committed reference rows, results/reference/<gpu>/<folder>/...


def folder_under(root: Path, value: str | Path, option: str, form: str, min_parts: int,
                 error: type[ValueError] = InputError) -> Path:
    """``value`` as a path if it is a relative folder under ``root`` (:data:`RESULTS_ROOT`, :data:`REFERENCE_ROOT`),
    without ``..``, of at least ``min_parts`` parts; else ``error``, one line naming ``option`` and the allowed
    ``form``."""
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or path.parts[:len(root.parts)] != root.parts \
            or len(path.parts) < min_parts:
        raise error(f"{option}={str(value)!r} is not allowed; allowed: a folder {form}")
    return path


def _paths(value) -> Iterable[Path]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [Path(v) for v in values if isinstance(v, str) and v]


def _same(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def refuse_overwrite(args) -> None:
    """Refuse a command whose output path is one of its inputs, before any work."""
    inputs = [(dest, p) for dest in INPUT_ARGS for p in _paths(getattr(args, dest, None))]
    for dest in OUTPUT_ARGS:
        for out in _paths(getattr(args, dest, None)):
            for other, path in inputs:
                if _same(out, path):
                    what = ("one of the input files" if other in ("inputs", "parts", "notebooks")
                            else f"--{other.replace('_', '-')}")
                    raise InputError(f"--{dest.replace('_', '-')} {str(out)!r} is also {what}; allowed: an output "
                                     "path that is none of the command's inputs")
