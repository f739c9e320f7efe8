"""W&B mode selection: offline by default, online only with a key, WANDB_MODE always wins.

The run itself (offline, files on disk, the key never written) is exercised by
tests/test_workflow_e2e.py::test_publish_offline_writes_a_wandb_run_and_never_the_key.
"""
import pytest

from attnbench.report.publish import wandb_mode


@pytest.mark.parametrize("env, mode", [
    ({}, "offline"),
    ({"WANDB_API_KEY": "k" * 40}, "online"),
    ({"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "offline"}, "offline"),
    ({"WANDB_MODE": "disabled"}, "disabled"),
])
def test_mode(monkeypatch, env, mode):
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert wandb_mode() == mode
