"""Spike scores (both definitions), z-scores, weight divergence, LR sensitivity and seed intervals on series and
weights with known answers."""
import math

import numpy as np
import pytest
import torch

from attnbench.train import stability
from attnbench.train.intervals import interval_columns, t_interval
from attnbench.train.stability import OLMO2_PAPER, OLMO_CORE


def _noisy(n: int, seed: int = 0, level: float = 3.0, noise: float = 0.01) -> np.ndarray:
    return level + noise * np.random.default_rng(seed).standard_normal(n)


def test_olmo2_paper_score_is_two_sided_percent_over_the_previous_1000():
    x = _noisy(3000)
    planted = [1200, 1800, 2500]
    x[planted[:2]] += 1.0  # 100 sigma up
    x[planted[2]] -= 1.0  # and one 100 sigma down: "away from" the rolling average counts both ways
    assert list(np.flatnonzero(stability.spike_mask(x, OLMO2_PAPER))) == planted
    stats = stability.spike_score(x, OLMO2_PAPER)
    assert stats.spikes == 3 and stats.scored == 2000 and stats.score == pytest.approx(100 * 3 / 2000)
    assert math.isnan(stability.spike_score(x[:1000], OLMO2_PAPER).score)  # no point has 1000 predecessors


def test_olmo_core_score_is_one_sided_over_the_previous_128_with_population_std():
    x = _noisy(1000, 1)
    x[500] += 1.0
    x[700] -= 1.0  # a drop is not an OLMo-core spike
    mask = stability.spike_mask(x, OLMO_CORE)
    assert list(np.flatnonzero(mask)) == [500]
    stats = stability.spike_score(x, OLMO_CORE)
    # the denominator is every step of the last min(n, 10000), including the first 128 that cannot be scored
    assert stats.spikes == 1 and stats.scored == 1000 - 128 and stats.score == pytest.approx(1 / 1000)
    # population std (ddof 0): a point exactly at mean + 6 * pop-std of a 128-window is not "above" it
    window = np.array([0.0, 1.0] * 64)
    edge = window.mean() + 6 * window.std(ddof=0)
    assert not stability.spike_mask(np.append(window, edge), OLMO_CORE)[-1]
    assert stability.spike_mask(np.append(window, edge + 1e-9), OLMO_CORE)[-1]
    flat = np.append(np.full(128, 2.0), 2.0 + 1e-12)  # std below 1e-10: OLMo-core never calls it a spike
    assert not stability.spike_mask(flat, OLMO_CORE).any()


def test_olmo_core_span_is_the_last_10000_steps_and_any_counts_a_step_once():
    x = _noisy(12_000, 2)
    x[[300, 5000, 11_000]] += 1.0
    stats = stability.spike_score(x, OLMO_CORE)
    assert stats.spikes == 2 and stats.score == pytest.approx(2 / 10_000)  # step 300 is outside the span
    g = _noisy(12_000, 3)
    g[[5000, 7000]] += 1.0
    either = stability.spike_score_any([x, g], OLMO_CORE)
    assert either.spikes == 3 and either.score == pytest.approx(3 / 10_000)  # 5000 once, 7000, 11000


def test_nonfinite_points_are_counted_apart_never_as_spikes():
    x = _noisy(1300)
    x[1150] = np.nan
    x[1151] = np.inf
    for definition in (OLMO2_PAPER, OLMO_CORE):
        stats = stability.spike_score(x, definition)
        assert stats.nonfinite == 2 and stats.spikes == 0
        assert not stability.spike_mask(x, definition)[1150:1152].any()
    x[1200] += 1.0  # the windows after the non-finite points still see 1000 / 128 finite values
    assert stability.spike_score(x, OLMO2_PAPER).spikes == 1 and stability.spike_score(x, OLMO_CORE).spikes == 1


@pytest.mark.parametrize("steps", [60, 1000, 2000, 10_000])  # the CPU default, and the GPU recipes' run lengths
@pytest.mark.parametrize("definition", [OLMO2_PAPER, OLMO_CORE], ids=lambda d: d.name)
def test_the_smallest_detected_jump_is_what_min_detectable_jump_says(steps, definition):
    """A decaying loss with 1% noise: a final step min_jump above the trailing mean is flagged, just below is not."""
    t = np.arange(steps)
    loss = 1.4 + 3.0 * np.exp(-t / (steps / 5)) + 0.014 * np.random.default_rng(steps).standard_normal(steps)
    jump = stability.min_detectable_jump(loss, definition)
    if steps < definition.window:
        assert math.isnan(jump)
        assert not stability.spike_mask(np.append(loss, 100.0), definition)[-1]  # nothing can be flagged at all
        return
    mean = loss[-definition.window:].mean()
    assert stability.spike_mask(np.append(loss, mean * (1 + 1.001 * jump)), definition)[-1]
    assert not stability.spike_mask(np.append(loss, mean * (1 + 0.999 * jump)), definition)[-1]
    assert 0 < jump < math.inf


