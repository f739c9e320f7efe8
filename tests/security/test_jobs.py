"""Attacks on a job's results: one case sinking its group, kills and crashes losing finished rows, runaway
jobs, and a stopped guard leaving its child running (docs/security.md, "Job semantics")."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench.bench import microbench
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.case import Case
from attnbench.cli import main
from attnbench.plan import job_cases
from attnbench.workflow import guard, resume

from .conftest import CEILINGS, plan_of, with_

PYTHON = [sys.executable, "-c"]


def _job(**over):
    config = with_("microbench.cpu.groups", {"g": {"mode": "fwd", "heads_q": 2, "head_dim": 16,
                                                   "seq": [16, 24, 32, 40], "dtype": "fp32"}})
    for key, value in over.items():
        config = with_(key, value, config)
    return plan_of(config).job("microbench", "g").payload


def _pairs(df):
    return set(zip(df["case_id"], df["backend"]))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout_s: float = 20) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _wait_for(predicate, timeout_s: float = 120, what: str = "") -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


# ----------------------------------------------------------------------------------------------- one case, one row

def _huge(case: Case) -> Case:
    return Case(**{**case.fields(), "batch": 1 << 20, "seq_q": 1 << 16, "seq_kv": 1 << 16})  # exabytes of inputs


@pytest.mark.parametrize("failure, status", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB"), "oom"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 1099511627776 bytes"), "oom"),
    (ValueError("a generator that cannot draw this shape"), "error"),
])
def test_a_case_whose_inputs_cannot_be_drawn_is_its_rows_and_the_group_runs_on(monkeypatch, failure, status):
    cases = job_cases(_job())
    real = microbench.make_tensors

    def draw(case, *args, **kwargs):
        if case == cases[1]:
            raise failure
        return real(case, *args, **kwargs)

    monkeypatch.setattr(microbench, "make_tensors", draw)
    rows = run_group(cases, ["eager"], RunOptions(numerics=False, cpu_min_run_time_s=0.01), log=lambda s: None)
    assert [r["status"] for r in rows] == ["ok", status, "ok", "ok"]
    assert rows[1]["reason"].startswith("drawing the case's inputs: ")


def test_a_case_too_big_to_allocate_for_real_is_an_oom_row():
    case = job_cases(_job())[0]
    rows = run_group([_huge(case), case], ["eager"], RunOptions(numerics=False, cpu_min_run_time_s=0.01),
                     log=lambda s: None)
    assert [r["status"] for r in rows] == ["oom", "ok"] and "can't allocate memory" in rows[0]["reason"]


def test_the_hbm_profiler_keeps_profiling_after_a_case_it_cannot_allocate():
    from attnbench.hbm.profile import run_plan

    case = job_cases(_job())[0]
    events = []
    run_plan({"device": "cpu", "warmup_calls": 1, "seed": 0,
              "cases": [{"case": _huge(case).fields(), "backends": ["eager"]},
                        {"case": case.fields(), "backends": ["eager"]}]}, lambda **e: events.append(e))
    ends = [e["status"] for e in events if e["event"] == "end"]
    assert ends == ["oom", "ok"]


# ----------------------------------------------------------------------------------------------- stopped jobs

def _write_plan(tmp_path, job) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def test_a_microbench_job_stopped_by_sigterm_keeps_its_rows_and_writes_no_output(tmp_path, capsys):
    job = _job(**{"timing.cpu_min_run_time_s": 0.2})
    plan, out = _write_plan(tmp_path, job), tmp_path / "g.parquet"
    (tmp_path / "c.json").write_text(json.dumps(CEILINGS))
    side = resume.side_path(out)

    def stop_after_first_row():
        _wait_for(lambda: side.is_file(), what="the first row")
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=stop_after_first_row, daemon=True)
    stopper.start()
    try:
        code = main(["microbench", "--job", str(plan), "--ceilings", str(tmp_path / "c.json"), "--out", str(out)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 3 and not out.exists()
    kept = pd.read_parquet(side)
    assert 1 <= len(kept) < 8 and "the next run measures only the rest" in capsys.readouterr().err
    assert main(["microbench", "--job", str(plan), "--ceilings", str(tmp_path / "c.json"), "--out", str(out)]) == 0
    done = pd.read_parquet(out)
    assert len(done) == 8 and not side.exists()
    again = done.set_index(["case_id", "backend"]).loc[list(_pairs(kept)), "timestamp"]
    assert (again.sort_index() == kept.set_index(["case_id", "backend"])["timestamp"].sort_index()).all()


def _fake_side(out: Path, job: dict, backends: list[str], n: int) -> pd.DataFrame:
    rows = guard.status_rows(job, backends, "ok", "").iloc[:n]
    resume.write_side(rows, out, resume.fingerprint(job, backends))
    return rows


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A guarded job SIGKILLed (an OOM kill) after it streamed its first rows, then the next parse and run.

    The job that dies stands in for ``attnbench microbench`` (its side file is what that command streams,
    tests/security/test_locks.py kills a real one); the rerun is the real command."""
    tmp = tmp_path_factory.mktemp("killed")
    job = _job(**{"microbench.cpu.backends": ["eager"]})
    plan, out, ceilings = _write_plan(tmp, job), tmp / "results" / "sec" / "g.parquet", tmp / "c.json"
    ceilings.write_text(json.dumps(CEILINGS))
    out.parent.mkdir(parents=True)
    streamed = tmp / "streamed.parquet"
    _fake_side(streamed, job, ["eager"], 2)  # the two rows the job finished before it was killed
    dies = PYTHON + [f"import os, shutil; shutil.copy({str(resume.side_path(streamed))!r}, "
                     f"{str(resume.side_path(out))!r}); os.kill(os.getpid(), 9)"]
    assert guard.guard(dies, job=job, backends=["eager"], out=str(out)) == 0
    first = pd.read_parquet(out)
    marker = json.loads(resume.marker_path(out).read_text())
    kept = pd.read_parquet(resume.side_path(out))
    reopened = resume.reopen(tmp / "results", log=lambda s: None)
    after_reopen = (out.exists(), sorted(_pairs(pd.read_parquet(resume.side_path(out)))))
    assert main(["microbench", "--job", str(plan), "--ceilings", str(ceilings), "--out", str(out)]) == 0
    return {"job": job, "out": out, "first": first, "marker": marker, "kept": kept, "reopened": reopened,
            "after_reopen": after_reopen, "final": pd.read_parquet(out)}


