"""The workflow's parse-time checks, the job guard, the GPU lease and the rule-backend contract (no Snakemake run)."""
import copy
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnbench.errors import ConfigError
from attnbench.report import ingest, jobs, pipeline
from attnbench.bench.schema import results_schema_text, validate_frame

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "sweep": "unit",
    "device": "cpu",
    "timing": {"cpu_min_run_time_s": 0.01},
    "microbench": {
        "cpu": {"backends": ["eager", "sdpa-math"], "rule_backends": {"c-naive": ["g"]},
                "groups": {"g": {"mode": ["fwd", "decode"], "heads_q": 2, "head_dim": 16, "seq": 32,
                                 "dtype": ["fp32", "bf16"]},
                           "flexonly": {"backends": ["flex"], "heads_q": 2, "head_dim": 16, "seq": 32}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"g": {"seq": 64}}},
    },
}


def _with(path: str, value):
    config = copy.deepcopy(CONFIG)
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    node[last] = value
    return config


def test_sweep_lists_jobs_files_and_says_why_this_grid():
    sweep = pipeline.load_sweep(CONFIG, ["c-naive"])
    assert sweep.device == "cpu" and sweep.config["device"] == "cpu"
    assert sweep.jobs() == [("eager", "g"), ("sdpa-math", "g"), ("flex", "flexonly")]
    assert sweep.rule_jobs() == [("c-naive", "g")]
    assert sweep.results_files("results/unit")[-1] == "results/unit/microbench/c-naive/g.parquet"
    assert "runs the cpu grid (device: cpu in the config)" in sweep.summary()
    assert sweep.wildcard_pattern("backend") == "eager|sdpa\\-math|flex"


