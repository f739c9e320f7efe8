"""Shell injection: no config value reaches a rule's shell command unquoted (docs/security.md).

Statically, every value a rule pastes into its shell command is quoted (``{x:q}``). For real, Snakemake
renders every rule's command (``snakemake -n -p``) for a sweep that puts shell metacharacters wherever a
config allows free text (W&B tags; training data paths, which reach jobs through their plan files), and
each command is run by bash with a stand-in ``attnbench`` that records its arguments: nothing is
interpreted, and every value arrives as one argument, unchanged."""
import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from .conftest import CONFIG, REPO

needs_snakemake = pytest.mark.skipif(shutil.which("snakemake") is None, reason="needs the snakemake command")
TAGS = ["$(touch PWNED-tag)", "a;touch PWNED-semicolon", "`touch PWNED-backtick`", "x' y\"z", "--out=/tmp/evil",
        "&& touch PWNED-and", "*", "~root"]
DATA = "data/$(touch PWNED-data); `id` & x.txt"
UNQUOTED_OK = {"{threads}", "{params.lease}"}  # an integer; a constant of common.smk ("" or "attnbench lease --")
STUB = ("#!/usr/bin/env python3\nimport json, os, sys\n"
        "open(os.environ['STUB_LOG'], 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")


def _shell_strings(text: str) -> list[str]:
    """The string literals of every ``shell:`` block of a rule file."""
    blocks = re.findall(r"^( +)shell:\n((?:\1 +.*\n?)+)", text, re.M)
    return [literal for _, body in blocks for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', body)]


@pytest.mark.parametrize("path", sorted((REPO / "workflow" / "rules").rglob("*.smk")), ids=lambda p: p.name)
def test_every_value_a_rule_pastes_into_its_shell_command_is_quoted(path):
    placeholders = re.findall(r"\{[^{}]+\}", "".join(_shell_strings(path.read_text())))
    bare = sorted({p for p in placeholders if not p.endswith(":q}") and p not in UNQUOTED_OK})
    assert not bare, f"{path.name}: unquoted {bare}"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Every shell command of a sweep running every stage, as Snakemake renders them (dry run)."""
    work = tmp_path_factory.mktemp("shell")
    data = work / DATA
    data.parent.mkdir()
    data.write_bytes(b"all the world's a stage\n" * 64)
    config = {**CONFIG, "stages": ["microbench", "stability", "hbm", "pretrain", "context", "triton", "context_parallel"],
              "report": {"wandb": {"tags": TAGS}},
              "pretrain": {"data": {"source": "file", "path": DATA},
                           "select": {"experiments": ["fp8"]}},
              "context": {"capability": {"data": {"source": "file", "path": DATA}, "methods": ["none", "yarn"]}}}
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work), "all", "publish",
                           "-n", "-p", "--configfile", "c.yaml"], cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    commands = [c for c in re.findall(r"^Shell command: (.*)$", proc.stdout + proc.stderr, re.M) if c != "None"]
    return work, commands


@needs_snakemake
def test_every_rule_renders_a_command(rendered):
    _, commands = rendered
    assert all(shlex.split(c)[:2] == ["exec", "attnbench"] for c in commands)  # the job is the rule's process
    def command(words):  # the command a lease runs: what follows its `--`
        return command(words[words.index("--") + 1:]) if words[:2] == ["attnbench", "lease"] else words

    rules = {" ".join(command(shlex.split(c)[1:])[:2]) for c in commands}
    for word in ("attnbench guard", "attnbench publish", "attnbench aggregate", "attnbench render", "attnbench hbm",
                 "attnbench experiment", "attnbench context", "attnbench env", "attnbench ceilings"):
        assert any(r.startswith(word) for r in rules), (word, rules)


@needs_snakemake
def test_no_rendered_command_interprets_a_config_value(rendered):
    work, commands = rendered
    stub_dir = work / "stub"
    stub_dir.mkdir()
    (stub_dir / "attnbench").write_text(STUB)
    (stub_dir / "attnbench").chmod(0o755)
    log = work / "argv.jsonl"
    for command in commands:
        words = shlex.split(command)
        for word in words:  # the folders of the redirected logs
            if word.startswith("results/"):
                (work / word).parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PATH": f"{stub_dir}:{os.environ['PATH']}", "STUB_LOG": str(log)}
        subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=work, env=env, check=True, timeout=60)
    assert not list(work.rglob("PWNED*")), list(work.rglob("PWNED*"))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == len(commands)
    publish = next(c for c in calls if c[0] == "publish")
    assert [publish[i + 1] for i, w in enumerate(publish) if w == "--tag"] == TAGS
    for command, argv in zip(commands, calls):  # each argument exactly as the rendered command quoted it
        words = shlex.split(command)
        assert argv == words[1:words.index(">")][1:], command


@needs_snakemake
def test_a_bad_environment_variable_stops_snakemake_at_parse_time_in_one_line(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    proc = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
                           "--configfile", "c.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATTNBENCH_DEADLINE": "in an hour"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    expected = "attnbench: config error: ATTNBENCH_DEADLINE='in an hour' is not allowed; allowed: a Unix time"
    assert expected in proc.stderr
    assert not (tmp_path / "results").exists()
