"""The pipeline for real: `snakemake --cores 2` on a tiny config in a temporary folder (microbench and
its stability passes), then its Snakemake report, the baseline comparison, W&B publishing (offline),
parse-time config errors and the linter."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnbench.bench import stats
from attnbench.report.artifacts import TABLE_FORMATS
from attnbench.report.figures import FIGURE_NAMES
from attnbench.report.tables import TABLE_NAMES

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ["eager", "sdpa-math", "sdpa-cudnn"]  # sdpa-cudnn: an unavailable row on a machine without CUDA
CONFIG = {
    "sweep": "e2e",
    "device": "cpu",
    "stages": ["microbench", "stability"],
    "timing": {"cpu_min_run_time_s": 0.01},
    "stability": {"groups": ["tiny"], "processes": 2},
    "microbench": {
        "cpu": {"backends": BACKENDS, "rule_backends": {"c-naive": ["tiny"]},
                "groups": {"tiny": {"mode": ["fwd", "decode"], "layout": "mha", "heads_q": 2, "head_dim": 16,
                                    "seq": [64, 128], "causal": False, "dtype": ["fp32", "bf16"]}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"tiny": {"seq": 64}}},
    },
}
N_CASES = 2 * 2 * 2  # mode x seq x dtype
FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 characters, like a W&B key

needs_snakemake = pytest.mark.skipif(shutil.which("snakemake") is None or shutil.which("attnbench") is None,
                                     reason="needs the snakemake and attnbench commands (pip install -e .[test])")


def snakemake(workdir: Path, *args: str, env: dict | None = None, timeout: int = 600):
    """Targets first: --configfile takes every word after it."""
    cmd = ["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real sweep: env, ceilings, a job per backend, the rule backend, aggregate, report."""
    workdir = tmp_path_factory.mktemp("sweep")
    (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    # `report` is the last stage of the microbench pipeline; other stages' rules are not needed here.
    # a few minutes on 2 idle cores; the limit is for a machine that others share
    proc = snakemake(workdir, "report", "--cores", "2", "--configfile", "config.yaml", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir, proc


@needs_snakemake
def test_sweep_writes_results_tables_figures_and_report(run):
    workdir, proc = run
    assert "runs the cpu grid (device: cpu in the config)" in proc.stderr
    results = workdir / "results" / "e2e"
    df = pd.read_parquet(results / "microbench.parquet")
    assert df.groupby("backend").size().to_dict() == {b: N_CASES for b in BACKENDS + ["c-naive"]}
    assert set(df.loc[df.backend == "sdpa-cudnn", "status"]) == {"unavailable"}
    assert set(df.loc[df.backend.isin(["eager", "sdpa-math"]), "status"]) == {"ok"}
    naive = df[df.backend == "c-naive"].set_index(["mode", "dtype"])["status"]
    if shutil.which("cc"):  # the rule backend builds and runs fwd fp32, refuses the rest
        assert naive.loc[("fwd", "fp32")].eq("ok").all() and naive.drop(("fwd", "fp32")).eq("unsupported").all()
    else:  # no compiler: every row says so
        assert naive.eq("unavailable").all()
    for name in TABLE_NAMES:
        for ext in TABLE_FORMATS:
            assert (results / "microbench" / "tables" / f"{name}.{ext}").stat().st_size > 0
    status = pd.read_csv(results / "microbench" / "tables" / "status.csv")
    assert set(status["backend"]) == set(BACKENDS + ["c-naive"])
    tflops = pd.read_csv(results / "microbench" / "tables" / "tflops.csv")
    assert set(tflops["backend"]) == set(BACKENDS + ["c-naive"])
    assert "Device: CPU" in (results / "microbench" / "tables" / "tflops.md").read_text()
    for name in FIGURE_NAMES:
        assert (results / "microbench" / "figures" / f"{name}.png").stat().st_size > 1000
    env = yaml.safe_load((results / "env" / "config.yaml").read_text())
    assert env["device"] == "cpu" and env["sweep"] == "e2e"
    versions = json.loads((results / "env" / "versions.json").read_text())
    assert versions["backends"]["sdpa-cudnn"]["available"] is False and versions["git_sha"]
    html = (workdir / "reports" / "e2e" / "report.html").read_text()
    assert html.count("data:image/png") >= 4 and "Who wins where" in html
    for backend in BACKENDS + ["c-naive"]:
        assert backend in html
    assert "Paired comparisons within a job" in html and "Timing stability across fresh processes" in html
    rows = df[df.backend.isin(["eager", "sdpa-math"])]
    assert (rows["n_rounds"] == 3).all() and rows["job_id"].nunique() == 1 and rows["timing_lock"].all()
    assert (rows["ms_ci_low"] <= rows["ms_median"]).all() and (rows["ms_median"] <= rows["ms_ci_high"]).all()
    pairs = stats.pairs(df, 0.03)
    assert set(zip(pairs["backend_a"], pairs["backend_b"])) == {("eager", "sdpa-math")} and len(pairs) == N_CASES
    assert len(pd.read_csv(results / "microbench" / "tables" / "pairs.csv")) == N_CASES
    stability = pd.read_csv(results / "stability" / "tables" / "stability.csv")
    assert len(stability) == 2 * N_CASES and set(stability["passes"]) == {"2 vs 1"}
    for i in (1, 2):  # each pass its own process
        assert pd.read_parquet(results / "stability" / "tiny" / f"{i}.parquet")["job_id"].nunique() == 1
    assert (results / "logs" / "microbench" / "tiny.log").is_file()
    assert (results / "benchmarks" / "microbench" / "tiny.tsv").is_file()
    assert json.loads((results / "plan" / "microbench" / "tiny.json").read_text())["backends"] == BACKENDS


def _cut_at_the_deadline(run, workdir: Path) -> Path:
    """A copy of the sweep in ``workdir`` as a cut GPU call leaves it: its microbench job ran again after the
    deadline had passed (deadline rows and a retry marker; the stage's tables and report already written).
    Returns the copy's results folder."""
    shutil.copytree(run[0], workdir, symlinks=True)
    results = workdir / "results" / "e2e"
    (results / "microbench" / "tiny.parquet").unlink()
    cut = subprocess.run(["attnbench", "guard", "--job", str(results / "plan" / "microbench" / "tiny.json"),
                          "--out", str(results / "microbench" / "tiny.parquet"), "--", "false"], cwd=workdir,
                         capture_output=True, text=True, env={**os.environ, "ATTNBENCH_DEADLINE": "1"})
    assert cut.returncode == 0, cut.stderr
    return results


def _dry_run(workdir: Path) -> tuple[str, set[str]]:
    """What the next plain `snakemake` in ``workdir`` would do: its log, and the rules it plans."""
    dry = snakemake(workdir, "-n", "--configfile", "config.yaml")
    assert dry.returncode == 0, dry.stderr[-3000:]
    log = dry.stdout + dry.stderr
    return log, set(re.findall(r"^(?:local)?rule (\S+):$", log, flags=re.M))


@needs_snakemake
def test_a_job_stopped_at_the_sweep_deadline_runs_again_in_the_next_sweep(run, tmp_path):
    """What a cut GPU call leaves is measured by the next plain `snakemake`: the parse reopens the job and
    the default target reruns it, although everything downstream of it exists."""
    workdir = tmp_path / "sweep"
    results = _cut_at_the_deadline(run, workdir)
    assert pd.read_parquet(results / "microbench" / "tiny.parquet")["reason"].str.startswith(
        "not run: the sweep deadline").all()
    log, planned = _dry_run(workdir)
    assert "tiny.parquet was interrupted" in log and not (results / "microbench" / "tiny.parquet").exists()
    assert {"microbench", "aggregate", "microbench_tables", "report"} <= planned, planned


@needs_snakemake
def test_a_stopped_sweep_packed_on_one_machine_resumes_on_a_fresh_one(run, tmp_path):
    """A cold GPU machine gets back what an earlier lease packed (scripts/lease.sh: `tar` of the results
    folder, mtimes kept) in a fresh checkout, without Snakemake's own records (.snakemake/): the parse
    reopens the stopped job, and Snakemake plans that job and what depends on it, no finished job again."""
    first = tmp_path / "first"
    _cut_at_the_deadline(run, first)
    results = Path("results") / "e2e"
    packed = tmp_path / "e2e.tar.gz"
    subprocess.run(["tar", "-czf", str(packed), str(results)], cwd=first, check=True)
    second = tmp_path / "second"
    second.mkdir()
    (second / "config.yaml").write_text(yaml.safe_dump(CONFIG))  # the fresh checkout: newer than every row
    subprocess.run(["tar", "-xzf", str(packed), str(results)], cwd=second, check=True)
    log, planned = _dry_run(second)
    assert "tiny.parquet was interrupted" in log
    assert planned == {"microbench", "aggregate", "microbench_tables", "report", "all"}, planned


@needs_snakemake
def test_snakemake_report_has_captions_and_categories(run):
    workdir, _ = run
    proc = snakemake(workdir, "report", "--report", "snakemake-report.html", "--configfile", "config.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (workdir / "snakemake-report.html").read_text()
    for text in ("Microbenchmarks", "Environment", "roofline.png", "Achieved FLOP/s against arithmetic intensity"):
        assert text in page


@needs_snakemake
def test_compare_target_fails_only_on_a_row_slower_beyond_noise(run):
    workdir, _ = run
    same = snakemake(workdir, "compare", "--cores", "1", "--configfile", "config.yaml", "--config",
                     "baseline=results/e2e/microbench.parquet")
    assert same.returncode == 0, same.stderr[-3000:]
    assert "within noise" in (workdir / "results" / "e2e" / "compare" / "compare.md").read_text()
    merged = pd.read_parquet(workdir / "results" / "e2e" / "microbench.parquet")
    fast = merged.assign(ms_median=merged["ms_median"] / 100, ms_ci_low=merged["ms_median"] / 100 * 0.99,
                         ms_ci_high=merged["ms_median"] / 100 * 1.01)  # a baseline 100x faster than this sweep
    (workdir / "results" / "fast").mkdir(exist_ok=True)
    fast.to_parquet(workdir / "results" / "fast" / "microbench.parquet")
    slower = snakemake(workdir, "compare", "--cores", "1", "--configfile", "config.yaml", "--config",
                       "baseline=results/fast")
    assert slower.returncode != 0 and "slower" in slower.stderr
    missing = snakemake(workdir, "compare", "--cores", "1", "--configfile", "config.yaml")
    assert missing.returncode != 0 and "compare: no baseline; set one with --config baseline=" in missing.stderr


@needs_snakemake
def test_publish_offline_writes_a_wandb_run_and_never_the_key(run):
    workdir, _ = run
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY, "WANDB_CONFIG_DIR": str(workdir / "wandb-config")}
    proc = snakemake(workdir, "publish", "--cores", "1", "--configfile", "config.yaml", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    receipt = json.loads((workdir / "results" / "e2e" / "wandb" / "published.json").read_text())
    assert receipt["mode"] == "offline" and receipt["sync"].startswith("wandb sync ")
    assert {"microbench/results", "microbench/tflops", "microbench/figures/roofline", "env/ceilings"} <= set(
        receipt["logged"])
    run_dir = (workdir / receipt["run_dir"]).parent
    assert run_dir.name.startswith("offline-run-")
    record = next(run_dir.glob("run-*.wandb")).read_bytes()  # offline runs keep config and history here
    assert b"provenance" in record and b"git_sha" in record and b"attnbench-e2e" in record
    tables = list((run_dir / "files" / "media" / "table" / "microbench").glob("*.table.json"))
    assert len(tables) >= len(TABLE_NAMES)
    assert list((run_dir / "files" / "media" / "images" / "microbench").rglob("roofline*.png"))
    for path in [*(workdir / "results").rglob("*"), *(workdir / ".snakemake" / "log").rglob("*")]:
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


@needs_snakemake
def test_bad_config_fails_at_parse_time_in_one_line(tmp_path):
    bad = {**CONFIG, "microbench": {**CONFIG["microbench"],
                                    "cpu": {**CONFIG["microbench"]["cpu"], "backends": ["eager", "fa9"]}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    proc = snakemake(tmp_path, "-n", "--configfile", "bad.yaml")
    assert proc.returncode != 0
    assert "attnbench: config error: microbench.cpu.backends: backend='fa9' is not known; allowed: eager" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.fixture(scope="module")
def lints(tmp_path_factory):
    """`snakemake --lint` once, split into {file name: its lint lines}."""
    proc = snakemake(tmp_path_factory.mktemp("lint"), "--lint")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 or "Lints for" in text, text[-3000:]  # it ran, whatever it found
    found, current = {}, None
    for line in text.splitlines():
        if line.startswith("Lints for"):
            current = Path(re.search(r"(/\S+?)\)?:$", line).group(1)).name
        elif current and line.startswith("    * "):
            found.setdefault(current, []).append(line.strip())
    return found


RULE_FILES = ["Snakefile"] + sorted(p.name for p in (REPO / "workflow" / "rules").rglob("*.smk"))


@needs_snakemake
@pytest.mark.parametrize("name", RULE_FILES)
def test_lint_is_clean(lints, name):
    assert not lints.get(name), f"snakemake --lint on {name}: {lints[name]}"
