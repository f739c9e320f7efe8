"""Strings from results, made safe to render: the report turns Markdown into HTML, and results are data.

A results row carries strings its job did not choose: a device or host name, an exception's message
as the reason, a rule backend's output. Every such string goes through one of these on its way into
the report's Markdown (the tables' ``.md`` files and the notebooks' text), so that it reads as written
and nothing in it is interpreted: no raw HTML (``<script>``, ``<img onerror=...>``), no link or image,
no code span or emphasis, no ``|`` that splits a table cell, no line break that ends a table row.

* :func:`md_text`: running text and table cells;
* :func:`md_code`: an inline code span (backend names in sentences);
* :func:`md_frame`: every string cell, column name and index label of a frame, before ``to_markdown``.

Numbers and the report's own wording need none of this; LaTeX has its own (``tables.latex_escape``).
"""
from __future__ import annotations

import html
import re

import pandas as pd

_MARKDOWN = re.compile(r"([\\`*_\[\]|~#!])")  # escaped with a backslash (CommonMark: any ASCII punctuation)
_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def md_text(value) -> str:
    """``value`` as Markdown text that renders as exactly its characters (line breaks become spaces)."""
    text = _BREAKS.sub(" ", str(value))
    return _MARKDOWN.sub(r"\\\1", html.escape(text, quote=False))


def md_code(value) -> str:
    """``value`` as an inline code span: a fence longer than any run of backticks inside it."""
    text = _BREAKS.sub(" ", str(value))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose strings (cells, column names, index labels) are :func:`md_text`."""
    def cell(value):
        return md_text(value) if isinstance(value, str) else value

    out = frame.map(cell)
    out.columns = [cell(c) for c in out.columns]
    if isinstance(out.index, pd.MultiIndex):
        out.index = pd.MultiIndex.from_tuples([tuple(cell(v) for v in key) for key in out.index],
                                              names=[cell(n) for n in out.index.names])
    else:
        out.index = pd.Index([cell(v) for v in out.index], name=cell(out.index.name))
    return out
