"""Tables and figures from a hand-made results frame: cells, status cells, captions, formats."""
import json

import pandas as pd
import pytest

from attnbench.bench import conventions
from attnbench.case import Case
from attnbench.bench.results import ResultsError, empty_row, to_frame
from attnbench.report import tables
from attnbench.report.aggregate import load_results
from attnbench.report.artifacts import FIGURE_FORMATS, StageOutputs, write_stage
from attnbench.report.figures import FIGURE_NAMES, build_figures

PEAK, BW = 100e12, 2e12  # ceilings of the made-up device


def _case(mode="fwd", layout="mha", seq=1024, causal=False, dtype="bf16", heads_kv=8):
    heads_kv = {"mha": 8, "gqa": 2, "mqa": 1}[layout] if layout != "mha" else heads_kv
    return Case(mode=mode, layout=layout, batch=2, heads_q=8, heads_kv=heads_kv, head_dim_qk=64, head_dim_v=64,
                seq_q=1 if mode == "decode" else seq, seq_kv=seq, causal=causal, dtype=dtype)


def _row(case, backend, status="ok", ms=1.0, err_ratio=1.0, reason="", job="job-1", drift=False):
    row = empty_row() | case.fields()
    row.update(sweep="t", group="g", case_id=case.case_id, backend=backend, status=status, reason=reason,
               device="cuda", device_name="Made-up GPU", driver="1.0", torch_version="2.x",
               peak_flops=PEAK, peak_bytes_per_s=BW, flops=conventions.flops(case),
               bytes_model=conventions.bytes_model(case, "fused"), job_id=job, drift_flag=drift)
    if status in ("ok", "numerics_fail"):
        s = ms / 1e3
        # five rounds within 1% of the median, the same pattern for every backend (as drift would make it)
        row.update(ms_median=ms, ms_ci_low=0.99 * ms, ms_ci_high=1.01 * ms, n_rounds=5,
                   round_ms=[ms * f for f in (0.99, 1.0, 1.01, 1.0, 0.995)],
                   tflops=row["flops"] / s / 1e12, gbps=row["bytes_model"] / s / 1e9,
                   intensity=conventions.intensity(row["flops"], row["bytes_model"]), err_ratio_vs_math=err_ratio,
                   err_ratio_vs_eager=err_ratio, err_ratio_vs_best_fused=err_ratio / 0.9, max_err_ratio=2.0,
                   rel_err=err_ratio * 1e-3, compute_dtype=case.dtype)
        row["bound"], row["frac_of_peak"] = conventions.roofline_bound(row["flops"], row["bytes_model"], s, PEAK, BW)
    return row


@pytest.fixture(scope="module")
def frame():
    rows = []
    for seq in (1024, 4096):
        case = _case(seq=seq)
        rows.append(_row(case, "fast", ms=1.0 * seq / 1024, err_ratio=1.5))
        rows.append(_row(case, "slow", ms=3.0 * seq / 1024, err_ratio=0.9))
        rows.append(_row(case, "missing", status="unavailable", reason="needs a GPU"))
    # at S=1024 a backend 1% slower than the fastest in every round: a real difference, under the 3% margin
    rows.append(_row(_case(seq=1024), "close", ms=1.01))
    rows.append(_row(_case(seq=1024, dtype="fp16"), "fast", status="numerics_fail", ms=0.5, err_ratio=9.0,
                     reason="error 9x"))
    for layout in ("mha", "gqa"):
        case = _case(mode="decode", layout=layout, seq=4096)
        rows.append(_row(case, "fast", ms=0.1, job="job-2", drift=True))
        rows.append(_row(case, "slow", ms=0.2, job="job-2", drift=True))
    return to_frame(rows)


