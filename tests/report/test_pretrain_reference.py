"""The committed H200 pretraining rows: the h200-pretrain sweep's own folder (results/reference/h200/pretrain/sweep),
one folder per experiment, every one made through the pipeline; the pretraining tables render from them."""
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
    for experiment in names:  # the sweep's rows, copied as they are
        landed = pd.read_parquet(ROWS / "sweep" / "pretrain" / experiment / "runs.parquet")
        runs = pd.read_parquet(paths.within(tmp_path, paths.PRETRAIN_DIR, experiment=experiment) / "runs.parquet")
        pd.testing.assert_frame_equal(runs, landed)
        assert set(runs["steps"]) == {1000} and set(runs["status"]) == {"ok"}
        assert not runs["git_sha"].str.contains("dirty").any()

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
    # docs/training.md, FP8: every GELU recipe inside the bf16 seeds' band; SwiGLU under tensorwise FP8 leaves it
    # from step 699, Smooth-SwiGLU later and by half as much
    recipes = table("fp8", "fp8").reset_index().set_index("variant")
    assert len(recipes) == 9 and recipes.loc["bf16", "band_high"].iloc[0] == pytest.approx(0.00614, abs=5e-6)
    gelu = recipes.loc[["fp8-tensorwise", "fp8-rowwise", "mxfp8"]]
    assert (gelu["gap"].abs() < gelu["band_high"]).all() and gelu["gap_opens_at_step"].isna().all()
    assert recipes.loc["swiglu-fp8-tensorwise", "gap"] == pytest.approx(0.0186, abs=5e-5)
    assert recipes.loc["swiglu-fp8-tensorwise", "gap_opens_at_step"] == 699
    assert recipes.loc["smooth-swiglu-fp8-tensorwise", "gap"] == pytest.approx(0.0087, abs=5e-5)
    assert recipes.loc["smooth-swiglu-fp8-tensorwise", "gap_opens_at_step"] == 899
    assert (recipes["gpu_sharing"] == "alone").all()
    # in training loss over the last 100 steps, tensorwise and MXFP8 just outside the seeds' band, rowwise inside
    assert recipes.loc["bf16", "train_band_high"].iloc[0] == pytest.approx(0.00246, abs=5e-6)
    train_gap = recipes["train_gap"]
    assert train_gap["fp8-tensorwise"] == pytest.approx(0.0036, abs=5e-5)
    assert train_gap["mxfp8"] == pytest.approx(0.0031, abs=5e-5)
    assert train_gap["fp8-rowwise"] == pytest.approx(0.0015, abs=5e-5)
    assert train_gap["swiglu-fp8-tensorwise"] == pytest.approx(0.0042, abs=5e-5)
    assert train_gap["smooth-swiglu-fp8-tensorwise"] == pytest.approx(0.0010, abs=5e-5)
    # over windows of 100 steps: outside the band from the window ending at step 899 (999 for MXFP8) to the end
    opens = recipes["train_gap_opens_at_step"]
    assert (opens["fp8-tensorwise"], opens["mxfp8"], opens["swiglu-fp8-tensorwise"]) == (899, 999, 899)
    assert opens[["fp8-rowwise", "smooth-swiglu-fp8-tensorwise"]].isna().all()


def test_the_sweeps_own_tables_are_what_its_rows_give(tmp_path):
    """The stage tables in the sweep's folder (pretrain/tables/) are today's code's, as the main report's are
    (tests/report/test_reference.py): written anew from the rows beside them, every table is the same."""
    from attnbench.report import stages

    sweep = ROWS / "sweep"
    names = _pretrain(ROWS, tmp_path)
    stages.write("pretrain", tmp_path, tuple(names))
    committed = sorted((sweep / "pretrain" / "tables").glob("*.csv"))
    assert len(committed) == 16
    for path in committed:
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "pretrain" / "tables" / path.name), pd.read_csv(path),
                                      obj=str(path.relative_to(ROOT)))
