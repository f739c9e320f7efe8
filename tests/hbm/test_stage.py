"""The hbm stage end to end on CPU: unavailable rows without a GPU, and the ncu orchestration with a stand-in ncu.

The stand-in ``ncu`` (written below) runs the real profiling child on CPU, writes
an empty report, and on ``--import`` prints a hand-written CSV in ncu's raw-page
format: a FORMAT FIXTURE, not a measurement. What is tested is the plumbing: the
plan, the child's manifest, crash recovery, attribution and the row arithmetic.
"""
import json
import stat
import sys
import textwrap

import pytest
import yaml

from attnbench.bench import conventions
from attnbench.case import WORKLOAD_DEFAULTS, Case
from attnbench.bench.results import STATUSES
from attnbench.cli import main
from attnbench.hbm.ncu import NcuSettings
from attnbench.hbm.stage import HbmOptions, assemble_rows, frame, measurement_blocker, profile_pairs

CASE = Case(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16, seq_q=32,
            seq_kv=32, causal=False, dtype="fp32")
BACKENDS = ["eager", "sdpa-math", "sdpa-cudnn"]  # on CPU: ok, ok, unavailable

FAKE_NCU = textwrap.dedent(f"""\
    #!{sys.executable}
    import hashlib, json, os, subprocess, sys
    argv = sys.argv[1:]

    def case_id(fields):  # Case.case_id (the workload fields at their defaults left out), without importing torch
        defaults = json.loads({json.dumps(json.dumps(WORKLOAD_DEFAULTS))})
        fields = {{k: v for k, v in fields.items() if k not in defaults or v != defaults[k]}}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    if "--version" in argv:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0 (stand-in for tests)")
        sys.exit(0)
    if "--import" in argv:
        sys.stdout.write(open(os.environ["FAKE_NCU_RENAMED" if "--print-nvtx-rename" in argv
                                          else "FAKE_NCU_KERNELS"]).read())
        sys.exit(0)
    export, log = argv[argv.index("--export") + 1], argv[argv.index("--log-file") + 1]
    app = argv[argv.index("--metrics") + 2:]
    open(log, "w").write(os.environ.get("FAKE_NCU_LOG", "==PROF== Connected to process 1\\n"))
    if os.environ.get("FAKE_NCU_SKIP_APP"):
        sys.exit(1)
    if os.environ.get("FAKE_NCU_HANG"):
        import time
        time.sleep(600)
    open(export + ".ncu-rep", "w").write("stand-in report")
    if not os.environ.get("FAKE_NCU_CRASH_MARKER"):
        sys.exit(subprocess.call(app))
    # crash drill without the real child: the first process dies inside its second call,
    # later ones find every call unavailable
    plan = json.load(open(app[app.index("--plan") + 1]))
    pairs = [(c["case"], b) for c in plan["cases"] for b in c["backends"]]
    marker = os.environ["FAKE_NCU_CRASH_MARKER"]
    with open(app[app.index("--manifest") + 1], "a") as manifest:
        def emit(**e):
            manifest.write(json.dumps(e) + "\\n")
        first = not os.path.exists(marker)
        open(marker, "a").write("x")
        for i, (case, backend) in enumerate(pairs):
            cid = case_id(case)
            emit(event="start", case_id=cid, backend=backend)
            if first and i == 1:
                open(log, "a").write("==ERROR== The application returned an error code (139).\\n")
                sys.exit(139)
            emit(event="end", case_id=cid, backend=backend, status="ok" if first else "unavailable",
                 reason="" if first else "drill")
""")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"')
UNITS = '"","","","","","","","","","","","byte","byte","nsecond"'


def csv_text(names):
    rows = [(0, "gemm_a", "1,000,000", "200,000"), (1, "softmax", "3,000,000", "3,000,000"),
            (2, "gemm_b", "2,000,000", "100,000"), (3, "math_kernel", "5,000", "6,000")]
    lines = ["==PROF== Connected to process 1", HEADER, UNITS]
    for (i, _, read, write), name in zip(rows, names):
        lines.append(f'"{i}","1","python3","h","{name}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0",'
                     f'"{read}","{write}","1,000"')
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    eager, math = f"attnbench-hbm:{CASE.case_id}:eager", f"attnbench-hbm:{CASE.case_id}:sdpa-math"
    (tmp_path / "kernels.csv").write_text(csv_text(["gemm_a", "softmax", "gemm_b", "math_kernel"]))
    (tmp_path / "renamed.csv").write_text(csv_text([eager, eager, eager, math]))
    monkeypatch.setenv("FAKE_NCU_KERNELS", str(tmp_path / "kernels.csv"))
    monkeypatch.setenv("FAKE_NCU_RENAMED", str(tmp_path / "renamed.csv"))
    return str(path)


def options(**kw):
    base = dict(sweep="test", group="g", device="cpu", settings=NcuSettings(), warmup_calls=1, timeout_s=300)
    base.update(kw)
    return HbmOptions(**base)