def test_spike_summary_states_both_windows():
    x = _noisy(1500)
    x[1400] += 1.0
    out = stability.spike_summary(x, _noisy(1500, 5))
    assert out["spike_window_olmo2_paper"] == 1000 and out["spike_sigma_olmo2_paper"] == 7.0
    assert out["spike_window_olmo_core"] == 128 and out["spike_sigma_olmo_core"] == 6.0
    assert out["spike_span_olmo_core"] == 1500 and out["spike_scored_olmo2_paper"] == 500
    assert out["spikes_olmo2_paper_loss"] == 1 and out["spike_score_olmo2_paper_loss"] == pytest.approx(0.2)
    assert out["spikes_olmo_core_any"] == 1 and out["spike_score_olmo_core_grad"] == 0


def test_zscore_exceedances_count_upward_outliers_against_the_trailing_window():
    x = _noisy(400, 2)
    x[[200, 300]] += 0.2  # 20 sigma
    z = stability.zscores(x, window=128)
    assert np.isnan(z[:128]).all()
    assert z[200] > 10 and z[300] > 10
    assert stability.zscore_exceedances(x, window=128, threshold=10) == 2


def test_wasserstein_matches_known_values():
    a = torch.tensor([0.0, 1.0, 3.0])
    b = torch.tensor([5.0, 2.0, 0.0])
    # equal sizes: mean |sort(a) - sort(b)| = (0 + 1 + 2) / 3
    assert stability.wasserstein_1(a, b) == pytest.approx(1.0)
    assert stability.wasserstein_1(b, a) == pytest.approx(1.0)
    assert stability.wasserstein_1(a, a + 0.25) == pytest.approx(0.25)  # a shift moves all mass by 0.25
    assert stability.wasserstein_1(torch.tensor([0.0, 1.0]), torch.tensor([0.0])) == pytest.approx(0.5)
    assert stability.wasserstein_1(a, a[[2, 0, 1]]) == 0.0  # blind to permutations: why max_abs is reported too
    rng = torch.Generator().manual_seed(0)
    u, v = torch.randn(4000, generator=rng), torch.randn(3000, generator=rng) * 2 + 1
    # against the quantile form, integral_0^1 |F^-1(t) - G^-1(t)| dt on a fine grid
    t = torch.linspace(0, 1, 200_001)[1:-1].double()

    def quantile_form(a, b):
        return (torch.quantile(a.double(), t, interpolation="lower")
                - torch.quantile(b.double(), t, interpolation="lower")).abs().mean().item()

    assert stability.wasserstein_1(u, v) == pytest.approx(quantile_form(u, v), rel=2e-3)
    w = u[:3000]  # equal sizes take the sorted-difference path: it matches the quantile form too
    assert stability.wasserstein_1(w, v) == pytest.approx(quantile_form(w, v), rel=2e-3)


def test_weight_divergence_is_per_tensor_w1_with_the_papers_max_abs():
    a = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "v": torch.tensor([1.0, 2.0]), "step": torch.tensor(3)}
    b = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.5]]), "v": torch.tensor([2.0, 1.0]), "step": torch.tensor(9)}
    div = stability.weight_divergence(a, b)
    assert div["max_abs"] == pytest.approx(1.0)  # v's elements swapped places: |1 - 2|
    assert div["rel_l2"] == pytest.approx(math.sqrt(0.25 + 2) / math.sqrt(25 + 5))
    # W1 per tensor: w moved one of 4 values by 0.5 -> 0.125; v is a permutation -> 0; weights 4 and 2
    assert div["w1_mean"] == pytest.approx((0.125 * 4 + 0.0 * 2) / 6) and div["w1_max"] == pytest.approx(0.125)
    assert stability.weight_divergence(a, a) == {"max_abs": 0.0, "rel_l2": 0.0, "w1_mean": 0.0, "w1_max": 0.0}
    with pytest.raises(ValueError, match="different parameters"):
        stability.weight_divergence(a, {"u": a["w"]})


def test_lr_sensitivity_follows_wortsman_et_al():
    # initial loss 5.5; finals 3.0 (best), 3.5, and one diverged (counts as 5.5) -> mean(3, 3.5, 5.5) - 3
    score = stability.lr_sensitivity({1e-3: 3.5, 1e-2: 3.0, 1e-1: math.nan}, initial_loss=5.5)
    assert score == pytest.approx((3.0 + 3.5 + 5.5) / 3 - 3.0)
    assert stability.lr_sensitivity({1e-3: 9.0, 1e-2: 3.0}, initial_loss=5.5) == pytest.approx((5.5 + 3.0) / 2 - 3.0)


def test_t_interval_of_known_values():
    ci = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729749464 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert (ci.mean, ci.n) == (2.0, 3) and ci.low == pytest.approx(2 - half) and ci.high == pytest.approx(2 + half)
    one = t_interval([5.0, math.nan])
    assert one.mean == 5.0 and one.n == 1 and math.isnan(one.low)
    assert interval_columns("x", [])["x_n"] == 0