def test_tflops_table_has_a_cell_per_backend_and_context_and_status_words(frame):
    t = tables.tflops_table(frame)
    values = t.values.xs(("fwd", "bf16"), level=("mode", "dtype"))
    fast = _row(_case(seq=4096), "fast", ms=4.0)["tflops"]
    assert values.loc["fast", "S=4096"] == pytest.approx(fast)
    assert values.loc["fast", "S=1024"] == pytest.approx(3 * values.loc["slow", "S=1024"])
    assert values.loc["missing", "S=1024"] == "unavailable"
    assert "(numerics_fail)" in t.display.xs("fp16", level="dtype").loc[("fwd", "fast"), "S=1024"]
    assert "2·B·Hq·Sq·avg_kv·(D_qk + D_v)" in t.caption and "Made-up GPU" in t.caption
    assert "MHA, B=2, Hq=8" in t.caption


def test_frac_peak_is_percent_of_roofline(frame):
    t = tables.frac_peak_table(frame)
    row = _row(_case(seq=1024), "fast", ms=1.0)
    assert t.values.xs(("fwd", "bf16"), level=("mode", "dtype")).loc["fast", "S=1024"] == pytest.approx(
        100 * row["frac_of_peak"])
    assert "copy 2000 GB/s" in t.caption


def test_err_ratio_shows_the_gate_and_the_best_fused_ratio_per_dtype(frame):
    t = tables.err_ratio_table(frame)
    assert t.values.loc["fast", "bf16 vs_eager_median"] == pytest.approx(1.25)  # prefill 1.5, 1.5; decode 1.0, 1.0
    assert t.values.loc["fast", "fp16 vs_eager_max"] == pytest.approx(9.0)
    assert t.display.loc["slow", "bf16"] == "0.95 (max 1); vs best fused 1.06; n=4"
    assert "at most 2x" in t.caption and "eager" in t.caption and "0.125" in t.caption  # one baseline, stated


def test_decode_table_is_per_layout(frame):
    t = tables.decode_table(frame)
    assert set(t.values.index.get_level_values("layout")) == {"mha", "gqa"}
    gbps = _row(_case(mode="decode", layout="gqa", seq=4096), "fast", ms=0.1)["gbps"]
    assert t.values.xs("gqa", level="layout").loc[(2, "fast"), "Skv=4096"] == pytest.approx(gbps)


def test_winners_are_named_only_beyond_noise_and_the_margin(frame):
    t = tables.winners_table(frame)
    prefill = t.values.xs("fwd", level="mode").reset_index().set_index("seq_kv")
    assert prefill.loc[4096, "winner"] == "fast" and prefill.loc[4096, "speedup"] == pytest.approx(3.0)
    assert prefill.loc[4096, "speedup_ci_low"] > 1
    # 1% slower in every round: the interval excludes 1, but the margin is under report.min_margin (3%)
    assert prefill.loc[1024, "winner"] == tables.TIE and prefill.loc[1024, "fastest"] == "fast"
    assert prefill.loc[1024, "tied"] == "close"
    assert set(t.values["bound"]) <= {"memory", "compute", "latency"}
    loose = tables.winners_table(frame, min_margin=0.001).values.xs("fwd", level="mode")
    assert set(loose["winner"]) == {"fast"}  # with a smaller margin the 1% is a claim


def test_numbers_carry_intervals_and_drift_marks(frame):
    tflops = tables.tflops_table(frame).display.xs(("fwd", "bf16"), level=("mode", "dtype"))
    assert tflops.loc["fast", "S=1024"].count("[") == 1 and tflops.loc["fast", "S=1024"].endswith("]")
    decode = tables.decode_table(frame).display
    assert decode.map(lambda c: c.endswith(tables.DRIFT_MARK)).any().any()  # the decode job drifted
    winners = tables.winners_table(frame).display
    assert winners.xs("decode", level="mode")["tflops"].str.endswith(tables.DRIFT_MARK).all()


def test_pairs_table_sets_the_fastest_against_each_backend_of_its_job(frame):
    t = tables.pairs_table(frame)
    fwd = t.values.xs("fwd", level="mode")
    at1024 = fwd.xs(1024, level="seq_kv")
    assert set(at1024.index.get_level_values("other")) == {"slow", "close"}
    close = at1024.xs("close", level="other").iloc[0]
    assert close["ratio"] == pytest.approx(1.01) and close["verdict"] == tables.TIE
    slow = at1024.xs("slow", level="other").iloc[0]
    assert slow["ratio"] == pytest.approx(3.0) and slow["verdict"] == "fast faster"


