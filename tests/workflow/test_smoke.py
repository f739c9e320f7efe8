"""Every stage through Snakemake: the smoke sweep (config/sweeps/smoke.yaml) in a temporary folder, up to
`snakemake publish` offline, then the report's sections, every stage's index, and the W&B run's tables.

This is the CI run of the whole pipeline (issue 14, item 9): every stage's rules executed, not linted.
"""
import html
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from attnbench.report.artifacts import read_index
from attnbench.report.stages import SECTIONS, section

REPO = Path(__file__).resolve().parents[2]
STAGES = ("env", "microbench", "stability", "hbm", "pretrain", "context", "context_parallel")  # the smoke sweep's, and env
FAKE_KEY = "fedcba9876543210fedcba9876543210fedcba98"

pytestmark = pytest.mark.skipif(shutil.which("snakemake") is None or shutil.which("attnbench") is None,
                                reason="needs the snakemake and attnbench commands (pip install -e .[test])")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    shutil.copy(REPO / "config" / "sweeps" / "smoke.yaml", workdir / "smoke.yaml")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY,
           "WANDB_CONFIG_DIR": str(workdir / "wandb-config"), "WANDB_CACHE_DIR": str(workdir / "wandb-cache")}
    proc = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "publish",
                           "--cores", "2", "--configfile", "smoke.yaml"],
                          cwd=workdir, capture_output=True, text=True, timeout=3600, env=env)  # minutes when quiet
    assert proc.returncode == 0, proc.stderr[-5000:]
    return workdir


def test_every_stage_wrote_its_index_and_its_files(sweep):
    results = sweep / "results" / "smoke"
    for stage in STAGES:
        index = read_index(results / stage / "tables" / "index.json")
        assert index["tables"], stage
        for entry in index["tables"] + index["figures"]:
            for path in entry["files"].values():
                assert (results / stage / path).stat().st_size > 0, (stage, path)
    microbench = read_index(results / "microbench" / "tables" / "index.json")
    measured = {e["name"] for e in microbench["tables"] if not e["empty"]}
    assert {"tflops", "fa3_fwd", "fa3_decode", "triton_vs_best"} <= measured  # the smoke grids have every kind


def test_report_has_a_section_per_stage_and_says_what_did_not_run(sweep):
    page = (sweep / "reports" / "smoke" / "report.html").read_text()
    headings = [html.unescape(re.sub(r"<[^>]+>", "", h)).rstrip("¶").strip()
                for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page, re.S)]
    assert headings == [s.title for s in SECTIONS]
    assert "Traceback" not in page
    triton = page.split(section("triton").title)[1].split(section("pretrain").title)[0]
    assert "triton_vs_best" in triton  # the microbench triton rows, beside the best other backend
    for text in ("Table (ceilings)", "Table (fa3_fwd)", "Table (stability)", "Table (kv_cache)", "Table (divergence)",
                 "Table (perplexity_sliding)", "Table (cp_tflops)"):
        assert text in page, text
    command = html.unescape(re.search(r"<code>(attnbench render [^<]+)</code>", page).group(1))
    (sweep / "reports" / "smoke" / "report.html").unlink()
    proc = subprocess.run(shlex.split(command), cwd=sweep, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the printed re-run command works as printed
    assert (sweep / "reports" / "smoke" / "report.html").read_text().count("<h2") == len(SECTIONS)


def test_publish_logged_every_stage_and_never_the_key(sweep):
    receipt = json.loads((sweep / "results" / "smoke" / "wandb" / "published.json").read_text())
    assert receipt["mode"] == "offline" and receipt["stages"] == list(STAGES)
    run_dir = (sweep / receipt["run_dir"]).parent
    tables = run_dir / "files" / "media" / "table"
    for stage in STAGES:
        index = read_index(sweep / "results" / "smoke" / stage / "tables" / "index.json")
        for entry in index["tables"]:
            assert f"{stage}/{entry['name']}" in receipt["logged"]
            assert list((tables / stage).glob(f"{entry['name']}_*.table.json")), (stage, entry["name"])
        for entry in index["figures"]:
            assert f"{stage}/figures/{entry['name']}" in receipt["logged"]
    assert list((tables / "microbench").glob("results_*.table.json"))
    spec = json.loads((sweep / receipt["report_spec"]).read_text())
    assert [s["name"] for s in spec["sections"]] == [s.name for s in SECTIONS]  # triton: the microbench triton rows
    for path in [*(sweep / "results").rglob("*"), *(sweep / ".snakemake" / "log").rglob("*")]:
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_snakemake_report_has_every_stage_with_captions(sweep):
    proc = subprocess.run(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(sweep), "publish",
                           "--report", "snakemake-report.html", "--configfile", "smoke.yaml"],
                          cwd=sweep, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (sweep / "snakemake-report.html").read_text()
    from attnbench.report.stages import STAGE_REPORTS

    for stage in STAGES:
        assert STAGE_REPORTS[stage].title in page, stage
    assert "ceilings.csv" in page and "hbm-ratios.png" in page and "perplexity.png" in page
    caption = read_index(sweep / "results" / "smoke" / "hbm" / "tables" / "index.json")["tables"][0]["caption"]
    assert caption[:60] in page
