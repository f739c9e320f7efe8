"""The committed long FP8 rows (results/reference/h100/fp8-long: config/sweeps/h200-fp8-long.yaml, which a lease
ran on an H100) at the numbers docs/training.md ("FP8 over a long run") quotes from them."""
import shutil

import pandas as pd
import pytest

from attnbench.train import experiments as ex
from tests.report.fp8_reference import (REPO, assert_committed_tables_equal, planned_and_restored,
                                        rebuild)

SWEEP = REPO / "results" / "reference" / "h100" / "fp8-long"
ROWS = SWEEP / "pretrain" / "fp8"


@pytest.fixture(scope="module")
def frames():
    runs, steps = pd.read_parquet(ROWS / "runs.parquet"), pd.read_parquet(ROWS / "steps.parquet")
    layers = pd.read_parquet(ROWS / "fp8_layers.parquet")
    return runs, ex.fp8_frame(runs, steps).set_index("variant"), ex.fp8_layers_frame(runs, layers)


def test_all_nine_runs_finished_the_10000_steps(frames):
    """Five finished in the first session's calls (09d83b2); the four it cut trained from step 0 in a later session's
    two calls (8641838), after `attnbench experiment restore` put the five back (lease/4-fp8.log)."""
    runs, _, _ = frames
    assert set(runs["steps"]) == {10000} and (runs["status"] == "ok").all() and (runs["steps_done"] == 10000).all()
    assert not runs["git_sha"].str.contains("dirty").any()
    assert runs["device_name"].str.contains("H100").all() and (runs["gpu_sharing"] == "shared").all()
    later = {"fp8/fp8-rowwise/s0", "fp8/swiglu-bf16/s0", "fp8/swiglu-fp8-tensorwise/s0",
             "fp8/smooth-swiglu-fp8-tensorwise/s0"}
    assert runs.set_index("run")["git_sha"].to_dict() == {
        r: "864183805354" if r in later else "09d83b23560b" for r in runs["run"]}


def test_the_corpus_is_memorised_and_fp8_memorises_it_more_slowly(frames):
    _, table, _ = frames
    bf16 = table.loc["bf16"]
    # validation loss is lowest at steps 2000-2500 and has doubled by step 10,000
    assert bf16["best_val_step"].between(1999, 2499).all() and bf16["best_val_loss"].between(1.38, 1.386).all()
    assert bf16["final_val_loss"].between(3.05, 3.14).all() and bf16["train_loss"].between(0.25, 0.28).all()
    for variant, val_gap, opens, train_gap, train_opens in (("fp8-tensorwise", -0.252, 4499, 0.0536, 3899),
                                                            ("fp8-rowwise", -0.244, 4499, 0.0521, 3899),
                                                            ("mxfp8", -0.206, 5749, 0.0485, 4399)):
        row = table.loc[variant]
        assert row["gap"] == pytest.approx(val_gap, abs=5e-4) and row["gap_opens_at_step"] == opens
        assert row["train_gap"] == pytest.approx(train_gap, abs=5e-4) and row["train_gap_opens_at_step"] == train_opens
        assert row["train_gap"] > 4 * row["train_band_high"]  # the seeds' band at the end: +-0.011
        # 1.376-1.381: near bf16's
        assert row["best_val_loss"] == pytest.approx(bf16["best_val_loss"].mean(), abs=0.008)
    assert table["best_val_step"].between(1749, 2749).all() and table["best_val_loss"].between(1.368, 1.386).all()
    assert bf16["band_high"].iloc[0] == pytest.approx(0.0508, abs=5e-4)
    assert bf16["train_band_high"].iloc[0] == pytest.approx(0.0112, abs=5e-4)


def test_swiglu_down_projection_amax_keeps_growing_without_overflow(frames):
    _, _, layers = frames
    peak = layers.groupby("variant")["amax_max"].max()
    assert peak["swiglu-bf16"] == 228 and peak["swiglu-fp8-tensorwise"] == 260  # h200-pretrain's 1000-step runs: 47, 60
    assert peak[["bf16", "fp8-tensorwise", "fp8-rowwise", "mxfp8"]].max() == 18.5
    assert peak["smooth-swiglu-fp8-tensorwise"] == 1  # its per-channel scale normalises the input
    assert (layers["overflow_max"] == 0).all()
    swiglu = layers[layers["variant"] == "swiglu-fp8-tensorwise"].set_index("layer")["amax_max"]
    assert swiglu.idxmax() == "blocks.5.mlp.proj" and swiglu.drop("blocks.5.mlp.proj").max() == 70  # the last block


