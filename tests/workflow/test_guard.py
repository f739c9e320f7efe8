"""The job guard, the timing lease (GPU and CPU) and the rule-backend contract (no Snakemake run)."""
import os
import sys
import threading

import pandas as pd
import pytest

from attnbench import config as configs
from attnbench import plan as planner
from attnbench.bench.schema import validate_frame
from attnbench.workflow import guard, ingest, lease, resume

CONFIG = {
    "sweep": "unit", "device": "cpu", "stages": ["microbench"],
    "microbench": {
        "cpu": {"backends": ["eager", "sdpa-math"], "rule_backends": {"c-naive": ["g"]},
                "groups": {"g": {"mode": ["fwd", "decode"], "heads_q": 2, "head_dim": 16, "seq": 32,
                                 "dtype": ["fp32", "bf16"]}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"g": {"seq": 64}}},
    },
}


@pytest.fixture(scope="module")
def plan():
    return planner.build_plan(configs.validate_config(CONFIG), rule_backend_files=["c-naive"])


def test_guard_turns_a_crashed_job_into_error_rows(plan, tmp_path, capfd):
    out = tmp_path / "rows.parquet"
    crash = [sys.executable, "-c", "import sys; print('boom: kernel fault', file=sys.stderr); import os; os.abort()"]
    job = plan.job("microbench", "g").payload
    assert guard.guard(crash, job=job, backends=["eager"], out=str(out)) == 0
    df = pd.read_parquet(out)
    assert len(df) == 4 and set(df["status"]) == {"error"} and set(df["backend"]) == {"eager"}
    assert df["reason"].str.contains("job killed by SIGABRT before this case finished: boom: kernel fault").all()
    validate_frame(df, str(out))
    assert "boom: kernel fault" in capfd.readouterr().err  # the child's stderr still reaches the log


def test_guard_keeps_the_rows_of_a_stopped_job_and_fills_in_the_rest(plan, tmp_path):
    out = tmp_path / "rows.parquet"
    job = plan.job("microbench", "g").payload
    guard.error_rows(job, ["eager"], "").iloc[:1].assign(status="ok").to_parquet(tmp_path / "one.parquet")
    partial = [sys.executable, "-c", "import shutil, sys; "
               f"shutil.copy({str(tmp_path / 'one.parquet')!r}, {str(out)!r}); sys.exit(3)"]
    assert guard.guard(partial, job=job, backends=["eager"], out=str(out)) == 0
    df = pd.read_parquet(out)
    assert df["status"].tolist() == ["ok", "error", "error", "error"] and df["case_id"].is_unique
    assert df["reason"].iloc[1] == "job exited with code 3 before this case finished (retried on the next run)"


def test_a_job_stopped_after_its_last_row_is_complete(plan, tmp_path, capfd):
    """Every pair has its row: no marker, so the next parse does not reopen the job (a stability process stopped at
    the deadline while it exited left one beside committed reference rows)."""
    out = tmp_path / "rows.parquet"
    job = plan.job("microbench", "g").payload
    guard.error_rows(job, ["eager"], "").assign(status="ok").to_parquet(tmp_path / "all.parquet")
    late_exit = [sys.executable, "-c", "import shutil, sys; "
                 f"shutil.copy({str(tmp_path / 'all.parquet')!r}, {str(out)!r}); sys.exit(3)"]
    assert guard.guard(late_exit, job=job, backends=["eager"], out=str(out)) == 0
    assert pd.read_parquet(out)["status"].tolist() == ["ok"] * 4
    assert not resume.marker_path(str(out)).exists()
    assert f"job exited with code 3 after its last row; {out} is complete with its 4 rows" in capfd.readouterr().err


def test_guard_keeps_a_finished_job_and_honours_the_deadline(plan, tmp_path, monkeypatch):
    out = tmp_path / "rows.parquet"
    job = plan.job("microbench", "g").payload
    write = [sys.executable, "-c", f"import pandas as pd; pd.DataFrame({{'x': [1]}}).to_parquet({str(out)!r})"]
    assert guard.guard(write, job=job, backends=job["backends"], out=str(out)) == 0
    assert list(pd.read_parquet(out).columns) == ["x"]
    monkeypatch.setenv(guard.DEADLINE_ENV, "1")
    late = tmp_path / "late.parquet"
    assert guard.guard(["false"], job=job, backends=job["backends"], out=str(late)) == 0
    df = pd.read_parquet(late)
    assert set(df["backend"]) == {"eager", "sdpa-math"} and df["reason"].str.startswith("not run: the sweep deadline").all()


