"""Render report notebooks (jupytext py:percent sources) into one self-contained HTML file.

The sources under ``workflow/notebooks/`` are joined in order into one
notebook, executed with nbconvert's ``ExecutePreprocessor`` (what ``jupyter
nbconvert --execute`` runs) on the ``python3`` kernel, and exported with the
code hidden and the figures embedded as base64 images. The notebooks find the
sweep's aggregated tables through ``$ATTNBENCH_RESULTS``; they read nothing else. Where
nbconvert's HTML templates are not installed (wheels unpacked onto ``PYTHONPATH``), the same
executed notebook is written as plain HTML instead.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

RESULTS_ENV = "ATTNBENCH_RESULTS"


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


def join_notebooks(sources: list[str | Path]):
    """One notebook with every source's cells in order (jupytext reads py:percent)."""
    import jupytext
    import nbformat

    if not sources:
        raise ValueError("no notebooks to render; allowed: one or more jupytext py:percent files")
    joined = nbformat.v4.new_notebook()
    for source in sources:
        joined.cells.extend(jupytext.read(source).cells)
    joined.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    joined.metadata["language_info"] = {"name": "python"}
    return joined


def render(sources: list[str | Path], results_dir: str | Path, out: str | Path, timeout_s: int = 1200,
           keep_notebook: str | Path | None = None) -> Path:
    """Execute the joined notebooks against ``results_dir`` and write HTML (inputs hidden) to ``out``."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    from attnbench.files import InputError

    nb = join_notebooks(sources)
    previous = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(Path(results_dir).resolve())
    try:
        ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
            nb, {"metadata": {"path": os.getcwd()}})
    except CellExecutionError as err:  # one line (the cell's error, e.g. a corrupt table it read), not the traceback
        evalue = " ".join(str(err.evalue).split())[:300]
        raise InputError(f"{', '.join(map(str, sources))}: a report cell failed on {results_dir} "
                         f"({err.ename}: {evalue})") from None
    finally:
        if previous is None:
            os.environ.pop(RESULTS_ENV)
        else:
            os.environ[RESULTS_ENV] = previous
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
