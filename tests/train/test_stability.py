"""Spike score, z-scores, weight divergence and LR sensitivity on series and weights with known answers."""
import math

import numpy as np
import pytest
import torch

from attnbench.train import stability


def _noisy(n: int, seed: int = 0) -> np.ndarray:
    return 3.0 + 0.01 * np.random.default_rng(seed).standard_normal(n)


def test_spike_score_finds_exactly_the_planted_spikes():
    x = _noisy(3000)
    planted = [1200, 1800, 2500]
    x[planted] += 1.0  # 100 sigma of the noise
    mask = stability.spike_mask(x, window=1000)
    assert list(np.flatnonzero(mask)) == planted
    stats = stability.spike_score(x, window=1000)
    assert stats.spikes == 3 and stats.scored == 2000 and stats.score == pytest.approx(3 / 2000)
    assert stats.window == 1000 and stats.sigma == 7.0


def test_spike_score_ignores_drops_and_small_bumps():
    x = _noisy(600)
    x[300:] -= 1.0  # a drop (the early loss curve) is not a spike
    x[450] += 0.05  # 5 sigma: under the 7-sigma bar
    assert stability.spike_score(x, window=100).spikes == 0
    decreasing = 5.0 * np.exp(-np.arange(500) / 100) + _noisy(500, 1)
    assert stability.spike_score(decreasing, window=50).spikes == 0


def test_nonfinite_points_are_counted_apart_never_as_spikes():
    x = _noisy(300)
    x[150] = np.nan
    x[151] = np.inf
    stats = stability.spike_score(x, window=50)
    assert stats.nonfinite == 2 and stats.spikes == 0
    assert not stability.spike_mask(x, window=50)[150:152].any()


def test_short_runs_get_a_shorter_stated_window():
    assert stability.short_run_window(100_000) == 1000
    assert stability.short_run_window(200) == 40
    assert stability.short_run_window(20) == 10


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
    # equal sizes take the sorted-difference path: it matches the quantile form too
    w = u[:3000]
    assert stability.wasserstein_1(w, v) == pytest.approx(quantile_form(w, v), rel=2e-3)


def test_weight_divergence_of_known_state_dicts():
    a = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.0]]), "step": torch.tensor(3)}
    b = {"w": torch.tensor([[3.0, 0.0], [0.0, 4.5]]), "step": torch.tensor(9)}
    div = stability.weight_divergence(a, b)
    assert div["max_abs"] == pytest.approx(0.5)
    assert div["rel_l2"] == pytest.approx(0.5 / 5.0)
    assert div["wasserstein"] == pytest.approx(0.5 / 4)
    assert stability.weight_divergence(a, a) == {"max_abs": 0.0, "rel_l2": 0.0, "wasserstein": 0.0}
    with pytest.raises(ValueError, match="different parameters"):
        stability.weight_divergence(a, {"v": a["w"]})


def test_lr_sensitivity_follows_wortsman_et_al():
    # initial loss 5.5; finals 3.0 (best), 3.5, and one diverged (counts as 5.5) -> mean(3, 3.5, 5.5) - 3
    score = stability.lr_sensitivity({1e-3: 3.5, 1e-2: 3.0, 1e-1: math.nan}, initial_loss=5.5)
    assert score == pytest.approx((3.0 + 3.5 + 5.5) / 3 - 3.0)
    assert stability.lr_sensitivity({1e-3: 9.0, 1e-2: 3.0}, initial_loss=5.5) == pytest.approx((5.5 + 3.0) / 2 - 3.0)
