"""The one writer of every stage's tables and figures, and the stage index that lists them.

A stage's report outputs are :class:`Table` and :class:`Figure` objects with captions;
:func:`write_stage` writes them under ``results/<sweep>/<stage>/``::

    tables/<name>.md    Markdown, the caption on the first line ("Table (<name>): ...")
    tables/<name>.tex   LaTeX, booktabs (needs \\usepackage{booktabs}), caption and label tab:<name>
    tables/<name>.csv   the numeric cells (status words where a row has no number), row keys as columns
    figures/<name>.png  and figures/<name>.svg
    tables/index.json   every table and figure with its caption (:data:`INDEX_FORMAT`)

The executed report, ``snakemake --report`` and ``snakemake publish`` all read the index, never a
list of their own. Index format (version 1; paths relative to the stage folder)::

    {"format": 1, "stage": "hbm",
     "tables":  [{"name": "bytes", "group": "hbm", "caption": "...", "empty": false,
                  "files": {"md": "tables/bytes.md", "tex": "tables/bytes.tex", "csv": "tables/bytes.csv"}}],
     "figures": [{"name": "hbm-ratios", "group": "hbm", "caption": "...",
                  "files": {"png": "figures/hbm-ratios.png", "svg": "figures/hbm-ratios.svg"}}]}

``group`` is the part of the stage an entry belongs to (a pretraining experiment; for the
microbench stage, ``microbench``, ``backends`` for the FA3-style tables or ``triton``); ``empty``
marks a table that only says why it has no rows (declared outputs always exist).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from attnbench.report import escape  # noqa: E402

INDEX_FORMAT = 1
TABLE_FORMATS = ("md", "tex", "csv")
FIGURE_FORMATS = ("png", "svg")
DPI = 110
PNG_COLOURS = 256  # a PNG palette holds at most 256 entries (PNG specification, 11.2.3 "PLTE Palette")


@dataclass
class Table:
    name: str
    caption: str
    values: pd.DataFrame  # numeric cells (status words where there is no number); index = row keys
    display: pd.DataFrame  # formatted cells, same shape
    group: str = ""  # the part of the stage it belongs to; "" = the stage itself
    empty: bool = False  # only a note saying why there are no rows
    blocks: tuple[str, ...] = ()  # index levels that split the Markdown into one small table per block

    def write(self, folder: str | Path) -> list[Path]:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{self.name}.{ext}" for ext in TABLE_FORMATS]
        paths[0].write_text(to_markdown(self))
        paths[1].write_text(to_latex(self))
        self.values.reset_index().to_csv(paths[2], index=False)
        return paths


@dataclass
class Figure:
    name: str
    caption: str
    figure: plt.Figure
    group: str = ""

    def write(self, folder: str | Path) -> list[Path]:
        """Every format, then the matplotlib figure is closed (a stage draws many)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{self.name}.{ext}" for ext in FIGURE_FORMATS]
        # the same figure writes the same bytes: SVG element ids from a fixed salt and no date, so rows drawn again
        # change no committed file they do not change the picture of
        with plt.rc_context({"svg.hashsalt": "attnbench"}):
            for path in paths:
                if path.suffix == ".png":
                    path.write_bytes(palette_png(self.figure))
                else:
                    self.figure.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Date": None})
        plt.close(self.figure)
        return paths


