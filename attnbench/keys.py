"""The one check every config-like mapping gets: no key outside the allowed ones."""
from __future__ import annotations

from typing import Iterable


def reject_unknown_keys(values: Iterable[str], allowed: Iterable[str], where: str, error: type[Exception]) -> None:
    """Raise ``error`` naming the first unknown key (sorted) and every allowed key, on one line."""
    allowed = list(allowed)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise error(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