@pytest.mark.parametrize("path, value, message", [
    ("bogus", 1, "unknown key 'bogus'; allowed: sweep, device"),
    ("microbench.cpu.backends", ["eager", "fa9"], "backend='fa9' is not known; allowed: eager, flex, sdpa-math"),
    ("microbench.cpu.groups", {"g": {"mode": "fwd", "seq": 32, "layout": "gqa", "heads_q": 6, "gqa_group": 4}},
     "gqa_group=4 is not allowed with heads_q=6"),
    ("microbench.cpu.groups", {"g": {"seq": []}}, "microbench.cpu.groups.g.seq is an empty list"),
    ("microbench.cpu.groups", {}, "microbench.cpu.groups"),
    ("microbench.cpu.rule_backends", {"cuda-thing": ["g"]}, "'cuda-thing' has no rule file"),
    ("microbench.cpu.rule_backends", {"c-naive": ["nope"]}, "group='nope' is not in microbench.cpu.groups"),
    ("microbench.cpu.rule_backends", {"eager": ["g"]}, "'eager' is a Python adapter's name"),
    ("microbench.cpu.groups.flexonly.backends", ["eager"], "runs on eager in both 'g' and 'flexonly'"),
])
def test_bad_configs_are_one_line_errors(path, value, message):
    with pytest.raises(ConfigError) as err:
        pipeline.load_sweep(_with(path, value), ["c-naive"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_default_config_merges_overrides(tmp_path):
    merged = pipeline.default_config({"sweep": "x", "timing": {"rep_ms": 5}}, REPO / "config" / "config.yaml")
    assert merged["sweep"] == "x" and merged["timing"]["rep_ms"] == 5 and merged["timing"]["warmup_ms"] == 25
    pipeline.load_sweep(merged, ["c-naive"])


@pytest.mark.parametrize("path", [REPO / "config" / "config.yaml", *sorted((REPO / "config" / "sweeps").glob("*.yaml"))],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shipped_configs_are_valid(path, device):
    rule_backends = [p.stem for p in (REPO / "workflow" / "rules" / "backends").glob("*.smk")]
    sweep = pipeline.load_sweep(yaml.safe_load(path.read_text()), rule_backends, device=device)
    assert sweep.jobs() and sweep.device == device


def test_snapshot_is_content_addressed(tmp_path):
    sweep = pipeline.load_sweep(CONFIG, ["c-naive"])
    a = sweep.snapshot(tmp_path)
    assert sweep.snapshot(tmp_path) == a and json.loads(Path(a).read_text()) == sweep.config
    other = pipeline.load_sweep(_with("seed", 7), ["c-naive"]).snapshot(tmp_path)
    assert other != a


def test_committed_results_schema_is_the_generated_one():
    assert (REPO / "workflow" / "schemas" / "results.schema.yaml").read_text() == results_schema_text()
    link = REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert link.is_symlink() and link.resolve() == (REPO / "attnbench" / "schemas" / "config.schema.yaml").resolve()


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return str(path)


def test_guard_turns_a_crashed_job_into_error_rows(config_file, tmp_path, capfd):
    out = tmp_path / "rows.parquet"
    crash = [sys.executable, "-c", "import sys; print('boom: kernel fault', file=sys.stderr); import os; os.abort()"]
    assert jobs.guard(crash, config=config_file, group="g", backends=["eager"], out=str(out)) == 0
    df = pd.read_parquet(out)
    assert len(df) == 4 and set(df["status"]) == {"error"} and set(df["backend"]) == {"eager"}
    assert df["reason"].str.contains("job killed by SIGABRT before this case finished: boom: kernel fault").all()
    validate_frame(df, str(out))
    assert "boom: kernel fault" in capfd.readouterr().err  # the child's stderr still reaches the log


def test_guard_keeps_the_rows_of_a_stopped_job_and_fills_in_the_rest(config_file, tmp_path):
    out = tmp_path / "rows.parquet"
    partial = [sys.executable, "-c",
               "import sys; from attnbench.workflow.guard import error_rows; from attnbench.bench.results import write_atomic; "
               f"df = error_rows({config_file!r}, 'g', ['eager'], '').iloc[:1].assign(status='ok'); "
               f"write_atomic(df, {str(out)!r}); sys.exit(3)"]
    assert jobs.guard(partial, config=config_file, group="g", backends=["eager"], out=str(out)) == 0
    df = pd.read_parquet(out)
    assert df["status"].tolist() == ["ok", "error", "error", "error"] and df["case_id"].is_unique
    assert df["reason"].iloc[1].startswith("job exited with code 3 before this case finished")


def test_guard_keeps_a_finished_job_and_honours_the_deadline(config_file, tmp_path, monkeypatch):
    out = tmp_path / "rows.parquet"
    write = [sys.executable, "-c", f"import pandas as pd; pd.DataFrame({{'x': [1]}}).to_parquet({str(out)!r})"]
    assert jobs.guard(write, config=config_file, group="g", backends=None, out=str(out)) == 0
    assert list(pd.read_parquet(out).columns) == ["x"]
    monkeypatch.setenv(jobs.DEADLINE_ENV, "1")
    late = tmp_path / "late.parquet"
    assert jobs.guard(["false"], config=config_file, group="g", backends=None, out=str(late)) == 0
    df = pd.read_parquet(late)
    assert set(df["backend"]) == {"eager", "sdpa-math"} and df["reason"].str.startswith("not run: the sweep deadline").all()


def test_gpu_leases_are_exclusive_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    first = jobs.try_lease(jobs.visible_devices())
    second = jobs.try_lease(jobs.visible_devices())
    assert (first[0], second[0]) == ("3", "5")
    assert jobs.try_lease(jobs.visible_devices()) is None  # both taken: a third job waits
    first[1].close()  # closing the lock file releases the device
    third = jobs.try_lease(jobs.visible_devices())
    assert third[0] == "3"
    second[1].close(), third[1].close()


def test_guard_sets_cuda_visible_devices_from_the_lease(config_file, tmp_path, monkeypatch):
    monkeypatch.setenv(jobs.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    out = tmp_path / "seen.parquet"
    child = [sys.executable, "-c", "import os, pandas as pd; "
             f"pd.DataFrame({{'seen': [os.environ['CUDA_VISIBLE_DEVICES']]}}).to_parquet({str(out)!r})"]
    assert jobs.guard(child, config=config_file, group="g", backends=None, out=str(out), gpu=True) == 0
    assert pd.read_parquet(out)["seen"].tolist() == ["7"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


def test_rule_backend_contract(config_file, tmp_path):
    cases = tmp_path / "cases.tsv"
    assert ingest.write_cases(config_file, "g", cases) == 4
    table = pd.read_csv(cases, sep="\t", dtype={"case_id": str})
    assert list(table.columns) == list(ingest.CASE_COLUMNS) and set(table["causal"]) == {0}
    fwd32 = table[(table["mode"] == "fwd") & (table["dtype"] == "fp32")]["case_id"].iloc[0]
    dec = table[table["mode"] == "decode"]["case_id"].iloc[0]
    timings = tmp_path / "timings.tsv"
    timings.write_text("case_id\tstatus\tms_median\tms_p20\tms_p80\tn_reps\trel_err\tmax_abs_err\treason\n"
                       f"{fwd32}\tok\t2.0\t1.9\t2.2\t5\t1e-7\t2e-7\t\n"
                       f"{dec}\tunsupported\t\t\t\t\t\t\tfwd only\n")
    df = ingest.ingest(config_file, "g", "c-naive", timings=str(timings), ceilings=None, version="cc 1",
                       family="fused")
    validate_frame(df, "ingest")
    by_id = df.set_index("case_id")
    assert by_id.loc[fwd32, "status"] == "ok" and by_id.loc[fwd32, "tflops"] == pytest.approx(
        by_id.loc[fwd32, "flops"] / 2e-3 / 1e12)
    assert by_id.loc[dec, "status"] == "unsupported" and by_id.loc[dec, "reason"] == "fwd only"
    assert (df["status"] == "error").sum() == 2  # the two cases the command printed nothing for
    down = ingest.ingest(config_file, "g", "c-naive", timings=None, ceilings=None, version="", family="fused",
                         unavailable="no compiler")
    assert set(down["status"]) == {"unavailable"} and set(down["reason"]) == {"no compiler"}
    bad = tmp_path / "bad.tsv"
    bad.write_text("case_id\tstatus\tms_median\tms_p20\tms_p80\tn_reps\nx\tfast\t1\t1\t1\t1\n")
    with pytest.raises(Exception, match="status='fast' is not allowed; allowed: ok, unsupported, error"):
        ingest.read_timings(bad)


def test_config_readme_documents_every_key():
    from attnbench.workloads.grid import GRID_KEYS

    readme = (REPO / "config" / "README.md").read_text()
    top = yaml.safe_load((REPO / "attnbench" / "schemas" / "config.schema.yaml").read_text())
    report = yaml.safe_load((REPO / "attnbench" / "schemas" / "report.schema.yaml").read_text())
    keys = [f"`{k}`" for k in top["properties"] if k != "timing"]
    keys += [f"`timing.{k}`" for k in top["properties"]["timing"]["properties"]]
    keys += [f"`{k}`" for k in top["$defs"]["plan"]["properties"]] + [f"`{k}`" for k in GRID_KEYS]
    keys += [f"`report.wandb.{k}`" for k in report["properties"]["wandb"]["properties"]]
    missing = [k for k in keys if k not in readme]
    assert not missing, f"config/README.md does not document {missing}"
