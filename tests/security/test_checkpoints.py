"""Attacks through checkpoints: a pickle that runs code when loaded, and truncated, empty or foreign files
that used to fail every later run until someone deleted them (docs/security.md, "Checkpoints")."""
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from attnbench.models.gpt import GPTConfig
from attnbench.train.checkpoint import REJECTED_SUFFIX, CheckpointError, load_checkpoint, load_weights
from attnbench.train.data import DataConfig, SyntheticConfig
from attnbench.train.loop import RunSpec, TrainConfig, train

from .conftest import cli_error, plan_of, with_

REPO = Path(__file__).resolve().parents[2]
SPEC = RunSpec("t", GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16),
               TrainConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=4, eval_batches=1,
                           probe_every=0, ckpt_every=2),
               DataConfig(source="synthetic", synthetic=SyntheticConfig(tokens=4096)))


class _Payload:
    """Unpickling this runs a shell command; ``weights_only`` loading must refuse it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _hostile(path: Path, marker: Path, with_torch: bool = True) -> Path:
    payload = {"step": 1, "config_hash": SPEC.config_hash, "model": _Payload(marker)}
    if with_torch:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    return path


@pytest.mark.parametrize("make", ["hostile", "truncated"])
def test_a_bad_training_checkpoint_is_moved_aside_and_the_run_starts_over(tmp_path, capfd, make):
    marker, ckpt = tmp_path / "PWNED", tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    if make == "hostile":
        _hostile(ckpt, marker)
    else:
        torch.save({"step": 2, "model": {"w": torch.ones(4096)}}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[:-300])  # killed while writing, without the atomic rename
    summary = train(SPEC, tmp_path / "run", "cpu", progress=False)
    assert summary["status"] == "ok" and summary["steps_done"] == 4 and not marker.exists()
    assert Path(f"{ckpt}{REJECTED_SUFFIX}").is_file()
    warnings = [line for line in capfd.readouterr().err.splitlines() if "is not a checkpoint" in line]
    assert len(warnings) == 1 and warnings[0].endswith("starting the run over")


@pytest.mark.parametrize("content, fragment", [
    (b"", "EOFError"), (b"hello, not a checkpoint", "not a checkpoint attnbench can load safely"),
    ("list", "a checkpoint of something else (a list, not a mapping)"),
    ("other", "a checkpoint of something else (no 'model')"),
    ("pickle", "UnpicklingError"),
])
def test_an_empty_garbage_foreign_or_plain_pickle_file_is_refused_and_moved_aside(tmp_path, content, fragment):
    path, marker = tmp_path / "ckpt.pt", tmp_path / "PWNED"
    if content == "list":
        torch.save([1, 2], path)
    elif content == "other":
        torch.save({"weights": torch.ones(2)}, path)
    elif content == "pickle":
        _hostile(path, marker, with_torch=False)
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, ["step", "model"])
    assert fragment in str(err.value) and "\n" not in str(err.value) and not marker.exists()
    assert not path.exists() and Path(f"{path}{REJECTED_SUFFIX}").is_file()


def test_context_evaluate_refuses_a_hostile_checkpoint_in_one_line(tmp_path, capsys):
    job = plan_of(with_("stages", ["context"])).job("context", "capability-none").payload
    (tmp_path / "job.json").write_text(json.dumps(job))
    marker = tmp_path / "PWNED"
    ckpt = _hostile(tmp_path / "pretrain.pt", marker)
    cli_error(["context", "evaluate", "--job", str(tmp_path / "job.json"), "--checkpoint", str(ckpt), "--out",
               str(tmp_path / "o.parquet")], capsys, "is not a checkpoint attnbench can load safely", "moved it to")
    assert not marker.exists() and not ckpt.exists()  # moved aside: Snakemake pretrains again next time


def test_a_corrupt_weight_snapshot_is_one_line():
    with pytest.raises(CheckpointError, match="weights file does not exist"):
        load_weights("/nonexistent/5.pt")


def test_nothing_in_attnbench_unpickles_without_weights_only():
    loads = []
    for path in (REPO / "attnbench").rglob("*.py"):
        for line in path.read_text().splitlines():
            if re.search(r"\btorch\.load\(|\bpickle\.loads?\(", line):
                loads.append((path.relative_to(REPO).as_posix(), line.strip()))
    assert loads == [("attnbench/train/checkpoint.py",
                      "value = torch.load(path, map_location=map_location, weights_only=True)")]