def test_a_killed_job_keeps_every_finished_row_and_says_why_the_rest_is_missing(killed_run):
    first, kept = killed_run["first"], killed_run["kept"]
    assert len(first) == 4 and 1 <= len(kept) < 4
    assert set(first.loc[first["status"] == "ok", "case_id"]) == set(kept["case_id"])
    missing = first[first["status"] == "error"]
    assert len(missing) == 4 - len(kept)
    assert missing["reason"].str.startswith("job killed by SIGKILL before this case finished").all()
    assert missing["reason"].str.endswith(resume.RETRY_NOTE).all()
    assert _pairs(missing) == {tuple(p) for p in killed_run["marker"]["pairs"]}


def test_the_next_parse_reopens_a_killed_job_and_its_rerun_measures_only_the_rest(killed_run):
    out, kept, final = killed_run["out"], killed_run["kept"], killed_run["final"]
    assert killed_run["reopened"] == [out] and killed_run["after_reopen"] == (False, sorted(_pairs(kept)))
    assert len(final) == 4 and set(final["status"]) == {"ok"}
    assert final["n_reps"].iloc[:2].isna().all() and final["n_reps"].iloc[2:].notna().all()  # kept, then measured
    stamps = final.set_index(["case_id", "backend"])["timestamp"]
    assert (stamps.loc[list(_pairs(kept))].sort_index() == kept.set_index(["case_id", "backend"])["timestamp"]
            .sort_index()).all()  # the finished rows were not measured again
    assert not resume.marker_path(out).exists() and not resume.side_path(out).exists()


def test_a_runaway_job_becomes_timeout_rows_at_its_time_limit(tmp_path):
    job = {**_job(), "time_limit_s": 2}
    out = tmp_path / "g.parquet"
    _fake_side(out, job, ["eager"], 1)  # a row a previous run finished
    start = time.monotonic()
    assert guard.guard(PYTHON + ["import time; time.sleep(300)"], job=job, backends=["eager"], out=str(out)) == 0
    assert time.monotonic() - start < 30
    df = pd.read_parquet(out)
    assert df["status"].tolist() == ["ok", "timeout", "timeout", "timeout"]
    assert df["reason"].iloc[1].startswith("the job reached its time limit (job_time_limit_s=2 s)")
    assert not resume.marker_path(out).exists()  # final: the same job would run away again


