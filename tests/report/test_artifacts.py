"""The one writer of every stage's tables and figures, its index, and the escaping of what rows say."""
import json

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from attnbench.report import escape
from attnbench.report.artifacts import (DPI, INDEX_FORMAT, PNG_COLOURS, Figure, StageOutputs, Table, frame_table,
                                        note_table, read_index, to_latex, to_markdown, write_stage)

HOSTILE = "<script>alert(1)</script> | *x* _y_ # z"


def _outputs():
    values = pd.DataFrame({"backend": ["a", "b"], "reason": [HOSTILE, "ok"], "ms": [1.5, 2.0]}).set_index("backend")
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    return StageOutputs([frame_table("speed", f"Speed on {HOSTILE}", values, group="part"),
                         note_table("nothing", "A table without rows.", "no rows in this sweep")],
                        [Figure("speed", "Speed against length.", fig)])


def test_index_lists_every_file_with_caption_group_and_empty_flag(tmp_path):
    index = write_stage("stage", _outputs(), tmp_path)
    assert index == read_index(tmp_path / "tables" / "index.json")
    assert index["format"] == INDEX_FORMAT and index["stage"] == "stage"
    speed, nothing = index["tables"]
    assert speed["group"] == "part" and speed["empty"] is False and nothing["group"] == "stage" and nothing["empty"]
    assert speed["caption"] == f"Speed on {HOSTILE}"
    for entry in index["tables"] + index["figures"]:
        for path in entry["files"].values():
            assert (tmp_path / path).stat().st_size > 0
    assert set(index["figures"][0]["files"]) == {"png", "svg"}
    assert set(speed["files"]) == {"md", "tex", "csv"}


def test_the_same_outputs_write_the_same_bytes(tmp_path):
    """Figures drawn again from the same rows leave committed files as they were (no date, no random SVG ids)."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_stage("stage", _outputs(), first)
    write_stage("stage", _outputs(), second)
    written = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert {p.suffix for p in written} >= {".png", ".svg"}
    assert all((first / p).read_bytes() == (second / p).read_bytes() for p in written)


def test_figures_are_indexed_pngs_that_keep_the_picture(tmp_path):
    """At most 256 colours on white, the size matplotlib draws, and nearly every pixel as matplotlib draws it."""
    import io

    import numpy as np
    from PIL import Image

    fig, ax = plt.subplots()
    for k in range(12):  # more lines than the colour cycle, each anti-aliased
        ax.plot(np.sin(np.linspace(0, 6, 200) + k), label=f"line {k}")
    ax.legend()
    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=DPI, bbox_inches="tight")
    exact = np.asarray(Image.open(drawn).convert("RGB"), dtype=int)
    (png, _svg) = Figure("lines", "Lines.", fig).write(tmp_path)
    indexed = Image.open(png)
    assert indexed.mode == "P" and len(indexed.getcolors()) <= PNG_COLOURS
    written = np.asarray(indexed.convert("RGB"), dtype=int)
    assert written.shape == exact.shape
    moved = np.abs(written - exact).max(axis=2) > 16
    assert moved.mean() < 0.01
    assert png.stat().st_size < len(drawn.getvalue()) / 2


def test_two_tables_of_one_name_are_refused(tmp_path):
    outputs = StageOutputs([note_table("t", "c", "n"), note_table("t", "c", "n")])
    with pytest.raises(ValueError, match="two tables are named 't'"):
        write_stage("stage", outputs, tmp_path)


def test_markdown_and_latex_escape_what_rows_say():
    table = _outputs().tables[0]
    md = to_markdown(table)
    assert "<script>" not in md and "&lt;script&gt;" in md
    row = next(line for line in md.splitlines() if line.startswith("| a"))
    assert row.count(" | ") == 2  # the | in the reason is escaped: still three cells
    tex = to_latex(table)
    assert "\\_y\\_" in tex and "\\#" in tex


def test_escape_helpers():
    assert escape.html('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    assert escape.markdown("# **bold** [link](x) <b>") == "\\# \\*\\*bold\\*\\* \\[link\\](x) &lt;b&gt;"
    assert escape.markdown("1. item") == "1\\. item" and escape.markdown("two\nlines") == "two lines"
    assert escape.markdown_cell("a|b\nc") == "a\\|b c"
    assert escape.code("a`b") == "`a'b`"


def test_read_index_refuses_other_files(tmp_path):
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"tflops": {"caption": "the old format"}}))
    with pytest.raises(ValueError, match="format=None is not a stage index"):
        read_index(path)
    with pytest.raises(FileNotFoundError, match="no stage index"):
        read_index(tmp_path / "missing.json")


def test_blocks_split_the_markdown_into_one_table_per_block():
    values = pd.DataFrame({"dtype": ["bf16", "bf16", "fp16"], "backend": ["a", "b", "a"], "1k": [1.0, 2.0, 3.0],
                           "4k": [4.0, 5.0, None]}).set_index(["dtype", "backend"])
    table = Table("t", "caption", values, values.map(lambda v: "" if pd.isna(v) else f"{v:g}"), blocks=("dtype",))
    md = to_markdown(table)
    assert "*dtype bf16*" in md and "*dtype fp16*" in md
    fp16 = md.split("*dtype fp16*")[1]
    assert "4k" not in fp16  # a length no row of the block has is dropped
