"""The conda environments, generated from pyproject.toml, the one dependency truth.

``environment.yml`` (a development environment: the package, the workflow, the report, W&B) and
``workflow/envs/attnbench.yaml`` (what every rule runs with under ``snakemake --sdm conda``) list the
same requirements as ``pyproject.toml`` with conda-forge names; ``python -m attnbench.workflow.condaenv``
rewrites both, and a test keeps the committed files equal to the generated text.
"""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

CONDA_NAMES = {"torch": "pytorch"}  # pip name -> conda-forge name where they differ
PIP_ONLY = ("triton", "wandb", "wandb-workspaces")  # installed with pip inside the environment (conda-forge's builds lag or differ)
HEADER = "# Generated from pyproject.toml by `python -m attnbench.workflow.condaenv`; do not edit.\n"


def requirements(pyproject: dict, extras: tuple[str, ...]) -> list[str]:
    """The base dependencies and those of ``extras`` (following ``attnbench[...]`` self-references)."""
    project = pyproject["project"]
    optional = project["optional-dependencies"]
    out, todo = list(project["dependencies"]), list(extras)
    while todo:
        for req in optional[todo.pop(0)]:
            nested = re.fullmatch(r"attnbench\[(.+)\]", req)
            if nested:
                todo += [e.strip() for e in nested.group(1).split(",")]
            elif req not in out:
                out.append(req)
    return out


def _split(requirement: str) -> tuple[str, str]:
    name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
    return name, requirement[len(name):].replace(" ", "")


def render(pyproject: dict, extras: tuple[str, ...], *, name: str | None, conda_extra: tuple[str, ...],
           pip_extra: tuple[str, ...], comment: str) -> str:
    conda, pip = ["python>=" + pyproject["project"]["requires-python"].lstrip(">=")], []
    for requirement in requirements(pyproject, extras):
        package, spec = _split(requirement)
        if package in PIP_ONLY:
            pip.append(package + spec)
        else:
            conda.append(CONDA_NAMES.get(package, package) + spec)
    lines = [HEADER.rstrip("\n"), f"# {comment}"] + ([f"name: {name}"] if name else []) + ["channels: [conda-forge]",
                                                                                         "dependencies:"]
    lines += [f"  - {c}" for c in conda + list(conda_extra)] + ["  - pip", "  - pip:"]
    lines += [f"      - {p}" for p in pip + list(pip_extra)]
    return "\n".join(lines) + "\n"


ENVIRONMENTS = {
    "environment.yml": dict(extras=("workflow", "triton", "wandb", "test"), name="attnbench", conda_extra=(),
                            pip_extra=("-e .",), comment="conda env for developing attnbench (conda-forge)"),
    "workflow/envs/attnbench.yaml": dict(extras=("report", "triton", "wandb"), name=None,
                                         conda_extra=("c-compiler",), pip_extra=(),
                                         comment="the software every rule runs with (`snakemake --sdm conda`)"),
}


def generate(root: Path) -> dict[str, str]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return {path: render(pyproject, **spec) for path, spec in ENVIRONMENTS.items()}


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for path, text in generate(root).items():
        (root / path).write_text(text)
        print(f"wrote {path}")
