"""Attacks through the files and the environment a command is given: outputs that would overwrite inputs,
corrupt, truncated, empty or foreign inputs, bad environment variables and command-line numbers. Each is
one line naming the file or the variable, and nothing already written is touched (docs/security.md)."""
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from attnbench.envvars import check_environment
from attnbench.errors import ConfigError
from attnbench.workflow import guard

from .conftest import CEILINGS, CONFIG, cli_error, plan_of, usage_error


@pytest.fixture
def results_file(tmp_path):
    """A valid results file (status rows of a planned job: every column, no measurement needed)."""
    path = tmp_path / "g.parquet"
    guard.status_rows(plan_of(CONFIG).job("microbench", "g").payload, ["eager"], "ok", "").to_parquet(path)
    return path


def _aggregate(tmp_path, *inputs):
    return ["aggregate", "--merged", str(tmp_path / "out" / "microbench.parquet"), *map(str, inputs)]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------- outputs vs inputs

def test_microbench_out_equal_to_its_config_is_refused_and_the_config_kept(config_file, capsys):
    before = config_file.read_bytes()
    cli_error(["microbench", "--config", str(config_file), "--group", "g", "--out", str(config_file)], capsys,
              "is also --config")
    assert config_file.read_bytes() == before


def test_microbench_out_equal_to_its_job_file_by_another_spelling_is_refused(tmp_path, capsys):
    job = tmp_path / "job.json"
    job.write_text("{}")
    cli_error(["microbench", "--job", str(job), "--out", f"{tmp_path}/./sub/../job.json"], capsys, "is also --job")
    assert job.read_text() == "{}"


def test_an_output_that_is_a_symlink_to_an_input_is_refused(tmp_path, config_file, capsys):
    (tmp_path / "link.parquet").symlink_to(config_file)
    cli_error(["microbench", "--config", str(config_file), "--group", "g", "--out", str(tmp_path / "link.parquet")],
              capsys, "is also --config")


def test_aggregate_merged_equal_to_one_of_its_inputs_is_refused(tmp_path, results_file, capsys):
    before = results_file.read_bytes()
    cli_error(["aggregate", "--merged", str(results_file), str(results_file)], capsys, "--merged",
              "is also one of the input files")
    assert results_file.read_bytes() == before


def test_hbm_table_out_equal_to_a_part_is_refused(results_file, capsys):
    cli_error(["hbm-table", "--out", str(results_file), str(results_file)], capsys, "is also one of the input files")


# ----------------------------------------------------------------------------------------------- corrupt inputs

def test_a_truncated_results_file_is_one_line_and_the_previous_tables_survive(tmp_path, results_file, capsys):
    from attnbench.cli import main

    assert main(_aggregate(tmp_path, results_file)) == 0
    before = _snapshot(tmp_path / "out")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(results_file.read_bytes()[:200])
    cli_error(_aggregate(tmp_path, results_file, bad), capsys, f"{bad}: not a readable results file (parquet)")
    assert _snapshot(tmp_path / "out") == before


def test_a_failure_while_writing_tables_leaves_the_previous_ones_as_they_were(tmp_path, results_file, monkeypatch):
    from attnbench.cli import main
    from attnbench.report import artifacts

    tables = ["tables", "microbench", "--results", str(tmp_path / "out")]
    assert main(_aggregate(tmp_path, results_file)) == 0 and main(tables) == 0
    before = _snapshot(tmp_path / "out")

    def broken(figure, folder):
        (Path(folder) / f"{figure.name}.png").parent.mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{figure.name}.png").write_bytes(b"half a figure")
        raise OSError("No space left on device")

    monkeypatch.setattr(artifacts.Figure, "write", broken)
    with pytest.raises(OSError):
        main(tables)
    assert _snapshot(tmp_path / "out") == before
    assert not list((tmp_path / "out").rglob(".staging-*"))  # no staging left behind


@pytest.mark.parametrize("name, content, fragment", [
    ("empty.parquet", b"", "empty file"),
    ("garbage.parquet", b"PAR1 this is not parquet PAR1", "not a readable results file (parquet)"),
    ("text.csv", "\x00\xff\xfe".encode("latin-1") * 50, "not a readable results file (CSV)"),
    ("missing.parquet", None, "results file (parquet) does not exist"),
    ("notes.txt", b"hello", "suffix '.txt' is not a results format"),
])
def test_a_corrupt_or_foreign_results_file_is_one_line_naming_it(tmp_path, capsys, name, content, fragment):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    cli_error(_aggregate(tmp_path, path), capsys, str(path), fragment)
    assert not (tmp_path / "out").exists()