def test_gpu_leases_are_exclusive_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    first = lease.try_lease(lease.visible_devices())
    second = lease.try_lease(lease.visible_devices())
    assert (first[0], second[0]) == ("3", "5")
    assert lease.try_lease(lease.visible_devices()) is None  # both taken: a third job waits
    first[1].close()  # closing the lock file releases the device
    third = lease.try_lease(lease.visible_devices())
    assert third[0] == "3"
    second[1].close(), third[1].close()


def test_multi_gpu_leases_take_all_or_none(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    pair = lease.try_lease_many(lease.visible_devices(), 2)
    assert [d for d, _ in pair] == ["0", "1"]
    assert lease.try_lease_many(lease.visible_devices(), 3) is None  # two free of four: none taken
    other = lease.try_lease_many(lease.visible_devices(), 2)
    assert [d for d, _ in other] == ["2", "3"]
    lease._release(h for _, h in pair + other)
    with pytest.raises(RuntimeError, match="a lease of 8 GPUs was asked for; this host shows 4"):
        with lease.gpu_lease(count=8):
            pass


def test_lease_command_sets_cuda_visible_devices(tmp_path, monkeypatch):
    from attnbench.cli import main

    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    out = tmp_path / "seen.txt"
    code = main(["lease", "--device", "cuda", "--", sys.executable, "-c",
                 f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' "
                 "+ os.environ['ATTNBENCH_LEASE'])"])
    assert code == 0 and out.read_text() == "7 cuda:7" and os.environ["CUDA_VISIBLE_DEVICES"] == "7"
    assert "ATTNBENCH_LEASE" not in os.environ  # the child's record of its lease, not this process's


def test_lease_command_takes_n_gpus_together_or_refuses(tmp_path, monkeypatch):
    from attnbench.cli import main

    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,6")
    out = tmp_path / "seen.txt"
    write = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['ATTNBENCH_LEASE'])"
    assert main(["lease", "--device", "cuda", "--gpus", "2", "--", sys.executable, "-c", write]) == 0
    assert out.read_text() == "2,5 cuda:2,5"
    with lease.gpu_lease(count=2):  # 2 and 5 held by another job: a lease of 2 cannot take 6 alone
        assert lease.try_lease_many(lease.visible_devices(), 2) is None
        alone = lease.try_lease(lease.visible_devices())  # a one-GPU job still gets the free one
        assert alone[0] == "6"
        alone[1].close()
    allowed = "allowed: 1, or 1 to 64 with --device cuda"
    with pytest.raises(SystemExit, match=f"--gpus=2 is not allowed with --device cpu; {allowed}"):
        main(["lease", "--device", "cpu", "--gpus", "2", "--", "true"])


@pytest.mark.parametrize("gpus", ["0", "two", "1.5", "65"])
def test_lease_refuses_a_gpu_count_outside_its_range_naming_the_range(gpus, capsys):
    from attnbench.cli import main

    with pytest.raises(SystemExit):
        main(["lease", "--device", "cuda", "--gpus", gpus, "--", "true"])
    assert f"{gpus!r} is not allowed; allowed: a whole number from 1 to 64" in capsys.readouterr().err


def _leased_env(tmp_path, *args):
    """Run `attnbench lease ARGS -- python` that writes the ATTNBENCH_LEASE it got; return (exit code, value)."""
    from attnbench.cli import main

    out = tmp_path / "lease.txt"
    code = main(["lease", *args, "--", sys.executable, "-c",
                 f"import os; open({str(out)!r}, 'w').write(os.environ.get('ATTNBENCH_LEASE', '-'))"])
    return code, out.read_text()


