"""Every `attnbench` command line in the README's and docs' code blocks is one the CLI takes (its arguments parse),
and every repository file or folder they name in backticks exists: a recipe or pointer that the code outgrew fails
here, not in a reader's shell."""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from attnbench.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "config" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _code_lines(path: Path):
    """(line number, command) of each `attnbench ...` line inside a fenced code block, continuation lines joined."""
    fenced, pending, start = False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        text = line.split(" #", 1)[0].rstrip()  # a trailing comment
        if pending:
            text = pending + " " + text.strip()
        elif not text.strip().startswith("attnbench "):
            continue
        else:
            start = number
        if text.endswith("\\"):
            pending = text[:-1].rstrip()
            continue
        pending = ""
        yield start, text.strip()


def _documented():
    for path in DOCS:
        for number, command in _code_lines(path):
            yield pytest.param(command, id=f"{path.relative_to(REPO)}:{number}")


@pytest.mark.parametrize("command", list(_documented()))
def test_documented_command_parses(command):
    synopsis = re.sub(r"\s\[--[^\]]*\]", "", command)  # [--option value]: optional, as in a usage line
    words = shlex.split(re.sub(r"<[^>]*>|\$\w+|\$\{\w+\}", "X", synopsis))[1:]  # placeholders stand for a value
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(words)
    except SystemExit as exit_:
        assert exit_.code == 0, err.getvalue().strip().splitlines()[-1]


# files of the repository; not a sweep's outputs, results/<sweep>/... and reports/<sweep>/...
REPO_PATH = re.compile(r"`((?:attnbench|docs|config|scripts|workflow|tests|\.ci|results/reference|reports/reference)"
                       r"/[\w./-]+)`")


def test_documented_paths_exist():
    missing = [f"{path.relative_to(REPO)}:{number}: {match.group(1)}"
               for path in DOCS for number, line in enumerate(path.read_text().splitlines(), 1)
               for match in REPO_PATH.finditer(line)
               if not (REPO / match.group(1).split("::")[0].rstrip(".")).exists()]
    assert missing == []


def _rules() -> set[str]:
    files = [REPO / "Snakefile", *(REPO / "workflow" / "rules").rglob("*.smk")]
    return {m.group(1) for f in files for m in re.finditer(r"^(?:local)?rule (\w+):", f.read_text(), re.M)}


def test_documented_snakemake_targets_are_rules():
    """`snakemake <name>` in inline code, a code block or a sweep file's comment names a rule of the workflow (a
    target that is a path is the planner's business)."""
    sources = [(p, p.read_text()) for p in DOCS] + \
        [(p, p.read_text()) for p in sorted((REPO / "config" / "sweeps").glob("*.yaml"))]
    pattern = re.compile(r"(?:`|^\s*#?\s*)snakemake (?:-n )?([a-z_][a-z0-9_]*)\b(?![/.])", re.M)
    rules = _rules()
    unknown = {f"{p.relative_to(REPO)}: {m.group(1)}" for p, text in sources for m in pattern.finditer(text)
               if m.group(1) not in rules}
    assert not unknown, sorted(unknown)
