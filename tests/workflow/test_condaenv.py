"""pyproject.toml is the one dependency truth: the committed conda environments are generated from it."""
from pathlib import Path

from attnbench.workflow.condaenv import generate, requirements

REPO = Path(__file__).resolve().parents[2]


def test_committed_conda_environments_are_the_generated_ones():
    for path, text in generate(REPO).items():
        assert (REPO / path).read_text() == text, f"{path} drifted from pyproject.toml: python -m attnbench.workflow.condaenv"


def test_extras_follow_self_references():
    pyproject = {"project": {"dependencies": ["a>=1"], "optional-dependencies": {
        "x": ["b"], "y": ["attnbench[x]", "c>=2"]}}}
    assert requirements(pyproject, ("y",)) == ["a>=1", "c>=2", "b"]