def test_a_results_file_of_something_else_is_one_line(tmp_path, capsys):
    path = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(path)
    cli_error(_aggregate(tmp_path, path), capsys, str(path), "missing column 'case_id'")


def test_a_results_row_with_markup_for_a_mode_is_refused(tmp_path, results_file, capsys):
    df = pd.read_parquet(results_file)
    df["mode"] = "<script>alert(1)</script>"
    df.to_parquet(results_file)
    cli_error(_aggregate(tmp_path, results_file), capsys, "mode: '<script>alert(1)</script>' is not one of")


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"), ("", "empty file"), ("{not json", "not a ceilings file (attnbench ceilings)"),
    ('{"device": "cpu"}', "not a ceilings file (found device)"),
    (json.dumps({**CEILINGS, "copy_bytes_per_s": -1}), "copy_bytes_per_s=-1 is not allowed"),
    (json.dumps({**CEILINGS, "matmul_flops_per_s": {"fp32": "fast"}}), "matmul_flops_per_s.fp32='fast'"),
    ("[1, 2]", "not a ceilings file (found list)"),
])
def test_a_bad_ceilings_file_is_one_line_before_any_work(tmp_path, config_file, capsys, content, fragment):
    path = tmp_path / "ceilings.json"
    if content is not None:
        path.write_text(content)
    out = tmp_path / "g.parquet"
    cli_error(["microbench", "--config", str(config_file), "--group", "g", "--ceilings", str(path), "--out", str(out)],
              capsys, str(path), fragment)
    assert not out.exists() and not Path(f"{out}.partial").exists()


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"), (b"\x89PNG\r\n\x1a\n", "not a job file"), (b'{"stage": "pretrain"}', "stage='pretrain'"),
    (b"[]", "stage='list' is not allowed"),
])
def test_a_bad_job_file_is_one_line(tmp_path, capsys, content, fragment):
    path = tmp_path / "job.json"
    if content is not None:
        path.write_bytes(content)
    cli_error(["microbench", "--job", str(path), "--out", str(tmp_path / "o.parquet")], capsys, fragment)


def test_a_binary_config_given_to_a_command_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_bytes(os.urandom(64) + b"\xff")
    cli_error(["plan", "--config", str(path)], capsys, "not UTF-8 text")


def test_a_rule_backends_garbage_timings_are_one_line(tmp_path):
    from attnbench.bench.results import ResultsError
    from attnbench.workflow.ingest import read_timings

    path = tmp_path / "timings.tsv"
    path.write_bytes(b"\xff\xfe\x00garbage\x00" * 20)
    with pytest.raises(ResultsError, match="not a timings file") as err:
        read_timings(path)
    assert "\n" not in str(err.value)


def test_a_failing_report_cell_is_one_line(tmp_path, monkeypatch):
    from nbconvert.preprocessors import CellExecutionError, ExecutePreprocessor

    from attnbench.files import InputError
    from attnbench.report.notebook import render

    def fail(self, nb, resources):
        raise CellExecutionError("Traceback...\nArrowInvalid: Parquet magic bytes not found", "ArrowInvalid",
                                 "Parquet magic bytes not found in footer")

    monkeypatch.setattr(ExecutePreprocessor, "preprocess", fail)
    notebook = Path(__file__).resolve().parents[2] / "workflow" / "notebooks" / "microbench.py"
    with pytest.raises(InputError, match="a report cell failed on .* \\(ArrowInvalid: Parquet magic bytes") as err:
        render([notebook], tmp_path, tmp_path / "r.html")
    assert "\n" not in str(err.value) and not (tmp_path / "r.html").exists()


# ----------------------------------------------------------------------------------------------- environment

@pytest.mark.parametrize("name, value, fragment", [
    ("ATTNBENCH_DEADLINE", "tomorrow", "ATTNBENCH_DEADLINE='tomorrow' is not allowed; allowed: a Unix time"),
    ("ATTNBENCH_DEADLINE", "inf", "ATTNBENCH_DEADLINE='inf' is not allowed"),
    ("WANDB_MODE", "loud", "WANDB_MODE='loud' is not allowed; allowed: online, offline, disabled"),
    ("ATTNBENCH_GIT_SHA", "$(id)", "ATTNBENCH_GIT_SHA='$(id)' is not allowed"),
    ("CUDA_VISIBLE_DEVICES", "0,../../etc/x", "'../../etc/x' is not allowed"),
    ("SLURM_JOB_ID", "12; rm", "SLURM_JOB_ID='12; rm' is not allowed; allowed: a SLURM job id"),
    ("SLURM_STEP_GPUS", "0,x", "SLURM_STEP_GPUS='0,x' is not allowed; allowed: comma-separated GPU indices"),
])
def test_a_bad_environment_variable_is_one_line_before_any_work(monkeypatch, capsys, name, value, fragment):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=fragment.replace("(", "\\(").replace(")", "\\)").replace("$", "\\$")):
        check_environment()
    cli_error(["backends"], capsys, fragment)


