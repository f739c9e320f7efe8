"""Finished runs put back from committed rows (attnbench.train.restore): the experiment trains only the runs still
missing, and its frames are what they were."""
import dataclasses
import json
import shutil

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.errors import ConfigError
from attnbench.train import experiments as ex
from attnbench.train.loop import RunSpec
from attnbench.train.restore import restore_finished_runs
from tests.train.test_experiments import PEAKS, _job, _tiny_config

ROWS = "results/reference/cpu/tiny/pretrain/fp8"


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """A tiny fp8 experiment trained once, its frames committed under results/reference/, one run marked cut."""
    monkeypatch.chdir(tmp_path)
    job = _job(_tiny_config(fp8={"precisions": ["bf16"], "seeds": [0, 1, 2], "swiglu_precisions": [],
                                 "stats": ["tensorwise"]}), "fp8")
    frames = ex.run_experiment(job, tmp_path / "first", progress=False, peak_cache=dict(PEAKS))
    rows = tmp_path / ROWS
    rows.mkdir(parents=True)
    runs = frames["runs"].copy()
    runs.loc[runs["run"] == "fp8/bf16/s2", "status"] = "truncated"  # as a run cut at a lease's deadline is
    runs.to_parquet(rows / "runs.parquet")
    for name in ("steps", "fp8_layers"):
        frames[name].to_parquet(rows / f"{name}.parquet")
    return job, frames


def test_restored_runs_are_kept_and_only_the_missing_one_trains(committed, tmp_path):
    job, first = committed
    specs = [RunSpec.from_dict(d) for d in job["runs"]]
    out = tmp_path / "results" / "again" / "pretrain" / "fp8"
    assert restore_finished_runs("fp8", specs, ROWS, out) == ["fp8/bf16/s0", "fp8/bf16/s1"]
    assert restore_finished_runs("fp8", specs, ROWS, out) == []  # a folder already there is left as it is
    again = ex.run_experiment(job, out, progress=False, peak_cache=dict(PEAKS))
    trained = sorted(p.parent.name for p in out.glob("runs/*/run.json"))  # train() writes it when it trains
    assert trained == ["bf16__s2"] and set(again["runs"]["status"]) == {"ok"}
    for name, keys in (("runs", ["run"]), ("steps", ["run", "step"]),
                       ("fp8_layers", ["run", "step", "layer", "recipe", "kind"])):
        machine = [c for c in first[name] if c.endswith(("_s", "_iqr", "memory_bytes"))  # times and memory
                   or c in ("tokens_per_s", "timestamp", "mfu", "tokens_per_j")]
        a, b = (f.drop(columns=machine).sort_values(keys, ignore_index=True) for f in (first[name], again[name]))
        pd.testing.assert_frame_equal(b[a.columns], a, obj=name)  # the same rows, the re-trained run's too


def test_stale_rows_and_divergence_are_not_restored(committed, tmp_path):
    job, _ = committed
    specs = [RunSpec.from_dict(d) for d in job["runs"]]
    out = tmp_path / "results" / "again" / "pretrain" / "fp8"
    stale = [dataclasses.replace(s, train=dataclasses.replace(s.train, lr=s.train.lr / 2)) for s in specs]
    assert restore_finished_runs("fp8", stale, ROWS, out) == []  # a config that changed is another run
    with pytest.raises(ConfigError, match="experiment='divergence' cannot be restored"):
        restore_finished_runs("divergence", specs, ROWS, out)
    for bad in ("/etc", "results/reference/../../x/pretrain/fp8", "results/h200/pretrain/fp8"):
        with pytest.raises(ConfigError, match=r"--rows=.* is not allowed; allowed: a folder results/reference/"):
            restore_finished_runs("fp8", specs, bad, out)


def test_cli_restores_into_the_sweeps_experiment_folder(committed, tmp_path, capsys):
    job, _ = committed
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps({**_tiny_config(fp8={"precisions": ["bf16"], "seeds": [0, 1, 2],
                                                      "swiglu_precisions": [], "stats": ["tensorwise"]}),
                                  "sweep": "tiny"}))

    def restore(rows=ROWS, out="results/tiny/pretrain/fp8"):
        return main(["experiment", "restore", "--config", str(config), "--rows", rows, "--out", out])

    assert restore() == 0
    assert "2 finished runs" in capsys.readouterr().out
    summary = json.loads((tmp_path / "results/tiny/pretrain/fp8/runs/bf16__s0/summary.json").read_text())
    assert summary["status"] == "ok" and summary["run"] == "fp8/bf16/s0"
    shutil.copytree(tmp_path / ROWS, tmp_path / "results/reference/cpu/tiny/pretrain/other")
    assert restore(rows=ROWS.replace("fp8", "other")) == 2
    assert "ends in 'other'; allowed: a folder named after an experiment" in capsys.readouterr().err
    assert restore(rows="/tmp/x/pretrain/fp8") == 2
    assert "--rows='/tmp/x/pretrain/fp8' is not allowed" in capsys.readouterr().err
    # the experiment's folder: a sweep's, named after the rows' experiment, never outside results/ or in the reference
    for out in ("/tmp/tiny/pretrain/fp8", "results/../tiny/pretrain/fp8", "results/tiny/pretrain/other",
                "results/tiny/fp8", "results/reference/pretrain/fp8", "results/tiny/pretrain/fp8/runs"):
        assert restore(out=out) == 2
        assert f"--out={out!r} is not allowed; allowed: a folder results/<sweep>/pretrain/fp8" in capsys.readouterr().err
    assert main(["experiment", "restore", "--config", str(config), "--rows", ROWS]) == 2
    assert "attnbench experiment restore needs --out" in capsys.readouterr().err
    assert not (tmp_path / "results/tiny/pretrain/other").exists()


def test_a_table_of_runs_from_two_devices_counts_the_runs_of_each(committed):
    from attnbench.report.pretrain import fp8_outputs

    _, first = committed
    runs = first["runs"].copy()
    runs.loc[runs["run"] == "fp8/bf16/s2", "device_name"] = "a later session's GPU"
    tables, _ = fp8_outputs(runs, first["steps"], first["fp8_layers"])
    caption = next(t for t in tables if t.name == "fp8").caption
    assert "2 runs on " in caption and "; 1 runs on a later session's GPU, torch " in caption
    alone, _ = fp8_outputs(first["runs"], first["steps"], first["fp8_layers"])
    assert " runs on " not in next(t for t in alone if t.name == "fp8").caption
