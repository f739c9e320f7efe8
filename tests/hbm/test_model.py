"""The byte model's additions for the hbm stage (read/write split, paged term, family labels) and its figures."""
import pandas as pd
import pytest

from attnbench.bench import conventions as cv
from attnbench.case import Case
from attnbench.report import hbm as hbm_report
from attnbench.report.artifacts import write_stage
from attnbench.hbm.ledger import LedgerShape, build_ledger
from attnbench.hbm.stage import model_family


def case(**kw):
    base = dict(mode="fwd", layout="mha", batch=4, heads_q=16, heads_kv=16, head_dim_qk=128, head_dim_v=128,
                seq_q=4096, seq_kv=4096, causal=True, dtype="bf16")
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("kw", [{}, {"mode": "fwd_bwd"}, {"mode": "decode", "layout": "gqa", "heads_kv": 4,
                                                          "seq_q": 1, "causal": False},
                                {"mode": "decode", "layout": "mla", "heads_kv": 1, "head_dim_qk": 576,
                                 "head_dim_v": 512, "seq_q": 1, "causal": False}])
def test_read_and_written_parts_sum_to_bytes_min(kw):
    c = case(**kw)
    read, written = cv.bytes_min_read_write(c)
    assert read + written == cv.bytes_min(c)


def test_anchor_case_reads_q_k_v_and_writes_o():
    # causal fwd B4 H16 S4096 D128 bf16: Q, K, V 67,108,864 bytes each (201 MB), O one more
    assert cv.bytes_min_read_write(case()) == (3 * 67_108_864, 67_108_864)


def test_paged_decode_adds_its_page_table():
    paged = case(mode="decode", layout="gqa", heads_kv=4, seq_q=1, seq_kv=1000, causal=False, page_size=16)
    flat = case(mode="decode", layout="gqa", heads_kv=4, seq_q=1, seq_kv=1000, causal=False)
    # kv_indptr (B+1) + kv_indices (B * ceil(1000/16) = 4 * 63) + kv_last_page_len (B), int32
    assert cv.page_table_bytes(paged) == 4 * (5 + 4 * 63 + 4)
    assert cv.page_table_bytes(flat) == 0
    assert cv.bytes_model(paged, "fused") == cv.bytes_model(flat, "fused") + 4 * (5 + 4 * 63 + 4)
    assert cv.bytes_min(paged) == cv.bytes_min(flat)
    assert model_family(paged, "fused") == "paged" and model_family(flat, "fused") == "decode"
    assert model_family(case(), "fused") == "flash-style" and model_family(case(), "eager") == "eager"


def test_tables_and_figures_render_with_and_without_measured_rows(tmp_path):
    """Synthetic rows (hand-made test input, not results) exercise every panel; empty input still writes files."""
    c = case()
    row = {**c.fields(), "case_id": c.case_id, "group": "fwd", "status": "ok", "reason": "", "flops": cv.flops(c),
           "bytes_model": cv.bytes_model(c, "fused"), "bytes_min": cv.bytes_min(c), "ms_median": 1.0,
           "peak_flops": 8e14, "peak_bytes_per_s": 4.3e12}
    hbm = pd.DataFrame([{**row, "backend": b, "bytes_measured": m * row["bytes_min"],
                         "ratio_measured_model": m * row["bytes_min"] / row["bytes_model"], "ratio_measured_min": m,
                         "intensity_measured": row["flops"] / (m * row["bytes_min"]), "gbps_measured": 300.0,
                         "bound_measured": "compute"} for b, m in (("sdpa-flash", 1.2), ("eager", 40.0))])
    ledger = build_ledger(LedgerShape(), hbm)
    index = write_stage("hbm", hbm_report.build(hbm, ledger), tmp_path / "full")
    assert [f["name"] for f in index["figures"]] == list(hbm_report.FIGURE_NAMES)
    assert [t["name"] for t in index["tables"]] == list(hbm_report.TABLE_NAMES)
    assert all((tmp_path / "full" / f["files"]["png"]).stat().st_size > 10_000 for f in index["figures"])
    measured = pd.read_csv(tmp_path / "full" / "tables" / "bytes.csv").set_index("backend")
    assert measured.loc["eager", "ratio_measured_min"] == 40.0
    empty = hbm.assign(status="unavailable", reason="no CUDA device")
    index = write_stage("hbm", hbm_report.build(empty, build_ledger(LedgerShape(), empty)), tmp_path / "empty")
    assert all((tmp_path / "empty" / f["files"]["png"]).stat().st_size > 1_000 for f in index["figures"])
    bytes_entry = index["tables"][0]
    assert bytes_entry["empty"] and "no CUDA device" in (tmp_path / "empty" / bytes_entry["files"]["md"]).read_text()
