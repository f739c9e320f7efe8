"""scripts/lease.sh: with EXPECT_GPU set, a lease that brought another GPU model runs nothing; with RESTORE_ROWS, a
cold one puts committed runs back first; a pack larger than a call brings back comes back in parts."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bare_repo(tmp_path: Path, tools: dict[str, str], sweeps: tuple[str, ...] = ()) -> dict[str, str]:
    """A folder holding lease.sh and these sweep files, with fake ``tools`` (name: shell body) first on PATH; returns
    the environment a lease there runs in (OUT is tmp_path/out)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "lease.sh", tmp_path / "scripts" / "lease.sh")
    for sweep in sweeps:
        (tmp_path / "config" / "sweeps").mkdir(parents=True, exist_ok=True)
        (tmp_path / "config" / "sweeps" / f"{sweep}.yaml").write_text(f"sweep: {sweep}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}


def _lease(tmp_path: Path, gpu_name: str, expect: str) -> subprocess.CompletedProcess:
    """lease.sh from a bare folder (no wheels, no sweep files) on a machine whose nvidia-smi names ``gpu_name``."""
    env = {**_bare_repo(tmp_path, {"nvidia-smi": f"echo '{gpu_name}'"}), "EXPECT_GPU": expect}
    return subprocess.run(["bash", "scripts/lease.sh", "no-such-sweep"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_lease_on_another_gpu_model_runs_nothing(tmp_path):
    done = _lease(tmp_path, "NVIDIA H100 80GB HBM3", "H200")
    assert done.returncode == 3
    assert done.stderr.strip() == "this GPU is 'NVIDIA H100 80GB HBM3', not EXPECT_GPU=H200: nothing run"
    assert not (tmp_path / "out" / "gpu.txt").exists()  # it stopped before recording the GPU or starting a sweep


def test_a_lease_on_the_expected_gpu_model_goes_on(tmp_path):
    done = _lease(tmp_path, "NVIDIA H200", "H200")
    assert done.returncode == 0
    assert "no sweep file config/sweeps/no-such-sweep.yaml" in done.stderr
    assert "NVIDIA H200" in (tmp_path / "out" / "gpu.txt").read_text()


def test_a_cold_lease_restores_the_named_experiments_from_committed_rows(tmp_path):
    """With RESTORE_ROWS, each named pretraining experiment gets its finished runs back before Snakemake starts, into
    the folder the planner names for it, on a cold machine only (a warm one's results/<sweep>/ is newer than any
    committed row); a microbench group has none to restore."""
    calls = tmp_path / "calls.txt"
    targets = ("results/long/pretrain/fp8/runs.parquet", "results/long/microbench/g.parquet",
               "results/long/pretrain/lr/runs.parquet")
    tools = {"nvidia-smi": "echo 'NVIDIA H200'", "snakemake": f"echo snakemake \"$@\" >> {calls}",
             "attnbench": f"echo attnbench \"$@\" >> {calls}\n"
                          f"[ \"$1\" = plan ] && printf '%s\\n' {' '.join(targets)}; exit 0"}
    env = {**_bare_repo(tmp_path, tools, sweeps=("long",)), "RESTORE_ROWS": "results/reference/h200/long",
           "BUDGET_S": "600"}
    for warm in (False, True):
        calls.write_text("")
        if warm:
            (tmp_path / "results" / "long").mkdir(parents=True)
        done = subprocess.run(["bash", "scripts/lease.sh", "long:fp8,g,lr"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        lines = calls.read_text().splitlines()
        restores = [line for line in lines if line.startswith("attnbench experiment restore")]
        assert restores == ([] if warm else [
            f"attnbench experiment restore --config config/sweeps/long.yaml "
            f"--rows results/reference/h200/long/pretrain/{e} --out results/long/pretrain/{e}" for e in ("fp8", "lr")])
        snakemake = next(i for i, line in enumerate(lines) if line.startswith("snakemake results"))
        assert lines[snakemake].startswith("snakemake " + " ".join(targets))
        assert all(lines.index(r) < snakemake for r in restores)


def test_a_lease_passes_snakemake_config_as_one_value_on_top_of_the_sweep_file(tmp_path):
    """SNAKEMAKE_CONFIG (e.g. the runs a short lease can finish) reaches Snakemake as one --config word, followed by
    an option, so no target is read as a config value; without it there is no --config."""
    calls = tmp_path / "calls.txt"
    tools = {"nvidia-smi": "echo 'NVIDIA H200'", "snakemake": f"printf '%s|' \"$@\" >> {calls}; echo >> {calls}",
             "attnbench": "[ \"$1\" = plan ] && echo results/long/pretrain/fp8/runs.parquet; exit 0"}
    env = {**_bare_repo(tmp_path, tools, sweeps=("long",)), "BUDGET_S": "600"}
    value = 'pretrain={select: {runs: ["fp8/bf16/s0", "fp8/fp8-tensorwise/s0"]}}'
    for extra in ({"SNAKEMAKE_CONFIG": value}, {}):
        calls.write_text("")
        done = subprocess.run(["bash", "scripts/lease.sh", "long:fp8"], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        run = next(line for line in calls.read_text().splitlines() if line.startswith("results/")).split("|")
        assert run[:3] == ["results/long/pretrain/fp8/runs.parquet", "--configfile", "config/sweeps/long.yaml"]
        assert run[3:6] == (["--config", value, "--cores"] if extra else ["--cores", "all", "--rerun-incomplete"])


def test_a_pack_over_the_file_limit_comes_back_in_parts_that_cat_joins(tmp_path):
    """A call brings back no file over its limit (16 MB): a larger pack is split, and the parts join to the pack."""
    import tarfile

    # the sweep writes 5000 bytes that do not compress; the limit is 2000
    rows = "mkdir -p results/long/pretrain/fp8 && head -c 5000 /dev/urandom > results/long/pretrain/fp8/runs.parquet"
    tools = {"nvidia-smi": "echo 'NVIDIA H200'", "snakemake": rows, "attnbench": "exit 0"}
    env = {**_bare_repo(tmp_path, tools, sweeps=("long",)), "BUDGET_S": "600", "FILE_LIMIT_BYTES": "2000"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", "scripts/lease.sh", "long"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    parts = sorted(out.glob("long.tar.gz.part-*"))
    assert [p.name for p in parts] == ["long.tar.gz.part-00", "long.tar.gz.part-01", "long.tar.gz.part-02"]
    assert all(p.stat().st_size <= 2000 for p in parts) and not (out / "long.tar.gz").exists()
    assert "in parts, joined by cat long.tar.gz.part-* > long.tar.gz" in done.stdout
    joined = tmp_path / "long.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as pack:
        member = pack.extractfile("results/long/pretrain/fp8/runs.parquet").read()
    assert member == (tmp_path / "results" / "long" / "pretrain" / "fp8" / "runs.parquet").read_bytes()
