"""The committed reference rows (results/reference/h200/) still make the committed reference tables
(reports/reference/h200/) with the current code, and render into a report with every section."""
import html
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from attnbench.report.artifacts import read_index
from attnbench.report.notebook import section_sources
from attnbench.report import reference
from attnbench.report.reference import assemble
from attnbench.report.stages import SECTIONS

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "results" / "reference" / "h200"
REPORTS = REPO / "reports" / "reference" / "h200"
# committed table folder -> (reference report, stage folder whose tables it holds)
COMMITTED = {REPORTS / "tables": ("sweep", "microbench"), REPORTS / "pretrain" / "tables": ("sweep", "pretrain"),
             REPORTS / "backends" / "tables": ("backends", "microbench"),
             REPORTS / "workloads" / "tables": ("workloads", "microbench"),
             REPORTS / "core" / "tables": ("core", "microbench"),
             REPORTS / "triton" / "tables": ("triton", "microbench"),
             REPORTS / "triton" / "compiler": ("triton", "triton")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    return {name: assemble(name, ROWS, root / name) for name in reference.REPORTS}


@pytest.mark.parametrize("committed", list(COMMITTED), ids=lambda p: str(p.relative_to(REPORTS)))
def test_committed_tables_are_what_the_rows_give(folders, committed):
    name, stage = COMMITTED[committed]
    for path in sorted(committed.glob("*.csv")):
        rebuilt = folders[name] / stage / "tables" / path.name
        pd.testing.assert_frame_equal(pd.read_csv(rebuilt), pd.read_csv(path), obj=str(path.relative_to(REPO)))


def test_the_sweep_reference_has_every_stage_it_holds_rows_for(folders):
    for stage in ("env", "microbench", "stability", "hbm", "pretrain", "context"):
        index = read_index(folders["sweep"] / stage / "tables" / "index.json")
        assert any(not t["empty"] for t in index["tables"]), stage
    backends = read_index(folders["backends"] / "microbench" / "tables" / "index.json")
    fa3 = {t["name"]: t["empty"] for t in backends["tables"] if t["group"] == "backends"}
    assert fa3 == {"fa3_fwd": False, "fa3_fwd_bwd": False, "fa3_decode": False}
    workloads = read_index(folders["workloads"] / "microbench" / "tables" / "index.json")
    filled = {t["name"] for t in workloads["tables"] if not t["empty"]}
    assert {"workload_batches", "workload_throughput", "variant_coverage"} <= filled, filled


@pytest.mark.skipif(shutil.which("jupyter") is None and shutil.which("jupytext") is None,
                    reason="needs the report extra (jupytext, nbconvert, ipykernel)")
def test_the_reference_report_renders_with_every_section(folders, tmp_path):
    from attnbench.report.notebook import render

    out = render(section_sources(REPO / "workflow" / "notebooks"), folders["sweep"], tmp_path / "report.html")
    page = out.read_text()
    headings = [html.unescape(re.sub(r"<[^>]+>", "", h)).rstrip("¶").strip()
                for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page, re.S)]
    assert headings == [sec.title for sec in SECTIONS]
    assert "Traceback" not in page and "Table (fa3_decode)" not in page  # the paper sweep has no FA3-style grid
    assert "Table (divergence)" in page and "Table (kv_cache)" in page and "Table (perplexity_sliding)" in page