def palette_png(figure: plt.Figure) -> bytes:
    """The figure as a PNG of at most :data:`PNG_COLOURS` colours on white (PNG colour type 3, indexed).

    A plot is a few colours and their anti-aliased edges, so a median-cut palette without dithering (Pillow's
    ``Image.quantize``) keeps every line and label; only some edge pixels move to a near colour. The file is about
    a third of matplotlib's RGBA PNG. The size matters because figures are committed under ``results/reference`` and
    embedded in the reports, and the tree travels with every GPU call, which has a size limit. The numbers are in
    the tables beside every figure, and the SVG keeps the exact drawing.
    """
    from PIL import Image

    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=DPI, bbox_inches="tight")
    rgba = Image.open(drawn).convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    indexed = flat.quantize(colors=PNG_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    indexed.save(out, format="PNG", optimize=True)
    return out.getvalue()


@dataclass
class StageOutputs:
    """What one stage shows: its tables and figures, in report order."""

    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


def fmt(value) -> str:
    """Three significant digits, whole numbers from 1000 up (4210, not 4.21e+03); words and empty cells pass through."""
    if isinstance(value, (str, bool)):
        return str(value)
    if value is None or pd.isna(value):
        return ""
    if 1000 <= abs(value) < 1e7:
        return f"{value:.0f}"
    return f"{value:.3g}"


def note_table(name: str, caption: str, note: str, group: str = "") -> Table:
    """A one-cell table that says why it has no rows (declared outputs always exist)."""
    frame = pd.DataFrame({"note": [note]}).set_index("note")
    return Table(name, caption, frame, frame, group=group, empty=True)


def frame_table(name: str, caption: str, values: pd.DataFrame, group: str = "") -> Table:
    """A table whose display is its values at three significant digits."""
    return Table(name, caption, values, values.map(fmt), group=group)


def _pipe_table(frame: pd.DataFrame) -> str:
    frame = frame.reset_index()
    frame.columns = [escape.markdown_cell(c) for c in frame.columns]
    frame = frame.map(lambda v: escape.markdown_cell(v) if isinstance(v, str) else v)
    return frame.to_markdown(index=False)


def to_markdown(table: Table) -> str:
    """The caption line, then a pipe table; every cell, header and the caption escaped (:mod:`escape`).

    With ``table.blocks``, one small table per value of those index levels, each under a line naming
    it, with only the columns its rows fill (the FA3 README's layout).
    """
    head = f"Table ({table.name}): {escape.markdown(table.caption)}\n\n"
    if not table.blocks or table.empty:
        return head + _pipe_table(table.display) + "\n"
    parts = []
    for key, frame in table.display.groupby(level=list(table.blocks), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        title = ", ".join(f"{name} {value}" for name, value in zip(table.blocks, key))
        frame = frame.droplevel(list(table.blocks))
        frame = frame.loc[:, (frame != "").any(axis=0)]
        parts.append(f"*{escape.markdown(title)}*\n\n{_pipe_table(frame)}\n")
    return head + "\n".join(parts)


def to_latex(table: Table) -> str:
    """A booktabs table (``\\toprule``/``\\midrule``/``\\bottomrule``; needs ``\\usepackage{booktabs}``)."""
    frame = table.display.reset_index()
    frame.columns = [escape.latex(c) for c in frame.columns]
    frame = frame.map(escape.latex)
    styler = frame.style.hide(axis="index")
    return styler.to_latex(caption=escape.latex(table.caption), label=f"tab:{table.name}", hrules=True,
                           position_float="centering", column_format="l" * frame.shape[1])


def write_stage(stage: str, outputs: StageOutputs, stage_dir: str | Path) -> dict:
    """Write every table and figure of ``stage`` under ``stage_dir`` and its ``tables/index.json``; return the index.

    The files are written into a staging folder inside ``stage_dir`` and moved into place only when all
    are written, and the index last: a failure half-way (a full disk) leaves the previous outputs and
    index as they were.
    """
    stage_dir = Path(stage_dir)
    for kind, items in (("tables", outputs.tables), ("figures", outputs.figures)):
        names = [item.name for item in items]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise ValueError(f"stage {stage}: two {kind} are named {duplicate!r}; allowed: one per name")
    index = {"format": INDEX_FORMAT, "stage": stage, "tables": [], "figures": []}
    stage_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=stage_dir))
    try:
        for table in outputs.tables:
            paths = table.write(staging / "tables")
            index["tables"].append({"name": table.name, "group": table.group or stage, "caption": table.caption,
                                    "empty": table.empty, "files": _relative(paths, staging)})
        for figure in outputs.figures:
            paths = figure.write(staging / "figures")
            index["figures"].append({"name": figure.name, "group": figure.group or stage,
                                     "caption": figure.caption, "files": _relative(paths, staging)})
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            target = stage_dir / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    path = stage_dir / "tables" / "index.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".index.json.tmp")
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    tmp.replace(path)  # last, so that an index never lists a file not yet written
    return index


def _relative(paths: list[Path], stage_dir: Path) -> dict[str, str]:
    return {p.suffix[1:]: p.relative_to(stage_dir).as_posix() for p in paths}


def read_index(path: str | Path) -> dict:
    """A stage index; a one-line error for a file that is not one (of this format)."""
    path = Path(path)
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no stage index (the stage's tables rule writes it)") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        found = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise ValueError(f"{path}: format={found!r} is not a stage index; allowed: format {INDEX_FORMAT}")
    return index
