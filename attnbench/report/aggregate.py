"""Join every results file of a sweep into one validated table.

Inputs are the microbench jobs' parquet files and any file a rule-based backend
wrote (parquet, or CSV for backends that print text); each is checked against
the results schema before it is joined, so a malformed file is a one-line
error naming it, never a silently wrong table.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.bench.results import COLUMNS, ResultsError, to_frame, validate_rows
from attnbench.bench.schema import validate_frame
from attnbench.files import read_parquet

# CSV carries no types: string columns are read as strings ("1.0" stays a driver version, not a number), and
# array columns (round_ms) as the "[1.0, 2.0]" text a list is written as.
_STRINGS = {name: "string" for name, (kind, _) in COLUMNS.items() if kind == "string"}


def _numbers(text: str):
    text = text.strip().strip("[]")
    return [float(x) for x in text.replace(",", " ").split()] if text else None


_ARRAYS = {name: _numbers for name, (kind, _) in COLUMNS.items() if kind == "array"}


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ResultsError(f"{path}: results file does not exist")
    try:
        return pd.read_csv(path, dtype=_STRINGS, converters=_ARRAYS)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as err:  # EmptyDataError is a ValueError
        raise ResultsError(f"{path}: not a readable results file (CSV) ({type(err).__name__}: "
                           f"{' '.join(str(err).split())[:160]})") from None


READERS = {".parquet": read_parquet, ".csv": _read_csv}


def read_any(path: str | Path) -> pd.DataFrame:
    """A results file as a frame; one line naming the file for a missing, empty, corrupt or foreign one."""
    path = Path(path)
    reader = READERS.get(path.suffix)
    if reader is None:
        raise ResultsError(f"{path}: suffix {path.suffix!r} is not a results format; allowed: {', '.join(READERS)}")
    return reader(path)


def load_results(paths: list[str | Path]) -> pd.DataFrame:
    """Validate each file, then concatenate in :data:`COLUMNS` order; (case_id, backend) must be unique."""
    frames = []
    for path in paths:
        df = read_any(path)
        validate_rows(df, str(path))
        validate_frame(df, str(path))
        if len(df):
            frames.append(to_frame(df.to_dict(orient="records")))
    if not frames:
        raise ResultsError("no results rows in " + (", ".join(map(str, paths)) or "an empty file list"))
    merged = pd.concat(frames, ignore_index=True)
    dup = merged.duplicated(["case_id", "backend"], keep=False)
    if dup.any():
        first = merged[dup].iloc[0]
        raise ResultsError(f"case {first.case_id} x backend {first.backend!r} appears in more than one results file; "
                           "allowed: one row per (case, backend)")
    return merged
