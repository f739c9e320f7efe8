"""The stage's runner for real: `attnbench context-parallel` starts torchrun with two gloo ranks and writes
rows that validate against the results schema; a job stopped at its time limit still leaves a row per item."""
import copy
import json

import pandas as pd

from attnbench.bench.schema import validate_frame
from attnbench.cli import main
from attnbench.config import validate_config
from attnbench.parallel.columns import CP_COLUMNS
from attnbench.plan import build_plan

CONFIG = {"sweep": "t", "stages": ["context_parallel"],
          "microbench": {"cpu": {"backends": ["eager"], "groups": {"g": {"seq": 64}}},
                         "cuda": {"backends": ["eager"], "groups": {"g": {"seq": 64}}}},
          "context_parallel": {
              "world_sizes": [2], "backends": ["ring-sdpa-flash", "torch-cp-allgather"], "reps": 2,
              "shardings": ["zigzag", "striped"],
              "groups": {"g": {"mode": "fwd_bwd", "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 16,
                               "seq": 64, "causal": True, "dtype": "fp32"}}}}


def job_file(tmp_path, **settings) -> str:
    config = copy.deepcopy(CONFIG)
    config["context_parallel"].update(settings)
    (job,) = build_plan(validate_config(config), "cpu").context_parallel
    path = tmp_path / "n2.json"
    path.write_text(json.dumps(job.payload))
    return str(path)


def test_runner_writes_a_valid_row_per_item(tmp_path):
    out = tmp_path / "n2.parquet"
    assert main(["context-parallel", "--job", job_file(tmp_path), "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    validate_frame(df, str(out))
    assert set(CP_COLUMNS) <= set(df.columns) and len(df) == 4
    ring = df[df["backend"] == "ring-sdpa-flash"].set_index("sharding")
    assert set(ring["status"]) == {"ok"}, ring["reason"].tolist()
    assert (ring["world_size"] == 2).all() and (ring["seq_local"] == 32).all() and (ring["n_reps"] == 2).all()
    assert (ring["ms_median"] > 0).all() and (ring["tflops_per_gpu"] * 2 == ring["tflops"]).all()
    assert (ring["comm_ms"] > 0).all() and (ring["compute_ms_max"] >= ring["compute_ms_mean"]).all()
    assert ring["phase_method"].str.startswith("wall-clock").all()
    assert (ring["numerics_status"] == "checked").all() and (ring["rel_err"] < 1e-5).all()
    assert (ring["rel_err_dk"] < 1e-5).all() and (ring["err_ratio_vs_unsharded"] < 2).all()
    assert ring.loc["zigzag", "work_imbalance"] == 1.0
    torch_cp = df[df["backend"] == "torch-cp-allgather"].set_index("sharding")
    assert torch_cp.loc["zigzag", "status"] == "unavailable" and "CUDA SDPA ops" in torch_cp.loc["zigzag", "reason"]
    assert torch_cp.loc["striped", "status"] == "unavailable"
    assert not list(tmp_path.glob(".*partial*"))


def test_a_job_stopped_at_its_time_limit_leaves_error_rows(tmp_path):
    out = tmp_path / "n2.parquet"
    assert main(["context-parallel", "--job", job_file(tmp_path, timeout_s=0.5), "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    assert len(df) == 4 and set(df["status"]) == {"error"}
    assert df["reason"].str.startswith("not measured: the job's ranks killed at its time limit (0.5 s)").all()


def test_a_job_after_the_sweep_deadline_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_DEADLINE", "1")
    out = tmp_path / "n2.parquet"
    assert main(["context-parallel", "--job", job_file(tmp_path), "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    assert len(df) == 4 and df["reason"].str.startswith("not run: the sweep deadline").all()
