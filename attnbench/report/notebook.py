"""Render the report notebooks (jupytext py:percent sources) into one self-contained HTML file.

One notebook per report section (:data:`attnbench.report.stages.SECTIONS`, in that order:
``workflow/notebooks/<section>.py``), each under a heading naming it; a section whose stages did not
run is one line saying so instead. The joined notebook is executed with nbconvert's
``ExecutePreprocessor`` (what ``jupyter nbconvert --execute`` runs) on the ``python3`` kernel and
exported with the code hidden and the figures embedded as base64 images. The notebooks find the
sweep's aggregated tables through ``$ATTNBENCH_RESULTS`` (an absolute path, so they run from any
folder) and read nothing else; ``$ATTNBENCH_RERUN`` holds the command that renders the same report
again. Where nbconvert's HTML templates are not installed (wheels unpacked onto ``PYTHONPATH``),
the same executed notebook is written as plain HTML instead.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from attnbench.report import escape, stages

RESULTS_ENV = "ATTNBENCH_RESULTS"
RERUN_ENV = "ATTNBENCH_RERUN"
DEFAULT_NOTEBOOKS = "workflow/notebooks"


def find_templates() -> bool:
    """Whether nbconvert's ``lab`` HTML template can be found, adding its folder to ``JUPYTER_PATH`` if needed.

    Installed normally, nbconvert's templates live in ``<prefix>/share/jupyter``. Wheels installed
    with ``pip --target`` or unpacked onto ``PYTHONPATH`` put them beside the package, where Jupyter
    does not look: search the package's ancestors (and unpacked ``*.data`` folders) for them.
    """
    import jupyter_core.paths
    import nbconvert

    def has_lab(root: Path) -> bool:
        return (root / "nbconvert" / "templates" / "lab" / "index.html.j2").is_file()

    if any(has_lab(Path(p)) for p in jupyter_core.paths.jupyter_path()):
        return True
    for ancestor in list(Path(nbconvert.__file__).resolve().parents)[:5]:
        for root in [ancestor / "share" / "jupyter", *ancestor.glob("nbconvert-*.data/data/share/jupyter")]:
            if has_lab(root):
                os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("JUPYTER_PATH")]))
                return True
    return False


PLAIN_STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
               "table{border-collapse:collapse;font-size:85%}td,th{border:1px solid #ccc;padding:2px 6px}"
               "img{max-width:100%}")


def plain_html(nb) -> str:
    """Markdown cells and cell outputs (markdown, PNG, HTML, text) as one HTML page, without nbconvert templates."""
    import html

    from nbconvert.filters import markdown2html

    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(markdown2html(cell.source))
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                parts.append(f'<img src="data:image/png;base64,{data["image/png"]}">')
            elif "text/markdown" in data:
                parts.append(markdown2html(data["text/markdown"]))
            elif "text/html" in data:
                parts.append(data["text/html"])
            elif "text/plain" in data or output.get("text"):
                parts.append(f"<pre>{html.escape(data.get('text/plain') or output.get('text'))}</pre>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>attnbench report</title>"
            f"<style>{PLAIN_STYLE}</style></head><body>{''.join(parts)}</body></html>")


def section_sources(folder: str | Path) -> list[Path]:
    """Every section's notebook in report order; a one-line error for a section without one."""
    sources = [Path(folder) / f"{sec.name}.py" for sec in stages.SECTIONS]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"report sections without a notebook: {', '.join(missing)}; allowed: one "
                                "workflow/notebooks/<section>.py per section of attnbench.report.stages.SECTIONS")
    return sources


def join_notebooks(sources: list[str | Path], results_dir: str | Path | None = None,
                   planned: tuple[str, ...] | None = None):
    """One notebook with every source's cells in order (jupytext reads py:percent).

    A source named after a report section gets the section's heading first; one whose stages did not
    run (not in ``planned``, or no index under ``results_dir``) is that heading and one line instead.
    """
    import jupytext
    import nbformat

    if not sources:
        raise ValueError("no notebooks to render; allowed: one or more jupytext py:percent files")
    known = {sec.name: sec for sec in stages.SECTIONS}
    joined = nbformat.v4.new_notebook()
    for source in sources:
        sec = known.get(Path(source).stem)
        if sec is not None:
            heading = f"## {escape.markdown(sec.title)}"
            if results_dir is not None and not stages.ran(sec, planned, results_dir):
                names = " or ".join(f"`{s}`" for s in sec.stages)
                joined.cells.append(nbformat.v4.new_markdown_cell(
                    f"{heading}\n\nNot run in this sweep: its `stages:` leave out {names}, or it wrote no tables."))
                continue
            joined.cells.append(nbformat.v4.new_markdown_cell(heading))
        joined.cells.extend(jupytext.read(source).cells)
    for number, cell in enumerate(joined.cells):  # ids in order, not random: the same rows render the same page
        cell.id = f"cell-{number}"
    joined.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    joined.metadata["language_info"] = {"name": "python"}
    return joined


def rerun_command(results_dir: str | Path, out: str | Path, planned: tuple[str, ...] | None,
                  notebooks_dir: str | Path | None) -> str:
    """The ``attnbench render`` command that renders this report again, runnable as printed from here."""
    words = ["attnbench", "render", "--results", _here(results_dir), "--out", _here(out)]
    if notebooks_dir is not None and Path(notebooks_dir).resolve() != Path(DEFAULT_NOTEBOOKS).resolve():
        words += ["--notebooks", _here(notebooks_dir)]
    for stage in planned or ():
        words += ["--stage", stage]
    return shlex.join(words)


def _here(path: str | Path) -> str:
    """A path relative to the working folder where it lies inside it, else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def render(sources: list[str | Path], results_dir: str | Path, out: str | Path, timeout_s: int = 1200,
           keep_notebook: str | Path | None = None, planned: tuple[str, ...] | None = None,
           notebooks_dir: str | Path | None = None) -> Path:
    """Execute the joined notebooks against ``results_dir`` and write HTML (inputs hidden) to ``out``.

    ``planned``: the stages the sweep planned (the report rule passes them); ``None`` shows every
    section whose stage wrote its index.
    """
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    from attnbench.files import InputError

    nb = join_notebooks(sources, results_dir, planned)
    settings = {RESULTS_ENV: str(Path(results_dir).resolve()),
                RERUN_ENV: rerun_command(results_dir, out, planned, notebooks_dir)}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
            nb, {"metadata": {"path": os.getcwd()}})
    except CellExecutionError as err:  # one line (the cell's error, e.g. a corrupt table it read), not the traceback
        evalue = " ".join(str(err.evalue).split())[:300]
        raise InputError(f"{', '.join(map(str, sources))}: a report cell failed on {results_dir} "
                         f"({err.ename}: {evalue})") from None
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    if keep_notebook:
        nbformat.write(nb, str(keep_notebook))
    if find_templates():
        exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
        body, _ = exporter.from_notebook_node(nb)
    else:
        print("attnbench render: nbconvert's HTML templates are not installed here; writing plain HTML",
              file=sys.stderr)
        body = plain_html(nb)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return out
