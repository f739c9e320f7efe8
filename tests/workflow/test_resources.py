"""What jobs ask a scheduler for (attnbench.workflow.resources) and how a GPU job under SLURM takes the devices
SLURM assigned it (attnbench.workflow.lease.scheduler_devices), without a cluster."""
import re
import sys
from pathlib import Path

import pytest

from attnbench.workflow import lease, resources

REPO = Path(__file__).resolve().parents[2]
NO_SLURM = {}


def test_gpu_jobs_ask_for_their_gpus_and_cpu_jobs_for_cpus_only():
    gpu = resources.resources("timing", on_gpu=True, slurm=NO_SLURM)
    assert gpu["gpu"] == 1 and "slurm_extra" not in gpu
    assert resources.resources("timing", on_gpu=True, slurm=NO_SLURM, gpus=4)["gpu"] == 4
    for kind in resources.KINDS:
        cpu = resources.resources(kind, on_gpu=False, slurm=NO_SLURM)
        assert "gpu" not in cpu and cpu["runtime"] > 0 and cpu["mem_mb"] > 0, kind
    assert "gpu" not in resources.resources("light", on_gpu=True, slurm=NO_SLURM)  # tables never hold a GPU
    # a CPU timing job has its node to itself; the others share it
    assert resources.resources("timing", on_gpu=False, slurm=NO_SLURM)["slurm_extra"] == resources.CPU_EXCLUSIVE
    assert "slurm_extra" not in resources.resources("untimed", on_gpu=False, slurm=NO_SLURM)


def test_threads_follow_the_kind_and_the_cores_known_here():
    assert resources.threads("timing", on_gpu=False, cores=16) == 16  # the whole machine
    assert resources.threads("timing", on_gpu=False, cores=None) == 1  # a cluster node's CPUs come with --exclusive
    assert resources.threads("timing", on_gpu=True, cores=16) == resources.GPU_JOB_THREADS
    assert resources.threads("timing", on_gpu=True, cores=2) == 2
    assert resources.threads("untimed", on_gpu=False, cores=16) == 1
    assert resources.threads("compile", on_gpu=True, cores=16) == 16
    assert resources.threads("light", on_gpu=True, cores=16) == 1
    with pytest.raises(ValueError, match="job kind 'huge' is not known; allowed: timing, untimed, compile, light"):
        resources.threads("huge", on_gpu=False, cores=1)


def test_the_slurm_limit_sits_above_the_sweeps_own_so_the_guard_fires_first():
    timing = resources.KINDS["timing"]
    assert resources.resources("timing", on_gpu=False, slurm=NO_SLURM)["runtime"] == timing.runtime_min
    for limit_s in (1, 59, 60, 61, 3600, 7 * 24 * 3600):
        minutes = resources.resources("timing", on_gpu=True, slurm=NO_SLURM, time_limit_s=limit_s)["runtime"]
        assert minutes * 60 >= limit_s + resources.GRACE_MIN * 60


def test_partition_and_account_come_from_the_config():
    got = resources.resources("light", on_gpu=False, slurm={"partition": "gpu-h200", "account": "lab"})
    assert (got["slurm_partition"], got["slurm_account"]) == ("gpu-h200", "lab")
    assert not {"slurm_partition", "slurm_account"} & set(
        resources.resources("light", on_gpu=False, slurm={"partition": None, "account": None}))


def test_every_rule_takes_its_threads_and_resources_from_the_one_module():
    """No literal thread counts, memory or GPU numbers in the rules: each names its kind."""
    for path in sorted((REPO / "workflow" / "rules").rglob("*.smk")):
        text = path.read_text()
        rules = re.findall(r"(?m)^rule (\w+):", text)
        assert len(re.findall(r"(?m)^    threads: job_threads\(\"(\w+)\"\)$", text)) == len(rules), path.name
        assert len(re.findall(r"(?m)^        \*\*job_resources\(\"(\w+)\"", text)) == len(rules), path.name
        assert not re.search(r"(?m)^\s+(mem_mb|runtime|gpu)=\d", text), path.name


# ----------------------------------------------------------------------------------------------- under SLURM

def _slurm_env(monkeypatch, **env):
    for name in ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_outside_slurm_no_scheduler_devices(monkeypatch):
    _slurm_env(monkeypatch, CUDA_VISIBLE_DEVICES="0,1")
    assert lease.scheduler_devices() is None


def test_a_slurm_job_takes_its_assigned_gpu_as_it_is_with_no_lock(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    _slurm_env(monkeypatch, SLURM_JOB_ID="41", CUDA_VISIBLE_DEVICES="1", SLURM_STEP_GPUS="1")
    with lease.gpu_lease() as first, lease.gpu_lease() as second:  # SLURM owns exclusivity: no lock waits
        assert first == second == "1"
    assert not list(tmp_path.glob("gpu-*.lock"))
    _slurm_env(monkeypatch, SLURM_JOB_ID="42", SLURM_JOB_GPUS="2,3")  # SLURM set no CUDA_VISIBLE_DEVICES
    with lease.gpu_lease(count=2) as both:
        assert both == "2,3"


def test_the_lease_command_under_slurm_passes_the_assignment_on(tmp_path, monkeypatch):
    from attnbench.cli import main

    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    _slurm_env(monkeypatch, SLURM_JOB_ID="7", CUDA_VISIBLE_DEVICES="1")
    out = tmp_path / "seen.txt"
    code = main(["lease", "--device", "cuda", "--", sys.executable, "-c",
                 f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' "
                 "+ os.environ['ATTNBENCH_LEASE'])"])
    assert code == 0 and out.read_text() == "1 cuda:1"


def test_a_shared_allocation_with_more_gpus_than_asked_is_leased_among_them(tmp_path, monkeypatch):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    _slurm_env(monkeypatch, SLURM_JOB_ID="9", CUDA_VISIBLE_DEVICES="4,5")  # salloc --gpus=2, two local jobs
    with lease.gpu_lease() as first:
        with lease.gpu_lease() as second:
            assert {first, second} == {"4", "5"}


def test_a_slurm_job_without_gpus_is_told_how_to_ask(monkeypatch):
    _slurm_env(monkeypatch, SLURM_JOB_ID="11")
    with pytest.raises(RuntimeError, match="SLURM job 11 was given none; ask for them in the rule's resources"):
        with lease.gpu_lease():
            pass


def test_the_lease_command_starts_without_importing_torch():
    # `attnbench lease` wraps every timing job: torch (seconds to import) is for the job, not for its wrapper
    import subprocess

    code = "import sys, attnbench.cli, attnbench.workflow.lease; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr
