"""Orphans and locks, for real: Snakemake killed with SIGKILL in the middle of a job (docs/security.md).

Before: the job ran on as an orphan beside the next run's job; the lock went stale; after
``snakemake --unlock`` a finished output was measured again. Now the job stops with Snakemake (its
command is Snakemake's own child, with the parent-death signal), the stale lock is Snakemake's to
clear, and the next run keeps every output and row that was finished."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnbench.workflow import resume

from .conftest import CEILINGS, CONFIG, REPO

needs_snakemake = pytest.mark.skipif(shutil.which("snakemake") is None or shutil.which("attnbench") is None,
                                     reason="needs the snakemake and attnbench commands")
GRID = {"mode": "fwd", "heads_q": 2, "head_dim": 16, "dtype": "fp32"}


def _snakemake(work: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(["snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work), *args, "--cores",
                             "1", "--configfile", "c.yaml"], cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _run(work: Path, *args: str) -> subprocess.CompletedProcess:
    proc = _snakemake(work, *args)
    out, _ = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def _descendants(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            out += [int(child), *_descendants(int(child))]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@needs_snakemake
def test_killing_snakemake_stops_its_jobs_and_the_next_run_keeps_what_was_finished(tmp_path):
    config = {**CONFIG, "sweep": "lock", "timing": {"cpu_min_run_time_s": 0.25},
              "pretrain": {"select": {"experiments": ["fp8"]}},  # every section is planned at each parse: keep it small
              "microbench": {**CONFIG["microbench"], "cpu": {"backends": ["eager"], "groups": {
                  "fast": {**GRID, "seq": 8}, "slow": {**GRID, "seq": [16, 24, 32, 40, 48, 56]}}}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    ceilings = tmp_path / "results" / "lock" / "env" / "ceilings.json"  # measured once per host; not the point here
    ceilings.parent.mkdir(parents=True)
    ceilings.write_text(json.dumps(CEILINGS))
    fast, slow = (f"results/lock/microbench/{g}.parquet" for g in ("fast", "slow"))

    proc = _snakemake(tmp_path, fast, slow, "--prioritize", fast, start_new_session=True)  # fast first, then slow
    side = resume.side_path(tmp_path / slow)
    deadline = time.monotonic() + 300
    while not (side.is_file() and len(pd.read_parquet(side)) >= 1):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()[-3000:] if proc.poll() else ""
        time.sleep(0.2)
    assert (tmp_path / fast).is_file()
    fast_mtime = (tmp_path / fast).stat().st_mtime_ns
    jobs = _descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # Snakemake alone: its jobs get no signal from it
    proc.communicate(timeout=60)
    end = time.monotonic() + 60
    while any(_alive(pid) for pid in jobs) and time.monotonic() < end:
        time.sleep(0.2)
    assert not [pid for pid in jobs if _alive(pid)], "a job outlived the Snakemake that started it"
    assert not (tmp_path / slow).exists()  # no orphan wrote it after Snakemake was gone
    kept = pd.read_parquet(side)
    assert 1 <= len(kept) < 6

    assert list((tmp_path / ".snakemake" / "locks").iterdir())  # the stale lock: the next run is refused until
    unlock = _run(tmp_path, "--unlock")                          # `snakemake --unlock`
    assert unlock.returncode == 0 and not resume.snakemake_running(tmp_path), unlock.stdout[-2000:]

    rerun = _run(tmp_path, fast, slow)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert (tmp_path / fast).stat().st_mtime_ns == fast_mtime  # the finished output was not built again
    final = pd.read_parquet(tmp_path / slow)
    assert len(final) == 6 and set(final["status"]) == {"ok"} and not side.exists()
    stamps = final.set_index(["case_id", "backend"])["timestamp"]
    before = kept.set_index(["case_id", "backend"])["timestamp"]
    assert (stamps.loc[before.index] == before).all()  # the rows finished before the kill were not measured again
