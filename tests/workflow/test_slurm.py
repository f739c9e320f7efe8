"""The workflow through Snakemake's SLURM executor (profiles/slurm) on a real one-node cluster with two fake GPUs
(.ci/slurm-cluster.sh; .ci/run starts it and sets ATTNBENCH_SLURM=1): the smoke sweep to its rendered report,
the GPU path (each gpu=1 job gets its own device from SLURM, at most as many at once as the cluster has), and
failures (a crashed job, a job past its time limit, a cancelled sweep), each of which must leave the same rows
and the same resumable state as the same run on the local executor.

The crash is an outside kill (SIGKILL, as the OOM killer sends it) of the job's `attnbench microbench` process,
found by its working folder, the same way under both executors: the job machinery is what is under test.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnbench.report.stages import SECTIONS
from attnbench.workflow import resources, resume
from tests.security.conftest import CEILINGS, CONFIG

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "slurm"
CLUSTER_GPUS = int(os.environ.get("ATTNBENCH_FAKE_GPUS", "2"))

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.environ.get("ATTNBENCH_SLURM") != "1" or shutil.which("sbatch") is None,
                       reason="needs a running SLURM cluster: sudo bash .ci/slurm-cluster.sh start, then "
                              "ATTNBENCH_SLURM=1 (what .ci/run does)"),
]


def _command(workdir: Path, *args: str, slurm: bool, snakefile: Path = REPO / "Snakefile") -> list[str]:
    executor = ["--profile", str(PROFILE)] if slurm else ["--cores", "2"]
    return ["snakemake", "-s", str(snakefile), "--directory", str(workdir), *executor, *args]


def _start(cmd: list[str], workdir: Path) -> subprocess.Popen:
    """Snakemake in a process group of its own, as a terminal starts it (Ctrl-C reaches the whole group), with
    SIGINT at its default (a test run started in the background, `cmd &`, would pass on an ignored SIGINT)."""
    return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _run(cmd: list[str], workdir: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = _start(cmd, workdir)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def _squeue(*fields: str) -> list[list[str]]:
    """This user's jobs, finished ones too (MinJobAge keeps them): one list of fields per job."""
    out = subprocess.run(["squeue", "--states=all", "-h", "-O", ",".join(f"{f}:|" for f in fields)],
                         capture_output=True, text=True, check=True).stdout
    return [[v.strip() for v in line.split("|")[:-1]] for line in out.splitlines() if line.strip()]


def _submitted(log: str) -> set[str]:
    """The SLURM job ids a Snakemake run's log says it submitted."""
    return set(re.findall(r"has been submitted with SLURM jobid (\d+)", log))


def _slurm_time(minutes: int) -> str:
    """A time limit as squeue prints it."""
    return f"{minutes // 60}:{minutes % 60:02d}:00" if minutes >= 60 else f"{minutes}:00"


def _requests(log: str, rule: str) -> set[tuple[str, str, str]]:
    """(memory, time limit, whether it shares its node) of every job of ``rule`` the run that wrote ``log`` submitted."""
    ours = _submitted(log)
    return {(memory, limit, shared) for job, note, memory, limit, shared in
            _squeue("JobID", "Comment", "MinMemory", "TimeLimit", "OverSubscribe")
            if job in ours and (note == f"rule_{rule}" or note.startswith(f"rule_{rule}_wildcards_"))}


