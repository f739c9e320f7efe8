"""The stability script's comparison of two passes (made-up rows)."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_stability.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("h200_stability", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_pairs_passes_by_case_and_backend(script):
    base = dict(mode="fwd", layout="mha", batch=8, heads_q=16, head_dim_qk=128, causal=False, dtype="bf16")
    rows = []
    for p, (ms_a, ms_b) in ((1, (1.00, 2.0)), (2, (1.02, 2.0))):
        rows += [dict(base, backend="sdpa-cudnn", seq_kv=4096, status="ok", ms_median=ms_a, cv=0.01 * p, **{"pass": p}),
                 dict(base, backend="sdpa-flash", seq_kv=4096, status="ok", ms_median=ms_b, cv=0.005, **{"pass": p}),
                 dict(base, backend="sdpa-flash", seq_kv=8192, status="error", ms_median=float("nan"), cv=float("nan"),
                      **{"pass": p})]
    table = script.compare(pd.DataFrame(rows)).set_index("backend")
    assert len(table) == 2  # the error row is left out
    assert table.loc["sdpa-cudnn", "median_diff"] == pytest.approx(abs(1.00 / 1.02 - 1))
    assert table.loc["sdpa-cudnn", "max_cv"] == 0.02 and table.loc["sdpa-flash", "median_diff"] == 0
