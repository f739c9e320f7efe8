"""The committed H200 pretraining rows (results/reference/h200/pretrain, an older layout) stay readable: the
reference-report script brings them to today's columns and the pretraining tables render from them."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from attnbench.report.pretrain import render

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "results" / "reference" / "h200" / "pretrain"


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_reference_report",
                                                  ROOT / "scripts" / "pretrain_reference_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_rows_render_with_todays_tables(tmp_path):
    names = _script().split(ROWS, tmp_path / "work")
    assert names == ["divergence", "lr_sensitivity", "fp8", "layouts"]
    render("divergence", tmp_path / "work" / "divergence", tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "tables" / "divergence.csv").set_index("label")
    # the committed 2000-step numbers (docs/training.md): one seed, so no interval
    assert table.loc["sdpa-flash vs sdpa-math", "rel_l2_mean"] == pytest.approx(0.639, abs=5e-4)
    assert table.loc["fp32 vs fp16 (sdpa-math)", "arm"] == "precision"
    assert table.loc["sdpa-math-1 vs sdpa-math", "arm"] == "init_and_data_seed"
    render("lr_sensitivity", tmp_path / "work" / "lr_sensitivity", tmp_path / "out")
    sens = pd.read_csv(tmp_path / "out" / "tables" / "lr_sensitivity.csv").set_index("variant")
    # Wortsman et al.'s definition over the whole grid, the truncated run included: 0.040, not 0.010
    assert sens.loc["qk_norm+z_loss", "lr_sensitivity_mean"] == pytest.approx(0.040, abs=5e-4)
    runs = pd.read_parquet(tmp_path / "work" / "lr_sensitivity" / "runs.parquet").set_index("run")
    assert runs.loc["lr_sensitivity/baseline/lr0.1", "spikes_olmo_core_grad"] == 19  # recomputed from the step log
