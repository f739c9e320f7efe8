"""Render report notebooks (jupytext py:percent sources) into one self-contained HTML file.

The sources under ``workflow/notebooks/`` are joined in order into one
notebook, executed with nbconvert's ``ExecutePreprocessor`` (what ``jupyter
nbconvert --execute`` runs) on the ``python3`` kernel, and exported with the
code hidden and the figures embedded as base64 images. The notebooks find the
sweep's aggregated tables through ``$ATTNBENCH_RESULTS``; they read nothing else.
"""
from __future__ import annotations

import os
from pathlib import Path

RESULTS_ENV = "ATTNBENCH_RESULTS"


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
    from nbconvert.preprocessors import ExecutePreprocessor

    nb = join_notebooks(sources)
    previous = os.environ.get(RESULTS_ENV)
    os.environ[RESULTS_ENV] = str(Path(results_dir).resolve())
    try:
        ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
            nb, {"metadata": {"path": os.getcwd()}})
    finally:
        if previous is None:
            os.environ.pop(RESULTS_ENV)
        else:
            os.environ[RESULTS_ENV] = previous
    if keep_notebook:
        nbformat.write(nb, str(keep_notebook))
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return out
