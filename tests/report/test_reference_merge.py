"""attnbench reference-merge: a lease's pack replaces its groups' rows in a reference folder, and nothing else."""
import io
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from attnbench.bench.results import ResultsError
from attnbench.cli import main
from attnbench.report.reference_merge import merge

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "results/reference/h200/triton/microbench.parquet"  # real rows: fwd, fwd-fp8, fwd_bwd
FOLDER = "results/reference/h200/triton"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _pack(path: Path, rows: pd.DataFrame, group: str, extra: dict[str, bytes] | None = None) -> Path:
    """What scripts/lease.sh returns: results/<sweep>/ with the group's rows, its log, env and benchmark."""
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, f"results/h200-triton/microbench/{group}.parquet", _parquet(rows))
        _add(tar, "results/h200-triton/snakemake.log", b"4 of 4 steps (100%) done\n")
        _add(tar, "results/h200-triton/env/versions.json", b"{}\n")
        _add(tar, f"results/h200-triton/benchmarks/microbench/{group}.tsv", b"s\th:m:s\n12.0\t0:00:12\n")
        _add(tar, "reports/h200-triton/report.html", b"<html></html>")
        for name, data in (extra or {}).items():
            _add(tar, name, data)
    return path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A copy of the committed triton folder's table, with one log, in a scratch checkout."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / FOLDER
    target.mkdir(parents=True)
    pd.read_parquet(ROWS).to_parquet(target / "microbench.parquet", index=False)
    (target / "snakemake.log").write_text("the first run\n")
    return target


def _remeasured(group: str, sha: str = "abcdef123456") -> pd.DataFrame:
    rows = pd.read_parquet(ROWS)
    rows = rows[rows["group"] == group].copy()
    rows["tflops"] = rows["tflops"] * 1.01
    rows["git_sha"] = sha
    return rows


