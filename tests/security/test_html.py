"""Attacks through strings in results rows (device and host names, reasons, a rule backend's output) that
the report renders: each comes out as text, never as HTML, a link, LaTeX or a broken table (docs/security.md)."""
import re

import pandas as pd
import pytest

from attnbench.bench.ceilings import Ceilings
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.bench.results import to_frame
from attnbench.cli import main
from attnbench.plan import job_cases
from attnbench.report import escape
from attnbench.report.artifacts import Table, to_latex, to_markdown

from .conftest import CEILINGS, CONFIG, REPO, plan_of

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)> | [click](javascript:alert(3))"
HOST = "<b>h</b>"
BACKEND = "<svg/onload=alert(4)>"
TEX = r"\input{/etc/passwd} 100% & $x$"
HOSTILE = ("<script>alert", "<img src=x", "<svg/onload", "<b>h</b>", 'href="javascript:')  # markup, not text


@pytest.fixture(scope="module")
def hostile_results(tmp_path_factory):
    """Real rows of a tiny group, with hostile strings where results carry free text."""
    tmp = tmp_path_factory.mktemp("xss")
    cases = job_cases(plan_of(CONFIG).job("microbench", "g").payload)
    rows = run_group(cases, ["eager", "sdpa-math"], RunOptions(sweep="xss", numerics=True, cpu_min_run_time_s=0.01,
                                                               ceilings=Ceilings(**CEILINGS)), log=lambda s: None)
    df = to_frame(rows)
    df["device_name"], df["host"] = SCRIPT, HOST
    df.loc[0, "status"], df.loc[0, "reason"] = "error", IMG
    df.loc[1, "backend"] = BACKEND
    df.loc[2, "driver"] = TEX
    path = tmp / "hostile.parquet"
    df.to_parquet(path)
    results = tmp / "results" / "xss"
    assert main(["aggregate", "--merged", str(results / "microbench.parquet"), str(path)]) == 0
    assert main(["tables", "microbench", "--results", str(results)]) == 0
    return results


def test_markdown_text_renders_as_its_characters():
    assert escape.markdown(SCRIPT) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escape.markdown(IMG) == r"&lt;img src=x onerror=alert(2)&gt; \| \[click\](javascript:alert(3))"
    assert escape.markdown("a\nb\r\n| c") == r"a b \| c"
    assert escape.markdown("*x* `y` _z_") == r"\*x\* \`y\` \_z\_"


def test_a_code_span_cannot_be_closed_from_inside():
    assert escape.code("a`b") == "`a'b`" and escape.code("`x`") == "`'x'`" and escape.code("<b>") == "`<b>`"


def test_a_markdown_table_escapes_cells_columns_and_index():
    frame = pd.DataFrame({"<i>": [IMG, "1.5"]}, index=pd.Index(["|", "ok"], name="*"))
    text = to_markdown(Table("t", SCRIPT, frame, frame))
    assert "<i>" not in text and "<script>" not in text and "onerror=alert(2)&gt;" in text and "1.5" in text
    assert "[click](" not in text and r"\[click\](javascript:" in text  # no link: its brackets are escaped
    body = [line for line in text.splitlines() if line.startswith("|")]
    assert len(body) == 4 and len({line.count("|") - line.count("\\|") for line in body}) == 1


def test_the_tables_escape_data_strings_in_markdown_and_latex(hostile_results):
    folder = hostile_results / "microbench" / "tables"
    for path in folder.glob("*.md"):
        text = path.read_text()
        assert not any(h in text for h in HOSTILE), path.name
    status = (folder / "status.md").read_text()
    assert "onerror=alert(2)&gt; \\| \\[click\\]" in status
    body = [line for line in status.splitlines() if line.startswith("|")]
    assert len({line.count("|") - line.count("\\|") for line in body}) == 1  # every row has the same cells
    for path in folder.glob("*.tex"):
        assert "\\input{" not in path.read_text(), path.name


def test_the_rendered_report_shows_hostile_strings_as_text(hostile_results, tmp_path):
    out = tmp_path / "report.html"
    assert main(["render", "--results", str(hostile_results), "--out", str(out), "--stage", "microbench",
                 "--notebooks", str(REPO / "workflow" / "notebooks")]) == 0
    html = out.read_text()
    found = [h for h in HOSTILE if h in html]
    assert not found, [re.findall(f".{{60}}{re.escape(h)}.{{60}}", html, re.S)[:1] for h in found]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;h&lt;/b&gt;" in html
    assert "&lt;svg/onload=alert(4)&gt;" in html


def test_latex_escape_leaves_no_command():
    table = Table("t", TEX, pd.DataFrame({"a": [TEX]}), pd.DataFrame({"a": [TEX]}))
    tex = to_latex(table)
    assert "\\input{" not in tex and "\\textbackslash{}input\\{/etc/passwd\\}" in tex and "100\\%" in tex
