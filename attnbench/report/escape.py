"""Escaping for every string the report renders: HTML, Markdown (text and table cells) and LaTeX.

Rows carry text that no one here wrote (a backend's exception message, a device or host name, a
path): rendered raw, a ``<script>`` in a reason would run in the report, a ``|`` would split a
Markdown table cell and a ``_`` would break LaTeX. Every renderer of the report passes such
strings through one of these functions; the numbers formatted by the report itself need none.
"""
from __future__ import annotations

import html as _html
import re

# CommonMark's backslash escapes: characters that start markup anywhere in a line, and those that do at its start.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_MARKDOWN_LEADING = re.compile(r"^([#+\-=])|^(\d+)([.)])")  # a heading, a list item
_LATEX_SPECIAL = {"·": r"$\cdot$", "×": r"$\times$", "−": "-", "\\": r"\textbackslash{}", "&": r"\&",
                  "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def html(text) -> str:
    """Text for an HTML element or attribute value (``&``, ``<``, ``>``, both quotes)."""
    return _html.escape(str(text), quote=True)


def _one_line(text) -> str:
    return " ".join(str(text).split())


def markdown(text) -> str:
    """Text inside a Markdown paragraph, on one line: ``&``, ``<``, ``>`` as entities (no raw HTML), then
    the markup characters backslash-escaped (the entities contain none of them)."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", _html.escape(_one_line(text), quote=False))
    return _MARKDOWN_LEADING.sub(lambda m: f"\\{m[1]}" if m[1] else f"{m[2]}\\{m[3]}", text)


def markdown_cell(text) -> str:
    """A Markdown table cell, on one line (a newline would end the row): no raw HTML, the markup characters
    (``|`` that would split the cell, ``[`` of a link, emphasis) backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", _html.escape(_one_line(text), quote=False))


def code(text) -> str:
    """Inline code (a backend or file name). A code span shows its text literally, HTML included; a
    backtick would end it early and cannot be escaped inside one, so it becomes a quote."""
    return "`" + _one_line(text).replace("`", "'") + "`"


def latex(text) -> str:
    """Text for a LaTeX document (booktabs tables, captions)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))
