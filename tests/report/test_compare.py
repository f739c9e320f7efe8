"""`attnbench compare` and the stability stage's tables, on hand-made results files."""
import math

import pandas as pd
import pytest

from attnbench.bench import conventions
from attnbench.bench.results import empty_row, to_frame, write_atomic
from attnbench.case import Case
from attnbench.cli import main
from attnbench.report import compare, stability


def _case(seq):
    return Case(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16,
                seq_q=seq, seq_kv=seq, causal=False, dtype="fp32")


def _row(case, backend, ms, spread=0.01, status="ok", job="j", rounds=True):
    row = empty_row() | case.fields()
    row.update(sweep="s", group="g", case_id=case.case_id, backend=backend, status=status, reason="", job_id=job,
               flops=conventions.flops(case))
    if status == "ok":
        row.update(ms_median=ms, tflops=row["flops"] / ms / 1e9, ms_ci_low=ms * (1 - spread) if rounds else math.nan,
                   ms_ci_high=ms * (1 + spread) if rounds else math.nan,
                   round_ms=[ms * (1 + spread * f) for f in (-0.5, 0.0, 0.5)] if rounds else None, n_rounds=3)
    return row


def _write(tmp_path, name, rows):
    path = tmp_path / name
    write_atomic(to_frame(rows), path)
    return path


@pytest.fixture
def base(tmp_path):
    return _write(tmp_path, "base.parquet", [_row(_case(64), "a", 1.0), _row(_case(64), "b", 2.0),
                                             _row(_case(128), "a", 4.0), _row(_case(128), "b", 8.0, status="error")])


def test_a_file_against_itself_is_within_noise_and_exits_0(base, capsys):
    assert main(["compare", str(base), str(base)]) == 0
    out = capsys.readouterr().out
    assert "3 within noise" in out and "1 not measured" in out and "slower" not in out.split("rows:")[1].split("(")[0]


@pytest.mark.parametrize("factor, spread, threshold, verdict, code", [
    (1.20, 0.01, 0.05, "slower", 1),  # 20% slower, intervals of 1%: a regression
    (1.03, 0.01, 0.05, "within noise", 0),  # real but under the threshold
    (1.20, 0.30, 0.05, "within noise", 0),  # large but inside the noise
    (0.80, 0.01, 0.05, "faster", 0),
])
def test_slower_beyond_both_interval_and_threshold_fails(tmp_path, base, factor, spread, threshold, verdict, code):
    new = _write(tmp_path, "new.parquet", [_row(_case(64), "a", 1.0 * factor, spread), _row(_case(64), "b", 2.0)])
    table = compare.compare(compare.load_side(base), compare.load_side(new), threshold)
    by = table.set_index(["backend", "case_id"])
    assert by.loc[("a", _case(64).case_id), "verdict"] == verdict
    assert by.loc[("b", _case(128).case_id), "verdict"] == "only in base"
    assert compare.exit_code(table) == code
    assert main(["compare", str(base), str(new), "--threshold", str(threshold)]) == code


def test_a_sweep_folder_is_its_merged_results_and_rows_without_intervals_claim_nothing(tmp_path, base, capsys):
    sweep = tmp_path / "results" / "s"
    _write(sweep, "microbench.parquet", [_row(_case(64), "a", 2.0, rounds=False)])
    out_md = tmp_path / "out" / "compare.md"
    assert main(["compare", str(base), str(sweep), "--out", str(out_md)]) == 0  # 2x slower, but no interval
    assert "no interval" in out_md.read_text()
    with pytest.raises(Exception, match="no results here"):
        compare.load_side(tmp_path / "out")


def _passes(tmp_path, second_factor):
    """{group: {pass: rows}} of two passes, the second's times scaled by ``second_factor``."""
    passes = {}
    for i, factor in ((1, 1.0), (2, second_factor)):
        rows = [_row(_case(64), "a", 1.0 * factor, job=f"p{i}"), _row(_case(64), "b", 2.0 * factor, job=f"p{i}")]
        passes[str(i)] = pd.read_parquet(_write(tmp_path / "stability" / "anchor", f"{i}.parquet", rows))
    return {"anchor": passes}


def _tables(outputs):
    return {t.name: t for t in outputs.tables}


def test_stability_tables_say_whether_passes_agree_within_their_intervals(tmp_path):
    tables = _tables(stability.build(_passes(tmp_path, 1.005), threshold=0.05, min_margin=0.03))
    assert set(tables) == set(stability.TABLE_NAMES)
    rows = tables["stability"].values.reset_index()
    assert rows["agree"].all() and set(rows["passes"]) == {"2 vs 1"}
    assert "Rows that agree: 100% of 2" in tables["stability"].caption
    pairs = tables["stability_pairs"].values
    assert len(pairs) == 2 and pairs["agree"].all() and pairs["ratio"].tolist() == pytest.approx([0.5, 0.5])


def test_passes_that_moved_beyond_their_intervals_do_not_agree(tmp_path):
    tables = _tables(stability.build(_passes(tmp_path, 1.10), threshold=0.05, min_margin=0.03))
    rows = tables["stability"].values
    assert not rows["agree"].any() and set(rows["verdict"]) == {"slower"}
    assert tables["stability_pairs"].values["agree"].all()  # both backends moved alike: their paired ratio did not


def test_winners_of_two_runs_agree_unless_they_name_different_backends(tmp_path):
    def side(a_ms, b_ms, job):
        return compare.load_side(_write(tmp_path, f"{job}.parquet", [_row(_case(64), "a", a_ms, job=job),
                                                                    _row(_case(64), "b", b_ms, job=job)]))

    base = side(1.0, 2.0, "x")
    same, swapped, tie = side(1.1, 2.3, "y"), side(2.0, 1.0, "z"), side(1.0, 1.001, "t")
    assert compare.winners(base, same, 0.03)["agree"].all()
    assert not compare.winners(base, swapped, 0.03)["agree"].any()
    table = compare.winners(base, tie, 0.03)
    assert table["agree"].all() and table["winner_new"].tolist() == ["tie within noise"]
    assert "1 named on one side and a tie within noise on the other" in compare.winners_summary(table)