def test_status_table_counts_every_backend_with_reasons(frame):
    t = tables.status_table(frame)
    assert t.values.loc["missing", "unavailable"] == 2 and t.values.loc["close", "ok"] == 1
    assert "needs a GPU" in t.values.loc["missing", "reasons"]
    assert t.values.loc["fast", "numerics_fail"] == 1


def test_formats_and_index(frame, tmp_path):
    index = write_stage("microbench", StageOutputs(tables.build_tables(frame)), tmp_path)
    assert [t["name"] for t in index["tables"]] == list(tables.TABLE_NAMES)
    tex = (tmp_path / "tables" / "tflops.tex").read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "\\caption{" in tex
    assert "fwd_bwd" not in tex  # underscores escaped
    md = (tmp_path / "tables" / "tflops.md").read_text()
    assert md.startswith("Table (tflops): ") and "| backend" in md
    csv = pd.read_csv(tmp_path / "tables" / "tflops.csv")
    assert {"mode", "dtype", "backend", "S=1024", "S=4096"} <= set(csv.columns)
    status = json.loads((tmp_path / "tables" / "index.json").read_text())["tables"][-1]
    assert status["name"] == "status" and status["group"] == "microbench" and status["empty"] is False
    assert status["files"] == {"md": "tables/status.md", "tex": "tables/status.tex", "csv": "tables/status.csv"}


def test_empty_regimes_write_a_note_instead_of_failing(frame):
    only_decode = frame[frame["mode"] == "decode"]
    assert "no fwd/fwd_bwd rows" in tables.tflops_table(only_decode).display.index[0]


def test_figures_are_written_even_without_decode_rows(frame, tmp_path):
    index = write_stage("microbench", StageOutputs(figures=build_figures(frame[frame["mode"] != "decode"])), tmp_path)
    paths = [tmp_path / f for entry in index["figures"] for f in entry["files"].values()]
    assert sorted(p.name for p in paths) == sorted(f"{n}.{e}" for n in FIGURE_NAMES for e in FIGURE_FORMATS)
    assert all(p.stat().st_size > 1000 for p in paths)
    assert all(entry["caption"] for entry in index["figures"])


def test_aggregate_joins_parquet_and_csv_and_rejects_duplicates(frame, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.csv"
    frame.iloc[:3].to_parquet(a)
    frame.iloc[3:].to_csv(b, index=False)
    merged = load_results([a, b])
    assert len(merged) == len(frame) and list(merged.columns[:3]) == ["sweep", "group", "case_id"]
    frame.iloc[:1].to_csv(b, index=False)
    with pytest.raises(ResultsError, match="appears in more than one results file"):
        load_results([a, b])
    bad = frame.iloc[:1].assign(status="fine")
    bad.to_csv(b, index=False)
    with pytest.raises(ResultsError, match="status='fine' is not allowed"):
        load_results([b])


def test_a_constant_tokens_grid_keeps_every_length_in_one_row():
    """FA3-README-style grids hold batch x length constant: the table slices by B·S, not by one batch."""
    rows = []
    for batch, seq in ((8, 1024), (4, 2048), (2, 4096), (1, 8192)):
        case = Case(mode="fwd", layout="mha", batch=batch, heads_q=8, heads_kv=8, head_dim_qk=64, head_dim_v=64,
                    seq_q=seq, seq_kv=seq, causal=False, dtype="bf16")
        rows.append(_row(case, "fast", ms=seq / 1024))
    t = tables.tflops_table(to_frame(rows))
    assert "B·S=8192" in t.caption
    assert list(t.values.columns) == ["S=1024", "S=2048", "S=4096", "S=8192"]
    assert len(t.values) == 1  # one backend, one row: batch is not a row key