def test_a_pack_replaces_its_groups_rows_and_puts_its_provenance_beside_the_earlier_runs(folder, tmp_path):
    before = pd.read_parquet(folder / "microbench.parquet")
    pack = _pack(tmp_path / "h200-triton.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8")
    (tmp_path / "gpu.txt").write_text("NVIDIA H200\n")
    assert merge(pack, FOLDER, ["fwd-fp8"], tmp_path / "gpu.txt") == {"fwd-fp8": 16}

    after = pd.read_parquet(folder / "microbench.parquet")
    assert len(after) == len(before)
    new = after[after["group"] == "fwd-fp8"]
    assert set(new["git_sha"]) == {"abcdef123456"}
    assert new.sort_values("case_id")["tflops"].tolist() == pytest.approx(
        (before[before["group"] == "fwd-fp8"].sort_values("case_id")["tflops"] * 1.01).tolist())
    kept = after[after["group"] != "fwd-fp8"].sort_values(["case_id", "backend"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, before[before["group"] != "fwd-fp8"].sort_values(
        ["case_id", "backend"]).reset_index(drop=True), check_dtype=False)
    assert (folder / "snakemake.log").read_text() == "the first run\n"
    assert (folder / "snakemake-1.log").read_text() == "4 of 4 steps (100%) done\n"
    assert (folder / "env-abcdef1" / "versions.json").is_file()
    assert (folder / "gpu-abcdef1.txt").read_text() == "NVIDIA H200\n"
    assert (folder / "benchmarks/microbench/fwd-fp8.tsv").read_text().endswith("12.0\t0:00:12\n")


def test_the_packs_log_follows_the_folders_highest_so_a_gap_never_puts_a_later_call_first(folder, tmp_path):
    (folder / "snakemake-2.log").write_text("the third call\n")  # a folder whose -1 was never kept
    (tmp_path / "gpu.txt").write_text("NVIDIA H200\n")
    merge(_pack(tmp_path / "h200-triton.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8"), FOLDER, ["fwd-fp8"],
          tmp_path / "gpu.txt")
    assert not (folder / "snakemake-1.log").exists()
    assert (folder / "snakemake-3.log").read_text() == "4 of 4 steps (100%) done\n"


def _unchanged(folder: Path) -> bool:
    return sorted(p.name for p in folder.iterdir()) == ["microbench.parquet", "snakemake.log"] and \
        pd.read_parquet(folder / "microbench.parquet").equals(pd.read_parquet(ROWS))


def test_a_group_stopped_at_the_deadline_is_refused_before_the_folder_is_touched(folder, tmp_path):
    pack = _pack(tmp_path / "p.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8",
                 {"results/h200-triton/microbench/fwd-fp8.parquet.interrupted": b"{}"})
    with pytest.raises(ResultsError, match="group='fwd-fp8' stopped before it finished"):
        merge(pack, FOLDER)
    assert _unchanged(folder)


def test_rows_from_a_dirty_tree_are_refused(folder, tmp_path):
    pack = _pack(tmp_path / "p.tar.gz", _remeasured("fwd-fp8", "abcdef123456-dirty"), "fwd-fp8")
    with pytest.raises(ResultsError, match="git_sha 'abcdef123456-dirty' are not allowed as reference"):
        merge(pack, FOLDER)
    assert _unchanged(folder)


@pytest.mark.parametrize("name", ["results/../../escaped.txt", "/tmp/absolute.txt", "elsewhere/x.txt",
                                  "results/h200-triton/$(touch pwned)"])
def test_a_pack_member_outside_its_sweep_folder_is_one_line_and_nothing_is_written(folder, tmp_path, name, capsys):
    pack = _pack(tmp_path / "p.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8", {name: b"x"})
    assert main(["reference-merge", str(pack), "--into", FOLDER]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"member {name!r} is not allowed" in err[0]
    assert _unchanged(folder) and not (tmp_path / "escaped.txt").exists() and not Path("pwned").exists()


def test_a_link_in_the_pack_is_refused(folder, tmp_path):
    pack = tmp_path / "p.tar.gz"
    with tarfile.open(pack, "w:gz") as tar:
        link = tarfile.TarInfo("results/h200-triton/microbench/fwd-fp8.parquet")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(ResultsError, match="is not allowed; allowed: regular files and folders"):
        merge(pack, FOLDER)
    assert _unchanged(folder)


@pytest.mark.parametrize("into", ["/tmp/x", "results/h200-triton", "results/reference/../../x", "docs"])
def test_the_target_must_be_a_reference_folder(folder, tmp_path, into):
    pack = _pack(tmp_path / "p.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8")
    with pytest.raises(ResultsError, match=r"is not allowed; allowed: a folder results/reference/<gpu>/<folder>"):
        merge(pack, into)
    assert _unchanged(folder)


def test_a_group_the_pack_does_not_hold_names_the_ones_it_does(folder, tmp_path):
    pack = _pack(tmp_path / "p.tar.gz", _remeasured("fwd-fp8"), "fwd-fp8")
    with pytest.raises(ResultsError, match="group='fwd_bwd' is not in the pack; allowed: fwd-fp8"):
        merge(pack, FOLDER, ["fwd_bwd"])
    assert _unchanged(folder)


def test_a_context_sweeps_cost_group_replaces_its_rows_in_cost_parquet(tmp_path, monkeypatch):
    # lease.sh h200-context:fwd measures one cost group alone; its rows go into the context folder's cost.parquet
    monkeypatch.chdir(tmp_path)
    cost = pd.read_parquet(REPO / "results/reference/h200/context/cost.parquet")
    target = tmp_path / "results/reference/h200/context"
    target.mkdir(parents=True)
    cost.to_parquet(target / "cost.parquet", index=False)
    rows = cost[cost["group"] == "fwd"].copy()
    rows["status"], rows["reason"], rows["git_sha"] = "unsupported", "measured again", "0123456789ab"
    pack = tmp_path / "h200-context.tar.gz"
    with tarfile.open(pack, "w:gz") as tar:
        _add(tar, "results/h200-context/context/cost/fwd.parquet", _parquet(rows))
        _add(tar, "results/h200-context/benchmarks/context-cost/fwd.tsv", b"s\n9.0\n")
    assert merge(pack, "results/reference/h200/context") == {"fwd": 25}
    after = pd.read_parquet(target / "cost.parquet")
    assert len(after) == len(cost) and set(after[after["group"] == "fwd"]["git_sha"]) == {"0123456789ab"}
    kept = ["group", "case_id", "backend", "git_sha", "status"]
    pd.testing.assert_frame_equal(
        after.loc[after["group"] != "fwd", kept].sort_values(kept[:3]).reset_index(drop=True),
        cost.loc[cost["group"] != "fwd", kept].sort_values(kept[:3]).reset_index(drop=True), check_dtype=False)
    assert (target / "benchmarks/context-cost/fwd.tsv").read_text() == "s\n9.0\n"
    assert not (target / "microbench.parquet").exists()
