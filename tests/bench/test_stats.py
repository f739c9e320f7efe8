"""The statistics of a timing claim, against values computed by hand: intervals, ratios, verdicts, pairs."""
import math

import numpy as np
import pytest

from attnbench.bench import stats
from attnbench.bench.results import empty_row, to_frame


def test_the_median_interval_covers_the_median_and_is_reproducible():
    rng = np.random.default_rng(1)
    rounds = [rng.lognormal(0, 0.05, 40) for _ in range(5)]
    lo, hi = stats.median_ci(rounds)
    assert lo < np.median(np.concatenate(rounds)) < hi
    assert stats.median_ci(rounds) == (lo, hi)  # a fixed seed: the same rows give the same interval


def test_rounds_that_disagree_widen_the_interval_even_when_each_round_is_tight():
    rng = np.random.default_rng(2)
    noise = [rng.normal(0, 0.001, 50) for _ in range(5)]
    agreeing = [1.0 + n for n in noise]
    drifting = [1.0 + 0.05 * i + n for i, n in enumerate(noise)]  # the clock drops round after round
    width = lambda rounds: np.subtract(*reversed(stats.median_ci(rounds)))  # noqa: E731
    assert width(drifting) > 10 * width(agreeing)  # the round-to-round spread is in the interval


def test_too_few_samples_have_no_interval():
    assert all(math.isnan(v) for v in stats.median_ci([[1.0]]))


def test_paired_ratio_is_the_geometric_mean_with_a_t_interval_by_hand():
    a, b = [2.0, 2.2, 1.8], [1.0, 1.0, 1.0]
    r = stats.paired_ratio(a, b)
    logs = np.log(np.array(a) / np.array(b))
    half = 4.302652729911275 * logs.std(ddof=1) / math.sqrt(3)  # t(0.975, 2 dof)
    assert r.ratio == pytest.approx(math.exp(logs.mean()))
    assert (r.low, r.high) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert r.n == 3 and r.method == "paired t"
    back = stats.paired_ratio(b, a)  # the other way round: reciprocal ratio and interval
    assert (back.ratio, back.low, back.high) == pytest.approx((1 / r.ratio, 1 / r.high, 1 / r.low))


def test_pairing_cancels_drift_that_both_backends_saw():
    drift = np.array([1.0, 1.1, 1.2, 1.3, 1.4])  # every round slower than the last
    a, b = 2.0 * drift * (1 + np.array([1, -1, 1, -1, 0]) * 1e-3), 1.0 * drift
    paired = stats.paired_ratio(a, b)
    assert paired.high / paired.low - 1 < 0.01 and paired.low > 1.9  # a is 2x b, told apart despite the drift


def test_paired_ratio_needs_two_matching_rounds():
    assert stats.paired_ratio([1.0], [2.0]) is stats.NO_RATIO
    assert stats.paired_ratio([1.0, 1.1], [2.0, 2.1, 2.2]) is stats.NO_RATIO


def test_independent_ratio_combines_the_two_intervals_on_the_log_scale():
    # each interval spans a factor e^(2 * 1.96 * se): se = 0.01 and 0.02 on the log scale
    z = 1.959963984540054
    new = (2.0, 2.0 * math.exp(-z * 0.01), 2.0 * math.exp(z * 0.01))
    base = (1.0, math.exp(-z * 0.02), math.exp(z * 0.02))
    r = stats.independent_ratio(new, base)
    se = math.hypot(0.01, 0.02)
    assert r.ratio == 2.0 and (r.low, r.high) == pytest.approx((2 * math.exp(-z * se), 2 * math.exp(z * se)))
    assert not stats.independent_ratio((2.0, math.nan, math.nan), base).has_interval


@pytest.mark.parametrize("ratio, low, high, expected", [
    (1.10, 1.05, 1.15, stats.SLOWER),  # excludes 1, 10% > 3%
    (0.90, 0.85, 0.95, stats.FASTER),
    (1.02, 1.01, 1.03, stats.WITHIN_NOISE),  # real, but smaller than the margin
    (1.20, 0.95, 1.50, stats.WITHIN_NOISE),  # large, but the interval holds 1
    (1.20, math.nan, math.nan, stats.WITHIN_NOISE),  # no interval: no claim
])
def test_a_difference_counts_only_when_real_and_large_enough(ratio, low, high, expected):
    assert stats.verdict(stats.Ratio(ratio, low, high, 3, "paired t"), 0.03) == expected


def _rows():
    base = dict(sweep="s", group="g", mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16,
                head_dim_v=16, seq_q=64, seq_kv=64, causal=False, dtype="fp32", page_size=0, status="ok")

    def row(backend, job, rounds, case="c1", drift=False):
        return empty_row() | base | {"backend": backend, "job_id": job, "case_id": case, "round_ms": rounds,
                                     "ms_median": float(np.median(rounds)), "drift_flag": drift}
    return to_frame([row("fast", "j1", [1.0, 1.01, 0.99]), row("slow", "j1", [2.0, 2.1, 1.9], drift=True),
                     row("other-job", "j2", [1.5, 1.5, 1.5]), row("short", "j1", [1.0, 1.0]),
                     row("fast", "j1", [1.0, 1.0, 1.0], case="c2"),
                     empty_row() | base | {"backend": "broken", "job_id": "j1", "case_id": "c1", "status": "error"}])


def test_pairs_are_the_backends_one_job_timed_side_by_side():
    p = stats.pairs(_rows(), 0.03)
    assert list(p.columns) == list(stats.PAIR_COLUMNS)
    assert p[["backend_a", "backend_b"]].values.tolist() == [["fast", "slow"]]  # not across jobs, rounds or cases
    pair = p.iloc[0]
    assert pair["ratio"] == pytest.approx(stats.paired_ratio([1.0, 1.01, 0.99], [2.0, 2.1, 1.9]).ratio)
    assert pair["faster"] == "fast" and pair["verdict"] == "fast faster" and bool(pair["drift_flag"])


def test_compare_rows_is_paired_within_a_job_and_from_the_intervals_across_jobs():
    df = _rows()
    p = stats.pairs(df, 0.03)
    rows = {(r["backend"], r["case_id"]): r for r in df.to_dict("records")}
    fast, slow, other = rows[("fast", "c1")], rows[("slow", "c1")], rows[("other-job", "c1")]
    assert stats.compare_rows(slow, fast, p).method == "paired t"
    assert stats.compare_rows(slow, fast, p).ratio == pytest.approx(1 / stats.compare_rows(fast, slow, p).ratio)
    assert stats.compare_rows(other, fast, p).method == "none"  # another job and no intervals: no claim
