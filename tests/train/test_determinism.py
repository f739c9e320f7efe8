"""Deterministic runs (``train.deterministic``, attnbench/train/determinism.py): PyTorch's switches on while a run
trains and restored after it, CUBLAS_WORKSPACE_CONFIG, the summary column, a run that repeats itself, an op without
a deterministic implementation as an error row, and the identity hash of every run made without the switch."""
import dataclasses
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench.plan import load_plan
from attnbench.train import experiments, loop
from attnbench.train.data import load_tokens
from attnbench.train.determinism import CUBLAS_WORKSPACE_CONFIG, deterministic_algorithms, prepare_process
from attnbench.train.loop import train
from tests.train.test_loop import SYNTH, _spec

SWEEP = Path(__file__).resolve().parents[2] / "results" / "reference" / "h200" / "pretrain" / "sweep"
ON = (True, False, True, False)  # deterministic algorithms (not warn-only), cuDNN deterministic, no cuDNN autotuner


def _state() -> tuple[bool, bool, bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)


def _set(state: tuple[bool, bool, bool, bool]) -> None:
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = state[2], state[3]


@pytest.fixture
def before():
    """The process-wide switches as the test found them, set back whatever the test does."""
    state = _state()
    yield state
    _set(state)


class Watched:
    """A batch source that records whether deterministic algorithms were on when the loop drew each batch."""

    def __init__(self):
        self.data = load_tokens(SYNTH)
        self.name, self.sha256, self.loss_floor = self.data.name, self.data.sha256, self.data.loss_floor
        self.seen = set()

    def train_batch(self, *args):
        self.seen.add(torch.are_deterministic_algorithms_enabled())
        return self.data.train_batch(*args)

    def val_batches(self, *args):
        return self.data.val_batches(*args)


@pytest.mark.parametrize("previous", [(False, False, False, True), (True, True, False, False)])
def test_the_switches_are_on_in_the_block_and_restored_after_it(before, previous):
    _set(previous)
    with deterministic_algorithms(True):
        assert _state() == ON
    assert _state() == previous
    with pytest.raises(ValueError, match="in the block"):
        with deterministic_algorithms(True):
            assert _state() == ON
            raise ValueError("in the block")
    assert _state() == previous


@pytest.mark.parametrize("previous", [(False, False, False, True), ON])
def test_a_run_that_is_not_deterministic_changes_no_switch(before, previous):
    _set(previous)
    with deterministic_algorithms(False):
        assert _state() == previous
    assert _state() == previous


def test_the_cublas_workspace_is_set_only_for_deterministic_runs_and_a_set_one_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded first, so the test leaves the variable as it was
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    prepare_process([False, False])
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    prepare_process(deterministic for deterministic in (False, True))  # run_experiment passes a generator
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the notes' other setting, chosen by the caller
    prepare_process([True])
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_a_deterministic_run_trains_under_the_switches_says_so_and_repeats_itself(tmp_path, before):
    spec = _spec(deterministic=True)
    sources = {name: Watched() for name in ("a", "b")}
    runs = {name: train(spec, tmp_path / name, "cpu", data=source) for name, source in sources.items()}
    assert all(s["status"] == "ok" and s["deterministic"] is True for s in runs.values())
    assert all(source.seen == {True} for source in sources.values()) and _state() == before
    steps = {name: pd.read_parquet(tmp_path / name / "steps.parquet") for name in runs}
    cols = ["step", "loss", "grad_norm", "update_rms", "logz_mean", "val_loss", "max_logit_l0"]
    pd.testing.assert_frame_equal(steps["a"][cols], steps["b"][cols])
    weights = {name: torch.load(tmp_path / name / "final.pt", weights_only=True) for name in runs}
    assert weights["a"].keys() == weights["b"].keys()
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])


def test_an_op_without_a_deterministic_implementation_makes_an_error_row_naming_it(tmp_path, monkeypatch, before):
    class Puts(Watched):
        def train_batch(self, *args):  # put_ without accumulate: on PyTorch's list of ops that raise
            torch.zeros(2).put_(torch.tensor([0, 0]), torch.ones(2))
            return super().train_batch(*args)

    monkeypatch.setattr(loop, "load_tokens", lambda data: Puts())
    row = experiments._train_guarded(_spec(deterministic=True), tmp_path / "on", "cpu", None, "", False, None, False)
    assert row["status"] == "error" and row["reason"].startswith("RuntimeError: put_ does not have a deterministic")
    assert _state() == before
    plain = experiments._train_guarded(_spec(), tmp_path / "off", "cpu", None, "", False, None, False)
    assert plain["status"] == "ok" and plain["deterministic"] is False


def test_runs_made_before_the_switch_keep_their_identity_hash():
    """The h200-pretrain sweep's committed rows, planned again from its env/config.yaml (written by the FP8 call,
    which has the switch; the other experiments ran before it), have the hashes the GPU recorded: a run without
    the switch is matched, and not trained again."""
    plan = load_plan(SWEEP / "env" / "config.yaml", "cuda")
    for experiment in ("divergence", "lr_sensitivity", "fp8", "layouts"):
        rows = pd.read_parquet(SWEEP / "pretrain" / experiment / "runs.parquet")
        specs = {spec.name: spec for spec in plan.pretrain[experiment].runs}
        assert not rows.empty and {run: specs[run].config_hash for run in rows["run"]} == dict(
            zip(rows["run"], rows["config_hash"]))
    spec = specs["layouts/mha"]
    on = dataclasses.replace(spec, train=dataclasses.replace(spec.train, deterministic=True))
    assert on.config_hash != spec.config_hash  # a deterministic run is another run
