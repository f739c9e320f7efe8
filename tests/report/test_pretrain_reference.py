"""The committed H200 pretraining rows: the h200-pretrain sweep's own folder (results/reference/h200/pretrain/sweep)
for each experiment that has landed, the retired script's rows (an older layout, brought to today's columns by
`attnbench reference`) for the others; the pretraining tables render from both."""
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
    landed = pd.read_parquet(ROWS / "sweep" / "pretrain" / "layouts" / "runs.parquet")
    layouts = pd.read_parquet(paths.within(tmp_path, paths.PRETRAIN_DIR, experiment="layouts") / "runs.parquet")
    pd.testing.assert_frame_equal(layouts, landed)  # the sweep's rows, not the retired script's
    assert set(layouts["steps"]) == {1000} and set(layouts["gpu_sharing"]) == {"alone"}

    def table(experiment, name):
        tables, _ = experiment_outputs(experiment, paths.within(tmp_path, paths.PRETRAIN_DIR, experiment=experiment))
        return {t.name: t for t in tables}[name].values

    divergence = table("divergence", "divergence").reset_index().set_index("label")
    # the committed 2000-step numbers (docs/training.md): one seed, so no interval
    assert divergence.loc["sdpa-flash vs sdpa-math", "rel_l2_mean"] == pytest.approx(0.639, abs=5e-4)
    assert divergence.loc["fp32 vs fp16 (sdpa-math)", "arm"] == "precision"
    assert divergence.loc["sdpa-math-1 vs sdpa-math", "arm"] == "init_and_data_seed"
    sens = table("lr_sensitivity", "lr_sensitivity").reset_index().set_index("variant")
    # Wortsman et al.'s definition over the whole grid, the truncated run included: 0.040, not 0.010
    assert sens.loc["qk_norm+z_loss", "lr_sensitivity_mean"] == pytest.approx(0.040, abs=5e-4)
    runs = pd.read_parquet(paths.within(tmp_path, paths.PRETRAIN_DIR, experiment="lr_sensitivity") / "runs.parquet")
    assert runs.set_index("run").loc["lr_sensitivity/baseline/lr0.1", "spikes_olmo_core_grad"] == 19