def _active_jobs(comment: str) -> list[str]:
    return [job for job, state, note in _squeue("JobID", "State", "Comment")
            if comment in note and state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")]


# ----------------------------------------------------------------------------------------------- the smoke sweep

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm-smoke")
    shutil.copy(REPO / "config" / "sweeps" / "smoke.yaml", workdir / "smoke.yaml")
    start = time.monotonic()
    proc = _run(_command(workdir, "--configfile", "smoke.yaml", slurm=True), workdir, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return workdir, proc.stdout, time.monotonic() - start


def test_the_smoke_sweep_renders_its_report_through_slurm(smoke):
    workdir, log, seconds = smoke
    page = (workdir / "reports" / "smoke" / "report.html").read_text()
    headings = [re.sub(r"<[^>]+>", "", h).rstrip("¶").strip() for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page, re.S)]
    assert [h.replace("&amp;", "&") for h in headings] == [s.title for s in SECTIONS]
    assert "Traceback" not in page
    print(f"smoke sweep through SLURM: {seconds:.0f} s")  # the time config/README.md quotes comes from a run like this


def test_every_job_of_the_smoke_sweep_was_a_slurm_job(smoke):
    workdir, log, _ = smoke
    stats = log.split("Job stats:")[1].split("total")[0]
    rules = {line.split()[0] for line in stats.splitlines()[3:] if line.strip()} - {"all"}
    assert {"microbench", "stability", "pretrain_experiment", "context_parallel", "report"} <= rules
    logs = workdir / ".snakemake" / "slurm_logs"
    assert {p.name.removeprefix("rule_") for p in logs.iterdir()} == rules
    for rule in rules:
        assert list((logs / f"rule_{rule}").rglob("*.log")), rule


def test_smoke_rows_record_their_host_and_device(smoke):
    workdir, _, _ = smoke
    rows = pd.read_parquet(workdir / "results" / "smoke" / "microbench.parquet")
    assert (rows["host"] == socket.gethostname()).all()  # the one node of this cluster
    assert (rows["device"] == "cpu").all() and (rows["gpu"] == "").all()  # fake GPUs: the CPU grid
    measured = rows[rows["status"] == "ok"]
    assert len(measured) and measured["timing_lock"].all()


def test_slurm_was_asked_for_what_resources_py_decides(smoke):
    _, log, _ = smoke
    timing, light = resources.KINDS["timing"], resources.KINDS["light"]
    # a CPU timing job has its node to itself (OverSubscribe=NO: --exclusive), a tables job shares it
    assert _requests(log, "microbench") == {(f"{timing.cpu_mem_mb}M", _slurm_time(timing.runtime_min), "NO")}
    assert _requests(log, "report") == {(f"{light.cpu_mem_mb}M", _slurm_time(light.runtime_min), "OK")}


# ----------------------------------------------------------------------------------------------- the GPU path

def test_gpu_jobs_get_their_own_device_from_slurm_and_no_more_run_than_there_are_gpus(tmp_path):
    jobs = 3 * CLUSTER_GPUS
    proc = _run(_command(tmp_path, "--config", f"jobs={jobs}", "hold_s=6", "--set-threads", "hold_gpu=1",
                         "--set-resources", "hold_gpu:mem_mb=500", slurm=True,
                         snakefile=REPO / "tests" / "workflow" / "slurm_gpu.smk"), tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    seen = [json.loads((tmp_path / "seen" / f"{i}.json").read_text()) for i in range(jobs)]
    assert len({s["SLURM_JOB_ID"] for s in seen}) == jobs  # every one its own SLURM job
    devices = [str(i) for i in range(CLUSTER_GPUS)]
    for s in seen:
        assert s["CUDA_VISIBLE_DEVICES"] in devices and s["ATTNBENCH_LEASE"] == f"cuda:{s['CUDA_VISIBLE_DEVICES']}"
        assert s["CUDA_VISIBLE_DEVICES"] == (s["SLURM_STEP_GPUS"] or s["SLURM_JOB_GPUS"])  # as SLURM assigned it
    most = 0
    for s in seen:  # at each job's start: the jobs running then
        running = [o for o in seen if o["start"] <= s["start"] < o["end"]]
        most = max(most, len(running))
        held = [o["CUDA_VISIBLE_DEVICES"] for o in running]
        assert len(held) == len(set(held)), running  # never two jobs on one device at once
    assert most <= CLUSTER_GPUS
    assert most == CLUSTER_GPUS  # they did run side by side: the check above is not vacuous


# ----------------------------------------------------------------------------------------------- failures

GRID = {"mode": "fwd", "heads_q": 2, "head_dim": 16, "dtype": "fp32"}
SLOW = "results/{sweep}/microbench/slow.parquet"


def _sweep(workdir: Path, sweep: str, **top) -> str:
    """A microbench-only sweep of one slow group (eight cases, one backend) in ``workdir``; its output path."""
    config = {**CONFIG, "sweep": sweep, "timing": {"cpu_min_run_time_s": 0.3},
              "pretrain": {"select": {"experiments": ["fp8"]}},  # every section is planned at each parse
              "microbench": {**CONFIG["microbench"], "cpu": {"backends": ["eager"], "groups": {
                  "slow": {**GRID, "seq": [16, 24, 32, 40, 48, 56, 64, 72]}}}}, **top}
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    ceilings = workdir / "results" / sweep / "env" / "ceilings.json"  # measured once per host; not the point here
    ceilings.parent.mkdir(parents=True)
    ceilings.write_text(json.dumps(CEILINGS))
    return SLOW.format(sweep=sweep)


def _wait_for_rows(proc: subprocess.Popen, out: Path, n: int = 1, timeout_s: float = 300) -> None:
    side = resume.side_path(out)
    end = time.monotonic() + timeout_s
    while not (side.is_file() and len(pd.read_parquet(side)) >= n):
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        assert time.monotonic() < end, "no finished row in time"
        time.sleep(0.2)


def _microbench_pid(workdir: Path) -> int:
    """The `attnbench microbench` process working in ``workdir`` (the guard's child, under either executor)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (len(argv) > 2 and argv[1].endswith(b"attnbench") and argv[2] == b"microbench"
                    and (proc / "cwd").resolve() == workdir.resolve()):
                return int(proc.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no attnbench microbench process in {workdir}")


def _stamps(df: pd.DataFrame) -> pd.Series:
    return df.set_index(["case_id", "backend"])["timestamp"].sort_index()


def _crashed(workdir: Path, slurm: bool) -> dict:
    """A sweep whose job is killed after its first rows, then the next run: what each left."""
    out = workdir / _sweep(workdir, "crash")
    cmd = _command(workdir, str(out.relative_to(workdir)), "--configfile", "c.yaml", slurm=slurm)
    proc = _start(cmd, workdir)
    _wait_for_rows(proc, out)
    os.kill(_microbench_pid(workdir), signal.SIGKILL)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-4000:]  # the guard turned the crash into rows: the sweep goes on
    first = pd.read_parquet(out)
    marker = resume.read_marker(out)
    kept = first[first["status"] == "ok"]
    rerun = _run(cmd, workdir)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    final = pd.read_parquet(out)
    return {"statuses": sorted(set(first["status"])),
            "reasons": sorted({r.split(" before this case finished")[0] for r in first.loc[first.status == "error", "reason"]}),
            "retried": first.loc[first.status == "error", "reason"].str.endswith(resume.RETRY_NOTE).all(),
            "marker": (marker["final"], sorted(map(tuple, marker["pairs"])) == sorted(
                zip(first.loc[first.status == "error", "case_id"], first.loc[first.status == "error", "backend"]))),
            "pairs": len(first), "reopened": "was interrupted" in rerun.stdout,
            "final": sorted(set(final["status"])), "kept_unchanged": bool((_stamps(final).loc[_stamps(kept).index]
                                                                           == _stamps(kept)).all()),
            "no_marker_after": not resume.marker_path(out).exists() and not resume.side_path(out).exists()}


def test_a_crashed_job_leaves_the_same_rows_and_resumes_the_same_way_under_slurm(tmp_path):
    (tmp_path / "local").mkdir(), (tmp_path / "slurm").mkdir()
    local, cluster = _crashed(tmp_path / "local", slurm=False), _crashed(tmp_path / "slurm", slurm=True)
    assert local == cluster
    assert local["statuses"] == ["error", "ok"] and local["reasons"] == ["job killed by SIGKILL"]
    assert local["retried"] and local["marker"] == (False, True) and local["pairs"] == 8
    assert local["reopened"] and local["final"] == ["ok"] and local["kept_unchanged"] and local["no_marker_after"]


def _timed_out(workdir: Path, slurm: bool) -> dict:
    limit_s = 6
    out = workdir / _sweep(workdir, "limit", job_time_limit_s=limit_s)
    cmd = _command(workdir, str(out.relative_to(workdir)), "--configfile", "c.yaml", slurm=slurm)
    proc = _run(cmd, workdir)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = pd.read_parquet(out)
    again = _run([*cmd, "--dry-run"], workdir)
    limits = {limit for _, limit, _ in _requests(proc.stdout, "microbench")} if slurm else None
    return {"statuses": set(rows["status"]) - {"ok"}, "pairs": len(rows), "limits": limits,
            "reasons": set(rows.loc[rows.status == "timeout", "reason"]),
            "final": not resume.marker_path(out).exists() and "Nothing to be done" in again.stdout}


def test_a_job_past_its_time_limit_is_timeout_rows_under_slurm_as_locally(tmp_path):
    (tmp_path / "local").mkdir(), (tmp_path / "slurm").mkdir()
    local, cluster = _timed_out(tmp_path / "local", slurm=False), _timed_out(tmp_path / "slurm", slurm=True)
    # SLURM's limit sits above the sweep's, so the guard's fires first, as on a local host
    assert cluster.pop("limits") == {_slurm_time(resources.runtime_min(resources.KINDS["timing"], 6))}
    assert local.pop("limits") is None and local == cluster
    assert local["statuses"] == {"timeout"} and local["pairs"] == 8 and local["final"]
    assert local["reasons"] == {"the job reached its time limit (job_time_limit_s=6 s) before this case finished"}


def _cancelled(workdir: Path, slurm: bool) -> dict:
    out = workdir / _sweep(workdir, "cancel")
    cmd = _command(workdir, str(out.relative_to(workdir)), "--configfile", "c.yaml", slurm=slurm)
    proc = _start(cmd, workdir)
    _wait_for_rows(proc, out)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: Snakemake and its local jobs; under SLURM it cancels its jobs
    log, _ = proc.communicate(timeout=300)
    end = time.monotonic() + 60  # SLURM's jobs end after their signals (KillWait)
    while _active_jobs("rule_microbench_") and time.monotonic() < end:
        time.sleep(0.5)
    left = {"active": _active_jobs("rule_microbench_"), "output": out.exists()}
    kept = pd.read_parquet(resume.side_path(out))
    rerun = _run(cmd, workdir)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    final = pd.read_parquet(out)
    return {"stopped": proc.returncode != 0, **left, "kept_some": 1 <= len(kept) < 8,
            "final": sorted(set(final["status"])), "pairs": len(final),
            "kept_unchanged": bool((_stamps(final).loc[_stamps(kept).index] == _stamps(kept)).all())}


def test_a_cancelled_sweep_keeps_its_finished_rows_and_resumes_under_slurm_as_locally(tmp_path):
    (tmp_path / "local").mkdir(), (tmp_path / "slurm").mkdir()
    local, cluster = _cancelled(tmp_path / "local", slurm=False), _cancelled(tmp_path / "slurm", slurm=True)
    assert local == cluster
    assert local == {"stopped": True, "active": [], "output": False, "kept_some": True, "final": ["ok"], "pairs": 8,
                     "kept_unchanged": True}


def test_a_job_slurm_stops_at_its_own_limit_keeps_its_rows_and_the_next_run_measures_the_rest(tmp_path):
    """A SLURM time limit under the job's need (here one minute, by --set-resources): SLURM stops the job as a
    local scheduler's SIGTERM would, so the guard leaves no output and the side file keeps the finished rows."""
    out = tmp_path / _sweep(tmp_path, "slurmlimit", timing={"cpu_min_run_time_s": 5})  # 8 cases x 3 rounds x 5 s
    cmd = _command(tmp_path, str(out.relative_to(tmp_path)), "--configfile", "c.yaml", slurm=True)
    cut = _run([*cmd, "--set-resources", "microbench:runtime=1"], tmp_path)
    assert cut.returncode != 0 and "TIMEOUT" in cut.stdout, cut.stdout[-4000:]
    assert not out.exists()
    kept = pd.read_parquet(resume.side_path(out))
    assert 1 <= len(kept) < 8
    rerun = _run(cmd, tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    final = pd.read_parquet(out)
    assert len(final) == 8 and set(final["status"]) == {"ok"}
    assert (_stamps(final).loc[_stamps(kept).index] == _stamps(kept)).all()  # not measured again
