"""The committed H200 pretraining rows: the h200-pretrain sweep's own folder (results/reference/h200/pretrain/sweep)
for each experiment that has landed, the retired script's FP8 rows (an older layout, brought to today's columns by
`attnbench reference`) until FP8 lands; the pretraining tables render from both."""
from pathlib import Path

import pandas as pd
import pytest

from attnbench.report.pretrain import experiment_outputs
from attnbench.report.reference import _pretrain
from attnbench.workflow import paths

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "results" / "reference" / "h200" / "pretrain"


def test_committed_rows_render_with_todays_tables(tmp_path):
    names = _pretrain(ROWS, tmp_path)
    assert names == ["divergence", "lr_sensitivity", "fp8", "layouts"]
    for experiment in ("divergence", "lr_sensitivity", "layouts"):  # the sweep's rows, not the retired script's
        landed = pd.read_parquet(ROWS / "sweep" / "pretrain" / experiment / "runs.parquet")
        runs = pd.read_parquet(paths.within(tmp_path, paths.PRETRAIN_DIR, experiment=experiment) / "runs.parquet")
        pd.testing.assert_frame_equal(runs, landed)
        assert set(runs["steps"]) == {1000} and set(runs["status"]) == {"ok"}
    fp8 = pd.read_parquet(paths.within(tmp_path, paths.PRETRAIN_DIR, experiment="fp8") / "runs.parquet")
    assert set(fp8["steps"]) == {2000} and set(fp8["mlp_variant"]) == {"gelu"}  # the retired script's, upgraded
    # both spike scores recomputed from the step logs at today's definitions (the script's window was 400 steps)
    assert set(fp8["spike_window_olmo2_paper"]) == {1000} and (fp8["spikes_olmo_core_any"] == 0).all()

    def table(experiment, name):
        tables, _ = experiment_outputs(experiment, paths.within(tmp_path, paths.PRETRAIN_DIR, experiment=experiment))
        return {t.name: t for t in tables}[name].values

    divergence = table("divergence", "divergence").reset_index().set_index("label")
    # docs/training.md: every kernel arm sits on the replicate floor, other initial weights well above it
    assert divergence.loc["sdpa-math replicate", "rel_l2_mean"] == pytest.approx(0.418, abs=5e-4)
    assert (divergence["seeds_ok"] == 3).all() and divergence["rel_l2_ci_low"].notna().all()
    kernels = divergence[divergence["arm"] == "kernel"]
    assert kernels["over_replicate"].between(0.95, 1.05).all()
    assert divergence.loc["init seed swap (sdpa-math)", "over_replicate"] == pytest.approx(2.45, abs=5e-3)
    sens = table("lr_sensitivity", "lr_sensitivity").reset_index().set_index("variant")
    assert sens.loc["baseline", "lr_sensitivity_mean"] == pytest.approx(0.606, abs=5e-4)
    assert sens.loc["qk_norm-z_loss", "lr_sensitivity_mean"] == pytest.approx(0.0442, abs=5e-5)
    assert sens.loc["qk_norm-z_loss", "lr_sensitivity_ci_high"] < sens.loc["baseline", "lr_sensitivity_ci_low"]
    recipes = table("fp8", "fp8").reset_index()
    assert len(recipes) == 4 and recipes["final_val_loss"].between(1.38, 1.39).all()  # within 0.004 of bf16