def test_a_job_that_would_start_after_the_sweep_deadline_is_rows_retried_next_time(tmp_path, monkeypatch):
    monkeypatch.setenv(guard.DEADLINE_ENV, str(time.time() - 1))
    out = tmp_path / "results" / "g.parquet"
    for _ in range(3):  # the deadline is not the job's fault: retried however often it comes
        assert guard.guard(["false"], job=_job(), backends=["eager"], out=str(out)) == 0
        df = pd.read_parquet(out)
        assert df["reason"].str.startswith("not run: the sweep deadline").all()
        assert df["reason"].str.endswith(resume.RETRY_NOTE).all() and resume.read_marker(out)["final"] is False
        assert resume.reopen(tmp_path / "results", log=lambda s: None) == [out]


def test_a_job_that_crashes_again_without_progress_is_not_retried_forever(tmp_path):
    job, out = _job(), tmp_path / "results" / "g.parquet"
    crash = PYTHON + ["import os; os.abort()"]
    assert guard.guard(crash, job=job, backends=["eager"], out=str(out)) == 0
    assert resume.reopen(tmp_path / "results", log=lambda s: None) == [out]
    assert guard.guard(crash, job=job, backends=["eager"], out=str(out)) == 0
    df = pd.read_parquet(out)
    assert df["reason"].str.contains("not retried: the job crashed 2 times in a row without finishing").all()
    assert resume.reopen(tmp_path / "results", log=lambda s: None) == [] and out.exists()


def test_the_side_file_of_another_plan_is_set_aside_not_mixed_in(tmp_path):
    job, out = _job(), tmp_path / "g.parquet"
    _fake_side(out, _job(seed=7), ["eager"], 2)  # other options: other rows
    side = resume.SideFile(out, job, ["eager"])
    assert side.kept is None and not resume.side_path(out).exists()
    assert Path(f"{resume.side_path(out)}.stale").is_file()


def test_nothing_is_reopened_while_another_snakemake_holds_the_folder(tmp_path):
    job, out = _job(), tmp_path / "results" / "g.parquet"
    assert guard.guard(["false"], job=job, backends=["eager"], out=str(out)) == 0
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").write_text("results/g.parquet\n")
    assert resume.reopen(tmp_path / "results", log=lambda s: None, workdir=tmp_path) == [] and out.exists()
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").unlink()
    assert resume.reopen(tmp_path / "results", log=lambda s: None, workdir=tmp_path) == [out] and not out.exists()


# ----------------------------------------------------------------------------------------------- no orphans

_SPAWNER = ("import os, subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); "
            "open(sys.argv[1], 'w').write(f'{os.getpid()} {p.pid}'); time.sleep(300)")


def _guarded_spawner(tmp_path):
    """The guard (attnbench guard's own function, in a process of its own) running a job that starts a child."""
    pids = tmp_path / "pids"
    plan = _write_plan(tmp_path, _job())
    run = ("import json, sys; from attnbench.workflow.guard import guard; "
           "sys.exit(guard(sys.argv[3:], job=json.load(open(sys.argv[1])), backends=['eager'], out=sys.argv[2]))")
    cmd = [sys.executable, "-c", run, str(plan), str(tmp_path / "o.parquet"), sys.executable, "-c", _SPAWNER, str(pids)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: pids.is_file() and pids.read_text(), what="the job's processes")
    child, grandchild = map(int, pids.read_text().split())
    return proc, child, grandchild


def test_stopping_the_guard_stops_its_job_and_everything_the_job_started(tmp_path):
    proc, child, grandchild = _guarded_spawner(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "left" in err and "unwritten" in err
    assert _wait_gone(child) and _wait_gone(grandchild)
    assert not (tmp_path / "o.parquet").exists()


def test_a_guard_killed_with_sigkill_takes_its_job_with_it(tmp_path):
    proc, child, grandchild = _guarded_spawner(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert _wait_gone(child)  # the parent-death signal reaches the job
    os.kill(grandchild, signal.SIGKILL)  # the job's own children are the job's to stop (attnbench commands do)


def test_stopping_a_gpu_lease_stops_the_job_it_runs(tmp_path):
    pids = tmp_path / "pids"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "ATTNBENCH_LOCK_DIR": str(tmp_path / "locks")}
    proc = subprocess.Popen([sys.executable, "-m", "attnbench.cli", "lease", "--", sys.executable, "-c", _SPAWNER,
                             str(pids)], env=env, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: pids.is_file() and pids.read_text(), what="the leased job")
    child, grandchild = map(int, pids.read_text().split())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and _wait_gone(child) and _wait_gone(grandchild)
