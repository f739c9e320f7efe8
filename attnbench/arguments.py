"""Argument types every command module shares: a bounded whole number with a one-line error, and ``--threads``.

At the base of the package, so that the stages' command modules (``train``, ``context``, the wheelhouse) take
them without importing :mod:`attnbench.cli`, the entry point that imports those modules.
"""
from __future__ import annotations

import argparse


def bounded_int(low: int, high: int):
    """An argparse type: a whole number from ``low`` to ``high``, else a one-line error saying so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: a whole number from {low} to {high}")
        return value

    parse.__name__ = "whole number"
    return parse


THREADS = bounded_int(1, 1024)  # --threads of every command
