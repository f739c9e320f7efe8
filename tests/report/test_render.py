"""Report rendering: jupytext sources joined, executed, and written as HTML, with or without nbconvert's templates."""
import base64

import pytest

from attnbench.report import notebook

SOURCE = '''# %% [markdown]
# # Title from markdown

# %%
import os
from IPython.display import Image, Markdown, display
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2])
buf = __import__("io").BytesIO()
fig.savefig(buf, format="png")
display(Markdown("| backend | value |\\n|---|---|\\n| eager | " + os.environ["ATTNBENCH_RESULTS"][-7:] + " |"))
display(Image(buf.getvalue()))
'''


@pytest.fixture
def sources(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(SOURCE)
    b.write_text("# %% [markdown]\n# ## Second stage\n")
    (tmp_path / "results").mkdir()
    return [a, b], tmp_path / "results"


@pytest.mark.parametrize("templates", [True, False], ids=["nbconvert", "plain"])
def test_render_joins_executes_and_embeds(sources, tmp_path, monkeypatch, templates):
    if not templates:
        monkeypatch.setattr(notebook, "find_templates", lambda: False)
    elif not notebook.find_templates():
        pytest.skip("nbconvert's templates are not installed here")
    files, results = sources
    out = notebook.render(files, results, tmp_path / "out" / "report.html")
    page = out.read_text()
    assert "Title from markdown" in page and "Second stage" in page
    assert "<td>results</td>" in page  # ran with ATTNBENCH_RESULTS pointing at the results folder
    png = page.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(png).startswith(b"\x89PNG")
    assert "import matplotlib" not in page  # code hidden


def test_no_notebooks_is_a_clear_error():
    with pytest.raises(ValueError, match="no notebooks to render"):
        notebook.join_notebooks([])


def test_sections_get_their_heading_and_a_stage_that_did_not_run_one_line(tmp_path):
    """A source named after a report section gets its heading; one whose stage is not planned is one line."""
    from attnbench.report.stages import section
    from attnbench.workflow import paths

    results = tmp_path / "results"
    for name in ("env", "hbm"):
        (tmp_path / f"{name}.py").write_text("# %%\nprint('ran " + name + "')\n")
    index = paths.within(results, paths.STAGE_INDEX, stage="env")
    index.parent.mkdir(parents=True)
    index.write_text("{}")
    nb = notebook.join_notebooks([tmp_path / "env.py", tmp_path / "hbm.py"], results, planned=("microbench",))
    texts = [cell.source for cell in nb.cells]
    assert texts[0] == f"## {section('env').title}" and "ran env" in texts[1]
    assert texts[2].startswith(f"## {section('hbm').title}") and "Not run in this sweep" in texts[2]
    assert len(texts) == 3  # the hbm notebook's own cells are left out
    assert [cell.id for cell in nb.cells] == ["cell-0", "cell-1", "cell-2"]  # not random: same rows, same page


def test_the_printed_rerun_command_is_relative_to_where_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workflow" / "notebooks").mkdir(parents=True)
    command = notebook.rerun_command(tmp_path / "results" / "s", tmp_path / "reports" / "s" / "report.html",
                                     ("microbench", "hbm"), tmp_path / "workflow" / "notebooks")
    assert command == ("attnbench render --results results/s --out reports/s/report.html --stage microbench "
                       "--stage hbm")
    elsewhere = notebook.rerun_command("results/s", "r.html", None, "/opt/notebooks")
    assert elsewhere == "attnbench render --results results/s --out r.html --notebooks /opt/notebooks"
