"""Training-stability statistics: spike score, z-score exceedances, weight divergence.

* Spike score (OLMo 2, Team OLMo 2024, §3.2 "spike score"): the share of points of a
  loss or grad-norm series that lie more than 7 standard deviations *above* the
  rolling mean of the previous ``window`` (1000) points. OLMo 2 words it "away from";
  for loss and grad norm only upward jumps are spikes, and early training drops the
  loss far below any trailing window, which a two-sided test would count as spikes.
  Points with fewer than ``window`` finite predecessors are not scored; non-finite
  points are counted apart (``nonfinite``), never as spikes.
* z-score exceedances (llm.c's ``--skip_update_lossz``/``gradz`` rule): z of each point
  against the mean and standard deviation of the previous 128 points; an exceedance
  is z > threshold.
* Weight divergence between two runs (Golden et al. 2024, "Is Flash Attention
  Stable?", §4): max |a - b|, relative L2 ||a - b|| / ||a||, and the 1-Wasserstein
  distance between the empirical distributions of the two weight vectors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

SPIKE_SIGMA = 7.0
SPIKE_WINDOW = 1000
ZSCORE_WINDOW = 128
ZSCORE_THRESHOLD = 3.0


def short_run_window(n_points: int, window: int = SPIKE_WINDOW, min_window: int = 10) -> int:
    """The trailing window a series of ``n_points`` can afford: ``window``, or a fifth of the run if shorter.

    OLMo 2's 1000 steps assume runs of tens of thousands of steps; a 200-step run
    scores with a 40-step window (never under ``min_window``). Every summary states the
    window it used.
    """
    return max(min_window, min(window, n_points // 5))


def _trailing_stats(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (sample) std of the ``window`` finite points before each point; NaN where fewer exist."""
    s = pd.Series(np.where(np.isfinite(values), values, np.nan))
    rolling = s.rolling(window, min_periods=window)
    return rolling.mean().shift(1).to_numpy(), rolling.std().shift(1).to_numpy()


@dataclass(frozen=True)
class SpikeStats:
    score: float      # spikes / scored points (NaN when nothing could be scored)
    spikes: int
    scored: int
    nonfinite: int
    window: int
    sigma: float


def spike_mask(values, window: int = SPIKE_WINDOW, sigma: float = SPIKE_SIGMA) -> np.ndarray:
    """True where a point exceeds the trailing mean of the previous ``window`` points by ``sigma`` std."""
    x = np.asarray(values, dtype=np.float64)
    mean, std = _trailing_stats(x, window)
    with np.errstate(invalid="ignore"):
        return np.isfinite(x) & np.isfinite(mean) & (x > mean + sigma * std)


def spike_score(values, window: int = SPIKE_WINDOW, sigma: float = SPIKE_SIGMA) -> SpikeStats:
    x = np.asarray(values, dtype=np.float64)
    mean, _ = _trailing_stats(x, window)
    scored = int((np.isfinite(x) & np.isfinite(mean)).sum())
    spikes = int(spike_mask(x, window, sigma).sum())
    return SpikeStats(spikes / scored if scored else math.nan, spikes, scored, int((~np.isfinite(x)).sum()),
                      window, sigma)


def zscores(values, window: int = ZSCORE_WINDOW) -> np.ndarray:
    """z of each point against the previous ``window`` finite points (NaN where fewer exist or std is 0)."""
    x = np.asarray(values, dtype=np.float64)
    mean, std = _trailing_stats(x, window)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (x - mean) / std
    return np.where(std > 0, z, np.nan)


def zscore_exceedances(values, window: int = ZSCORE_WINDOW, threshold: float = ZSCORE_THRESHOLD) -> int:
    with np.errstate(invalid="ignore"):
        return int((zscores(values, window) > threshold).sum())


def wasserstein_1(a: torch.Tensor, b: torch.Tensor) -> float:
    """1-Wasserstein distance between the empirical distributions of the values of ``a`` and ``b``.

    In one dimension W1(P, Q) = integral over x of |F_P(x) - F_Q(x)| dx (Vallender 1973;
    Villani 2009, Remark 2.19), where F are the empirical CDFs. Both CDFs are step
    functions that only change at the pooled sorted values x_(1) <= ... <= x_(n+m),
    so the integral is the finite sum over i of |F_P(x_(i)) - F_Q(x_(i))| (x_(i+1) - x_(i)).
    For equal sizes it equals mean |sort(a) - sort(b)| (the monotone coupling; Villani 2009,
    Remark 2.19), which is what two snapshots of one model take: two sorts instead of a pooled
    sort and two searches (seconds instead of minutes at 10M weights on a CPU).
    """
    a = a.detach().flatten().double()
    b = b.detach().flatten().to(a.device, torch.float64)
    a_sorted, b_sorted = a.sort().values, b.sort().values
    if a.numel() == b.numel():
        return float((a_sorted - b_sorted).abs().mean())
    pooled = torch.cat((a_sorted, b_sorted)).sort().values
    gaps = pooled.diff()  # (n + m - 1,)
    at = pooled[:-1]
    cdf_a = torch.searchsorted(a_sorted, at, right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b_sorted, at, right=True).double() / b.numel()
    return float(((cdf_a - cdf_b).abs() * gaps).sum())


def flat_weights(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """All floating-point tensors of a state dict, in key order, as one fp32 vector."""
    return torch.cat([state[k].detach().float().flatten() for k in sorted(state) if state[k].is_floating_point()])


def weight_divergence(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                      device: str | torch.device = "cpu") -> dict[str, float]:
    """max_abs, rel_l2 (||a - b|| / ||a||) and wasserstein between two runs' weights (same architecture),
    computed on ``device`` (a GPU sorts the 10M-weight vectors in milliseconds)."""
    if sorted(a) != sorted(b):
        raise ValueError("weight_divergence: the two state dicts hold different parameters")
    wa, wb = (flat_weights(state).to(device, torch.float64) for state in (a, b))
    diff = wa - wb
    norm = wa.norm().item()
    return {"max_abs": diff.abs().max().item(), "rel_l2": diff.norm().item() / norm if norm else math.nan,
            "wasserstein": wasserstein_1(wa, wb)}


def lr_sensitivity(final_losses: dict[float, float], initial_loss: float) -> float:
    """Wortsman et al. 2023, §3.2: E over learning rates of [min(final loss, initial loss) - best final loss].

    A diverged (non-finite) run counts as the initial loss.
    """
    finals = [min(v, initial_loss) if math.isfinite(v) else initial_loss for v in final_losses.values()]
    return float(np.mean(finals) - min(finals)) if finals else math.nan