def test_stand_in_ncu_end_to_end(fake_ncu, tmp_path):
    pending = [(CASE, b) for b in BACKENDS]
    measured = profile_pairs(pending, options(), fake_ncu, tmp_path / "work", log=lambda s: None)
    assert {k[1]: m.status for k, m in measured.items()} == {"eager": "ok", "sdpa-math": "ok",
                                                             "sdpa-cudnn": "unavailable"}
    df = frame(assemble_rows(pending, {}, "none", measured, options(), "2099.1.0"))
    eager = df[df.backend == "eager"].iloc[0]
    assert eager.bytes_read == 6_000_000 and eager.bytes_written == 3_300_000
    assert eager.bytes_measured == 9_300_000 and eager.n_kernels_profiled == 3
    assert eager.kernels_profiled == "gemm_a;softmax;gemm_b"
    assert eager.ratio_measured_model == pytest.approx(9_300_000 / conventions.bytes_model(CASE, "eager"))
    read_min, written_min = conventions.bytes_min_read_write(CASE)
    assert eager.ratio_read_min == pytest.approx(6_000_000 / read_min)
    assert eager.ratio_written_min == pytest.approx(3_300_000 / written_min)
    assert eager.model_family == "eager" and eager.time_status == "none" and eager.ncu_version == "2099.1.0"
    assert eager["ncu_gpu__time_duration.sum"] == pytest.approx(3e-6)
    assert df[df.backend == "sdpa-math"].iloc[0].bytes_measured == 11_000
    assert df[df.backend == "sdpa-cudnn"].iloc[0].reason.startswith("sdpa-cudnn needs CUDA")
    assert set(df.status) <= set(STATUSES)


def test_a_process_that_dies_mid_call_costs_only_that_call(fake_ncu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_CRASH_MARKER", str(tmp_path / "crashed"))
    pending = [(CASE, b) for b in BACKENDS]
    measured = profile_pairs(pending, options(), fake_ncu, tmp_path / "work", log=lambda s: None)
    by_backend = {k[1]: m for k, m in measured.items()}
    assert by_backend["eager"].status == "ok"
    assert by_backend["sdpa-math"].status == "error"
    assert "died (exit 139) during this call" in by_backend["sdpa-math"].reason
    assert by_backend["sdpa-cudnn"].status == "unavailable" and by_backend["sdpa-cudnn"].reason == "drill"
    assert (tmp_path / "work" / "ncu-2" / "plan.json").is_file()


def test_counters_not_permitted_make_every_row_unavailable(fake_ncu, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_SKIP_APP", "1")
    monkeypatch.setenv("FAKE_NCU_LOG", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
                                       "NVIDIA GPU Performance Counters on the target device 0.\n")
    measured = profile_pairs([(CASE, b) for b in BACKENDS], options(), fake_ncu, tmp_path / "w", log=lambda s: None)
    assert {m.status for m in measured.values()} == {"unavailable"}
    assert all("ERR_NVGPUCTRPERM" in m.reason for m in measured.values())


def test_a_hung_profiler_is_killed_at_the_timeout(fake_ncu, tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("FAKE_NCU_HANG", "1")
    start = time.monotonic()
    measured = profile_pairs([(CASE, "eager")], options(timeout_s=1), fake_ncu, tmp_path / "w", log=lambda s: None)
    assert time.monotonic() - start < 60
    (m,) = measured.values()
    assert m.status == "error" and m.reason.startswith("ncu process timed out after 1 s")


def test_blockers_name_the_reason():
    assert measurement_blocker("cpu", NcuSettings())[1].startswith("no CUDA device")
    path, reason = measurement_blocker("cuda", NcuSettings(ncu="no-such-ncu-binary"))
    assert path is None and reason.startswith("no-such-ncu-binary not found on PATH")


CONFIG = {
    "sweep": "test", "device": "cpu", "stages": ["hbm"],
    "microbench": {"cpu": {"backends": ["eager"], "groups": {"g": {"seq": 64}}},
                   "cuda": {"backends": ["eager"], "groups": {"g": {"seq": 64}}}},
    "hbm": {"backends": ["eager", "sdpa-flash"],
            "groups": {"tiny": {"grids": [{"mode": "fwd", "batch": 2, "seq": 64, "causal": [False, True]},
                                          {"mode": "decode", "layout": "gqa", "heads_q": 8, "gqa_group": 4,
                                           "seq": 128}]},
                       "mla": {"backends": ["sdpa-math"], "mode": "decode", "layout": "mla", "heads_q": 4,
                               "mla_rank": 32, "mla_rope_dim": 8, "seq": 64}}},
}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    return path


def test_cli_on_cpu_writes_unavailable_rows_with_the_reason(config_file, tmp_path):
    import pandas as pd

    for group in ("tiny", "mla"):
        assert main(["hbm", "--config", str(config_file), "--group", group, "--out", str(tmp_path / f"{group}.parquet")]) == 0
    df = pd.concat([pd.read_parquet(tmp_path / f"{group}.parquet") for group in ("tiny", "mla")])
    assert len(df) == 3 * 2 + 1
    assert (df.status == "unavailable").all()
    assert df.reason.str.startswith("no CUDA device").all()
    assert df.bytes_measured.isna().all() and (df.bytes_model > 0).all() and (df.read_min > 0).all()
    assert set(df.model_family) == {"eager", "flash-style", "decode", "math"}
    assert set(df.group) == {"tiny", "mla"}


def test_cli_rejects_unknown_group_and_bad_hbm_keys(config_file, tmp_path, capsys):
    assert main(["hbm", "--config", str(config_file), "--group", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "attnbench: error: group='nope' is not a hbm group of sweep 'test' on cpu; allowed: tiny, mla"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**CONFIG, "hbm": {"cache_control": "sometimes"}}))
    assert main(["hbm", "--config", str(bad), "--group", "tiny", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == ("attnbench: error: hbm.cache_control='sometimes' is not allowed; "
                                               "allowed: all, none")
    bad.write_text(yaml.safe_dump({**CONFIG, "hbm": {"backends": ["fa9"]}}))
    assert main(["hbm", "--config", str(bad), "--group", "tiny", "--out", str(tmp_path / "x")]) == 2
    assert "hbm.backends: backend='fa9' is not known; allowed:" in capsys.readouterr().err
