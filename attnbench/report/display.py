"""What the report notebooks call: a stage's index, its tables and figures, shown with their captions.

The notebooks (``workflow/notebooks/<section>.py``) read only the files a stage's index lists, so a
report renders in seconds and shows what ``snakemake --report`` and the W&B run show. Text from the
rows goes through :mod:`attnbench.report.escape`; the Markdown tables were escaped when written.
"""
from __future__ import annotations

import os
from pathlib import Path

from IPython.display import Image, Markdown, display

from attnbench.report import escape
from attnbench.report.artifacts import read_index
from attnbench.workflow import paths


def results_dir() -> Path:
    """The sweep folder the report renders (``$ATTNBENCH_RESULTS``, set by ``attnbench render``)."""
    value = os.environ.get("ATTNBENCH_RESULTS")
    if not value:
        raise RuntimeError("ATTNBENCH_RESULTS is not set; render the report with `attnbench render --results "
                           "results/<sweep> --out report.html`")
    return Path(value)


class Stage:
    """One stage's index in the sweep folder (``None`` entries where it wrote none)."""

    def __init__(self, stage: str, results: Path | None = None):
        self.stage = stage
        self.dir = paths.within(results or results_dir(), paths.STAGE_DIR, stage=stage)
        index_path = paths.within(results or results_dir(), paths.STAGE_INDEX, stage=stage)
        self.index = read_index(index_path) if index_path.is_file() else None

    def __bool__(self) -> bool:
        return self.index is not None

    def entry(self, kind: str, name: str) -> dict:
        found = {e["name"]: e for e in (self.index or {}).get(kind, [])}
        if name not in found:
            raise KeyError(f"{self.stage} has no {kind[:-1]} {name!r}; allowed: {', '.join(found) or 'none'}")
        return found[name]

    def tables(self, group: str | None = None) -> list[dict]:
        return [e for e in (self.index or {}).get("tables", []) if group is None or e["group"] == group]

    def figures(self, group: str | None = None) -> list[dict]:
        return [e for e in (self.index or {}).get("figures", []) if group is None or e["group"] == group]

    def path(self, entry: dict, fmt: str) -> Path:
        return self.dir / entry["files"][fmt]

    def show_table(self, name: str) -> None:
        display(Markdown(self.path(self.entry("tables", name), "md").read_text()))

    def show_figure(self, name: str) -> None:
        entry = self.entry("figures", name)
        display(Image(self.path(entry, "png").read_bytes()))
        display(Markdown(f"*Figure ({escape.markdown(name)}).* {escape.markdown(entry['caption'])}"))

    def show_group(self, group: str | None = None) -> None:
        """Every figure, then every table, of one group (default: all), each with its caption."""
        for entry in self.figures(group):
            self.show_figure(entry["name"])
        for entry in self.tables(group):
            self.show_table(entry["name"])


def say(text: str) -> None:
    """One paragraph of plain text from the rows (escaped)."""
    display(Markdown(escape.markdown(text)))
