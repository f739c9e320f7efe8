"""A microbench run end to end: a valid parquet with one row per (case, backend)."""
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from attnbench.bench.results import STATUSES, read_results
from attnbench.cli import main

CONFIG = {
    "sweep": "test",
    "device": "cpu",
    "stages": ["microbench"],
    "timing": {"cpu_min_run_time_s": 0.02},
    "microbench": {
        "cpu": {"backends": ["eager", "sdpa-math", "sdpa-flash", "sdpa-cudnn"],
                "groups": {"tiny": {"mode": ["fwd", "fwd_bwd", "decode"], "layout": ["mha", "gqa"], "heads_q": 4,
                                    "gqa_group": 2, "head_dim": 16, "seq": 48, "causal": [False, True],
                                    "dtype": ["fp32", "bf16"]}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"g": {"seq": 64}}},
    },
}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_microbench_writes_one_valid_row_per_case_and_backend(config_file, tmp_path):
    out = tmp_path / "out" / "rows.parquet"
    assert main(["microbench", "--config", str(config_file), "--group", "tiny", "--out", str(out)]) == 0
    df = read_results(out)
    n_cases = 2 * 2 * 2 * 2 + 2 * 2  # fwd and fwd_bwd: layout x causal x dtype; decode: layout x dtype
    assert len(df) == n_cases * 4
    assert df.groupby("backend").size().to_dict() == {b: n_cases for b in CONFIG["microbench"]["cpu"]["backends"]}
    assert set(df["status"]) <= set(STATUSES)
    assert (df.loc[df.backend == "sdpa-cudnn", "status"] == "unavailable").all()
    ok = df[df.status == "ok"]
    assert (ok.backend == "sdpa-math").sum() == n_cases
    assert (ok.ms_median > 0).all() and (ok.tflops > 0).all() and ok.kernels.str.len().gt(0).all()
    assert ok.bound.isin(["memory", "compute", "latency"]).all()
    assert (ok[ok.backend == "sdpa-math"].err_ratio_vs_math == 1.0).all()
    bwd = ok[ok["mode"] == "fwd_bwd"]
    assert bwd[["rel_err_dq", "rel_err_dk", "rel_err_dv"]].notna().all().all()
    assert df.case_id.nunique() == n_cases
    assert (df.git_sha.str.len() > 0).all() and (df.torch_version.str.len() > 0).all()


def test_unknown_backend_fails_before_work(config_file, tmp_path, capsys):
    out = tmp_path / "never.parquet"
    assert main(["microbench", "--config", str(config_file), "--group", "tiny", "--backend", "fa9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: error: backend='fa9' is not known; allowed:") and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c.update(typo=1), "config: unknown key 'typo'; allowed: sweep, sources, device"),
    (lambda c: c.update(device="tpu"), "device='tpu' is not allowed; allowed: auto, cpu, cuda"),
    (lambda c: c["microbench"]["cpu"]["backends"].append("fa9"), "microbench.cpu.backends: backend='fa9' is not known"),
    (lambda c: c["microbench"]["cpu"]["groups"]["tiny"].update(layout="mqa", heads_kv=2), "set heads_kv only for layout gqa"),
])
def test_bad_config_is_one_line_error(tmp_path, capsys, mutate, message):
    import copy

    config = copy.deepcopy(CONFIG)
    mutate(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["microbench", "--config", str(path), "--group", "tiny", "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_existing_results_survive_a_failed_run(config_file, tmp_path):
    out = tmp_path / "rows.parquet"
    pd.DataFrame({"case_id": ["x"], "backend": ["b"], "status": ["ok"], "mode": ["fwd"], "layout": ["mha"],
                  "dtype": ["fp32"]}).to_parquet(out)
    before = out.read_bytes()
    assert main(["microbench", "--config", str(config_file), "--group", "tiny", "--backend", "nope", "--out", str(out)]) == 2
    assert out.read_bytes() == before


def test_cli_backends_lists_status():
    out = subprocess.run([sys.executable, "-m", "attnbench.cli", "backends"], capture_output=True, text=True, check=True)
    assert "sdpa-math" in out.stdout and "available" in out.stdout


def test_results_files_get_normal_permissions(tmp_path):
    import os

    from attnbench.bench.results import write_atomic

    out = tmp_path / "rows.parquet"
    write_atomic(pd.DataFrame({"case_id": ["x"]}), out)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_results_files_split_the_bytes_of_measured_floats_and_read_back_exactly(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    from attnbench.bench.results import write_atomic

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"loss": 2.0 + rng.standard_normal(4000).cumsum() * 1e-3,  # a measurement: all distinct
                          "overflow": np.where(rng.random(4000) < 0.9, 0.0, np.nan),  # repeats
                          "run": ["fp8/bf16/s0"] * 4000})
    frame.loc[7, "loss"] = np.nan
    out = tmp_path / "steps.parquet"
    write_atomic(frame, out)
    pd.testing.assert_frame_equal(pd.read_parquet(out), frame)  # lossless, NaN included
    columns = pq.ParquetFile(out).metadata.row_group(0)
    encodings = {columns.column(i).path_in_schema: columns.column(i).encodings for i in range(columns.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["loss"]
    assert "BYTE_STREAM_SPLIT" not in encodings["overflow"] and "RLE_DICTIONARY" in encodings["overflow"]
    assert "RLE_DICTIONARY" in encodings["run"]


def test_a_workload_group_runs_into_valid_rows(tmp_path):
    """A trace-driven group: planned, run, and every row valid against the results schema with its batch shape."""
    from attnbench.bench.schema import validate_frame

    groups = {"trace": {"mode": "fwd", "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 16, "causal": True,
                        "workload": {"trace": "azure-conv", "token_budget": 1200, "batches": 1}}}
    config = {**CONFIG, "microbench": {**CONFIG["microbench"],
                                       "cpu": {"backends": ["eager", "sdpa-padded"], "groups": groups}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "rows.parquet"
    assert main(["microbench", "--config", str(path), "--group", "trace", "--out", str(out)]) == 0
    df = read_results(out)
    validate_frame(df, str(out))
    assert set(df.status) == {"ok"} and set(df.numerics_status) == {"ok"} and set(df.workload) == {"azure-conv"}
    assert (df.tokens_q == df.seq_lens_q.map(lambda s: sum(map(int, s.split(","))))).all()
    assert (df.flops < df.flops_padded).all() and (df.seq_q_median <= df.seq_q).all()


def test_an_fp8_kernel_on_bf16_inputs_is_held_to_the_fp8_matmul_ceiling():
    # triton-fp8 takes bf16 Q, K, V and runs its matmuls in e4m3: its roofline is fp8's, not bf16's
    from attnbench.bench.ceilings import Ceilings
    from attnbench.bench.microbench import base_row
    from attnbench.kernels.registry import get_backend
    from attnbench.case import Case

    ceilings = Ceilings("cuda", "test", 4e12, {"fp32": 50e12, "bf16": 680e12, "fp8": 1250e12})
    case = Case(mode="fwd", layout="mha", batch=1, heads_q=4, heads_kv=4, head_dim_qk=64, head_dim_v=64,
                seq_q=128, seq_kv=128, causal=False, dtype="bf16")
    assert base_row(case, get_backend("triton-fp8"), "cpu", ceilings)["peak_flops"] == 1250e12
    assert base_row(case, get_backend("triton"), "cpu", ceilings)["peak_flops"] == 680e12