def test_a_lock_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ATTNBENCH_LOCK_DIR", str(tmp_path / "file"))
    cli_error(["backends"], capsys, "ATTNBENCH_LOCK_DIR=", "is not a folder")


def test_good_environment_values_are_parsed(monkeypatch, tmp_path):
    env = {"ATTNBENCH_DEADLINE": "1900000000", "WANDB_MODE": "offline", "ATTNBENCH_GIT_SHA": "0123456789ab-dirty",
           "CUDA_VISIBLE_DEVICES": "0,GPU-8f6d0c2e-1b7a", "ATTNBENCH_LOCK_DIR": str(tmp_path)}
    parsed = check_environment(env)
    assert parsed["ATTNBENCH_DEADLINE"] == 1.9e9 and parsed["CUDA_VISIBLE_DEVICES"] == ["0", "GPU-8f6d0c2e-1b7a"]


# ----------------------------------------------------------------------------------------------- command line

@pytest.mark.parametrize("args, fragment", [
    (["context", "evaluate", "--job", "j", "--checkpoint", "c", "--out", "o", "--threads", "-3"],
     "argument --threads: '-3' is not allowed; allowed: a whole number from 1 to 1024"),
    (["experiment", "run", "--job", "j", "--out", "o", "--threads", "many"],
     "argument --threads: 'many' is not allowed"),
    (["wheelhouse", "--out", "w", "--cuda", "1000"], "argument --cuda: '1000' is not allowed"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
])
def test_a_bad_command_line_is_one_line(capsys, args, fragment):
    usage_error(args, capsys, fragment)


def test_a_lease_target_group_outside_the_sweep_is_one_line_naming_its_groups(config_file, capsys):
    # scripts/lease.sh passes <sweep>:<groups> here before Snakemake starts: nothing it prints reaches a shell
    cli_error(["plan", "--config", str(config_file), "--targets", "g,$(touch pwned)"], capsys,
              "group='$(touch pwned)' is not a microbench group of sweep 'sec' on cpu; allowed: g")


def test_lease_targets_are_the_groups_outputs_and_the_runs_config(config_file, capsys):
    from attnbench.cli import main

    capsys.readouterr()
    assert main(["plan", "--config", str(config_file), "--targets", "g"]) == 0
    assert capsys.readouterr().out.split() == [
        "results/sec/microbench/g.parquet", "results/sec/env/config.yaml", "results/sec/env/versions.json"]


@pytest.mark.parametrize("sweep, targets, paths, bad, error", [
    # h200-context runs no microbench: `lease.sh h200-context:fwd,unfused` measures those cost groups alone
    ("h200-context", "fwd,unfused", ["context/cost/fwd.parquet", "context/cost/unfused.parquet"], "prefil",
     "group='prefil' is not a context-cost group of sweep 'h200-context' on cuda; allowed: decode, fwd"),
    # `lease.sh h200-pretrain:layouts` trains one experiment alone (and continues it with --forcerun next call)
    ("h200-pretrain", "layouts,fp8", ["pretrain/layouts/runs.parquet", "pretrain/fp8/runs.parquet"], "layout",
     "group='layout' is not a pretrain group of sweep 'h200-pretrain' on cuda; allowed: divergence, "
     "lr_sensitivity, fp8, layouts"),
], ids=["context-cost", "pretrain"])
def test_lease_targets_of_a_sweep_without_microbench_are_its_other_stages_groups(capsys, sweep, targets, paths, bad,
                                                                                 error):
    from attnbench.cli import main

    config = str(Path(__file__).resolve().parents[2] / "config" / "sweeps" / f"{sweep}.yaml")
    capsys.readouterr()
    assert main(["plan", "--config", config, "--device", "cuda", "--targets", targets]) == 0
    assert capsys.readouterr().out.split() == [f"results/{sweep}/{p}" for p in paths] + [
        f"results/{sweep}/env/config.yaml", f"results/{sweep}/env/versions.json"]
    cli_error(["plan", "--config", config, "--device", "cuda", "--targets", bad], capsys, error)
