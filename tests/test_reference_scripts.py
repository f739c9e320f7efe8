"""The H200 reference scripts in their CPU smoke mode: a script that breaks here would waste a GPU lease.

Each script runs end to end at toy sizes on a host without CUDA (its own smoke branch) and must
write its result files with every experiment present, no `error` row and no traceback in its log
(the scripts catch a failing unit and go on, so an exit status alone would hide one).
"""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke mode of the GPU scripts")


def run_script(script: str, tmp_path: Path, **env) -> Path:
    out = tmp_path / "out"
    environment = {**os.environ, "OUT": str(out), "WORK": str(tmp_path / "work"), **{k: str(v) for k, v in env.items()}}
    done = subprocess.run(["bash", str(ROOT / "scripts" / script)], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]  # the scripts guard units and go on
    return out


def test_pretrain_script_writes_every_experiment(tmp_path):
    out = run_script("h200_pretrain.sh", tmp_path, BUDGET_S=300, STEPS=4)
    runs = pd.read_parquet(out / "pretrain_runs.parquet")
    assert set(runs["experiment"]) == {"divergence", "lr_sensitivity", "fp8", "layouts"}
    assert not (runs["status"] == "error").any(), runs[runs["status"] == "error"][["run", "reason"]]
    assert (runs[runs["run"] == "fp8/mxfp8"]["status"] == "ok").all()  # emulated where torchao cannot run it
    extra = pd.read_parquet(out / "pretrain_divergence.parquet")
    assert set(extra["table"]) == {"weight_divergence", "numerics_vs_fp64"}
    assert len(pd.read_parquet(out / "pretrain_steps.parquet")) > 0


def test_pretrain_script_runs_a_subset_and_records_a_shared_gpu(tmp_path):
    out = run_script("h200_pretrain.sh", tmp_path, BUDGET_S=120, STEPS=4, EXPERIMENTS="layouts",
                     SHARED_GPU="divergence")
    runs = pd.read_parquet(out / "pretrain_runs.parquet")
    assert set(runs["experiment"]) == {"layouts"} and (runs["status"] == "ok").all()
    assert (runs["gpu_shared_with"] == "divergence").all()
    assert not (out / "pretrain_divergence.parquet").exists()


def test_context_script_writes_cost_and_capability(tmp_path):
    out = run_script("h200_context.sh", tmp_path, BUDGET_S=240, COST_S=90, STEPS=4)
    cost = pd.read_parquet(out / "context_cost.parquet")
    assert {"context_cost", "rope_overhead"} <= set(cost["experiment"])
    assert not (cost["status"] == "error").any()
    capability = pd.read_parquet(out / "context_capability.parquet")
    assert set(capability["method"]) == {"none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3"}
    assert (capability["status"] == "ok").all()


def test_hbm_script_measures_chosen_parts_and_keeps_earlier_rows(tmp_path):
    earlier = ROOT / "results" / "reference" / "h200" / "hbm" / "hbm.parquet"
    out = run_script("h200_hbm.sh", tmp_path, BUDGET_S=200, HBM_PARTS="fwd mla", KEEP=earlier)
    df = pd.read_parquet(out / "hbm.parquet")
    new = df[df["status"] == "unavailable"]  # no GPU here: what ran now is an unavailable row
    assert set(new["group"]) == {"fwd", "mla"} and {"sdpa-cudnn", "flex"} <= set(new["backend"])
    old = pd.read_parquet(earlier)
    kept = df[df["status"] == "ok"].merge(old, on=["group", "case_id", "backend"], suffixes=("", "_earlier"))
    assert len(kept) == (df["status"] == "ok").sum() > 0  # every measured row comes from the earlier file
    assert (kept["bytes_read"] == kept["bytes_read_earlier"]).all()
    assert {"decode"} <= set(kept["group"]) and "fa4" in set(kept[kept["group"] == "fwd"]["backend"])
    assert (out / "ledger.parquet").is_file()


def test_pretrain_reference_report_renders_the_committed_rows(tmp_path):
    """The committed GPU-scale report is reproducible from the committed rows, on a CPU host."""
    rows = ROOT / "results" / "reference" / "h200" / "pretrain"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "pretrain_reference_report.py"), "--in", str(rows),
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    committed = ROOT / "reports" / "reference" / "h200" / "pretrain" / "tables"
    for table in committed.glob("*.csv"):
        assert (tmp_path / "tables" / table.name).read_text() == table.read_text(), table.name
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "pretrain_reference_report.py"), "--in",
                              str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode != 0 and "pretrain_runs.parquet is missing" in missing.stderr