def test_swiglu_fp8_with_and_without_smooth_swiglu_end_at_the_same_gap(frames):
    _, table, _ = frames
    swiglu, smooth = table.loc["swiglu-fp8-tensorwise"], table.loc["smooth-swiglu-fp8-tensorwise"]
    assert swiglu["gap"] == pytest.approx(-0.218, abs=5e-4) and swiglu["gap_opens_at_step"] == 3499
    assert smooth["gap"] == pytest.approx(-0.223, abs=5e-4) and smooth["gap_opens_at_step"] == 4249
    assert swiglu["train_gap"] == pytest.approx(0.0313, abs=5e-4)
    assert smooth["train_gap"] == pytest.approx(0.0271, abs=5e-4)
    assert swiglu["train_gap_opens_at_step"] == smooth["train_gap_opens_at_step"] == 3599


def test_the_later_runs_time_what_a_step_row_did_besides_the_step():
    """The four runs of 8641838 time the batch, probe, FP8 statistics, validation and checkpoints (docs/training.md,
    "What the four later runs took"); the five restored rows, made before those columns, have none."""
    steps = pd.read_parquet(ROWS / "steps.parquet")
    timed = steps[steps["data_s"].notna()]
    assert set(timed["run"]) == {"fp8/fp8-rowwise/s0", "fp8/swiglu-bf16/s0", "fp8/swiglu-fp8-tensorwise/s0",
                                 "fp8/smooth-swiglu-fp8-tensorwise/s0"}
    total = timed.groupby("run")[["step_s", "data_s", "probe_s", "fp8_stats_s", "val_s", "ckpt_s"]].sum()
    counts = timed.groupby("run")[["probe_s", "fp8_stats_s", "val_s", "ckpt_s"]].count()
    assert (counts == [1000, 100, 41, 39]).all().all()
    assert total["step_s"].between(283, 421).all() and total["fp8_stats_s"].between(60.5, 70).all()
    assert total["probe_s"].between(25.5, 63.5).all() and total["val_s"].between(8, 25).all()
    assert total["ckpt_s"].round().eq(13).all() and total["data_s"].round().eq(5).all()
    assert total.sum(axis=1).between(398.5, 580.5).all()
    per_recording = timed.groupby("run")["fp8_stats_s"].median()
    assert per_recording.between(0.625, 0.695).all()


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """The committed rows in a sweep folder of their own, with the pretraining stage's outputs written anew."""
    return rebuild(SWEEP, tmp_path_factory.mktemp("fp8-long"))


def test_committed_tables_are_what_the_rows_give(rebuilt):
    assert_committed_tables_equal(SWEEP, rebuilt)


@pytest.mark.skipif(shutil.which("jupyter") is None and shutil.which("jupytext") is None,
                    reason="needs the report extra (jupytext, nbconvert, ipykernel)")
def test_the_report_renders_the_long_runs_pretraining_section(rebuilt, tmp_path):
    """reports/reference/h100/fp8-long/report.html is this render of the committed folder (docs/reference-runs.md)."""
    from attnbench.report.notebook import render, section_sources

    page = render(section_sources(REPO / "workflow" / "notebooks"), rebuilt, tmp_path / "report.html",
                  planned=("pretrain",)).read_text()
    assert "Traceback" not in page
    for name in ("fp8", "fp8_seeds", "fp8_contrasts", "fp8_scales", "fp8_layers", "fp8_spikes"):
        assert f"Table ({name})" in page
    assert "Figure (fp8)" in page and "Figure (fp8_layers)" in page and "Table (divergence)" not in page
    assert "Runs: 9 ok. NVIDIA H100 80GB HBM3" in page


def test_a_later_lease_trains_nothing_again(tmp_path, monkeypatch):
    """The sweep plans today the config hashes these rows carry, so `RESTORE_ROWS=results/reference/h100/fp8-long`
    puts all nine runs back (docs/reference-runs.md) and a lease of `h200-fp8-long:fp8` only writes the tables."""
    monkeypatch.chdir(REPO)
    planned, restored = planned_and_restored("h200-fp8-long.yaml", SWEEP, tmp_path)
    assert restored == planned