def test_cpu_timing_jobs_wait_for_each_other_and_say_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    said, acquired = [], threading.Event()

    def second_job():
        with lease.cpu_lock(poll_s=0.02, notify=said.append):
            acquired.set()

    with lease.cpu_lock(notify=said.append):  # a timing job of another sweep holds the machine
        waiter = threading.Thread(target=second_job)
        waiter.start()
        assert not acquired.wait(0.3)
        assert len(said) == 1 and said[0].startswith("attnbench lease: waiting for the CPU timing lock")
        assert f"pid {os.getpid()}" in said[0] and "\n" not in said[0]  # who holds it
    assert acquired.wait(5)
    waiter.join()


def test_the_leased_command_knows_it_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    assert _leased_env(tmp_path, "--device", "cpu") == (0, "cpu")
    with lease.cpu_lock():  # the lock is taken: an untimed job does not wait, a nested lease neither
        assert _leased_env(tmp_path, "--device", "cpu", "--untimed") == (0, "-")
        monkeypatch.setenv("ATTNBENCH_LEASE", "cpu")
        assert _leased_env(tmp_path, "--device", "cpu") == (0, "cpu")


def test_a_gpu_lease_waits_naming_the_holders(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    said, got = [], []

    def second_job():
        with lease.gpu_lease(poll_s=0.02, notify=said.append) as device:
            got.append(device)

    with lease.gpu_lease(notify=said.append):
        waiter = threading.Thread(target=second_job)
        waiter.start()
        waiter.join(0.3)
        assert not got and said == [f"attnbench lease: waiting for a free GPU among 0 (GPU 0: pid {os.getpid()}: "
                                    f"{' '.join(sys.argv)[:300]})"]
    waiter.join(5)
    assert got == ["0"]


def test_rule_backend_contract(plan, tmp_path):
    job = plan.job("microbench-rule", "c-naive/g").payload
    cases = tmp_path / "cases.tsv"
    assert ingest.write_cases(job, cases) == 4
    table = pd.read_csv(cases, sep="\t", dtype={"case_id": str})
    assert list(table.columns) == list(ingest.CASE_COLUMNS) and set(table["causal"]) == {0}
    fwd32 = table[(table["mode"] == "fwd") & (table["dtype"] == "fp32")]["case_id"].iloc[0]
    dec = table[table["mode"] == "decode"]["case_id"].iloc[0]
    timings = tmp_path / "timings.tsv"
    timings.write_text("case_id\tstatus\tms_median\tms_p20\tms_p80\tn_reps\tms_ci_low\tms_ci_high\trel_err\t"
                       "max_abs_err\treason\n"
                       f"{fwd32}\tok\t2.0\t1.9\t2.2\t5\t1.95\t2.1\t1e-7\t2e-7\t\n"
                       f"{dec}\tunsupported\t\t\t\t\t\t\t\t\tfwd only\n")
    df = ingest.ingest(job, "c-naive", timings=str(timings), ceilings=None, version="cc 1", family="fused")
    validate_frame(df, "ingest")
    by_id = df.set_index("case_id")
    assert by_id.loc[fwd32, "status"] == "ok" and by_id.loc[fwd32, "tflops"] == pytest.approx(
        by_id.loc[fwd32, "flops"] / 2e-3 / 1e12)
    assert (by_id.loc[fwd32, "ms_ci_low"], by_id.loc[fwd32, "ms_ci_high"]) == (1.95, 2.1)  # its own interval
    assert by_id.loc[dec, "status"] == "unsupported" and by_id.loc[dec, "reason"] == "fwd only"
    assert (df["status"] == "error").sum() == 2  # the two cases the command printed nothing for
    down = ingest.ingest(job, "c-naive", timings=None, ceilings=None, version="", family="fused",
                         unavailable="no compiler")
    assert set(down["status"]) == {"unavailable"} and set(down["reason"]) == {"no compiler"}
    bad = tmp_path / "bad.tsv"
    bad.write_text("case_id\tstatus\tms_median\tms_p20\tms_p80\tn_reps\nx\tfast\t1\t1\t1\t1\n")
    with pytest.raises(Exception, match="status='fast' is not allowed; allowed: ok, unsupported, error"):
        ingest.read_timings(bad)
