"""Training-stability statistics: two spike scores, z-score exceedances, weight divergence, LR sensitivity.

Spike scores, each at its source's definition; every run reports both, side by side:

* ``olmo2_paper``: the OLMo 2 paper (Team OLMo 2024, "2 OLMo 2 Furious", arXiv:2501.00656, its
  training-stability section) defines the spike score of a loss or grad-norm series as the
  percentage of values at least seven standard deviations away from a rolling average of the last
  1000 values. Here: each point against the mean and sample standard deviation of the 1000 finite
  points before it, two-sided (|x - mean| >= 7 std), 100 x flagged / scored. Points with fewer than
  1000 finite predecessors are not scored, so a run of 1000 steps or fewer scores nothing (NaN).
* ``olmo_core``: OLMo-core's ``StabilityMonitorCallback`` (allenai/OLMo-core,
  ``src/olmo_core/train/callbacks/stability_monitor.py`` at commit 8be24cf, unchanged at fa6c501:
  defaults ``window_size = 128``, ``threshold_std = 6.0``, ``rolling_window = 10000`` on lines 29-35;
  ``_is_spike`` on lines 117-136; the scores on lines 108-114). A value is a spike when it exceeds
  the mean of the previous 128 values by more than 6 *population* standard deviations (one-sided;
  never while fewer than 128 values are held, nor when their std is below 1e-10); ``spike/SpikeScore``
  is the fraction of spike steps over the last 10,000 steps, a step counting once when its loss or
  its grad norm spikes (line 98), and ``SpikeScore (total)`` is spikes over all steps. Here: the
  fraction over the last ``min(n, 10000)`` steps (for runs shorter than 10,000 steps, OLMo-core's
  total), for loss, grad norm and either (``any``); like OLMo-core, steps that cannot be scored
  count in the denominator.

Both here leave non-finite points out of the trailing windows and never flag them (they are counted
apart); OLMo-core would let a NaN into its history. :func:`min_detectable_jump` gives, for each
definition, the smallest one-step rise above the trailing mean that it flags at the end of a series
(relative to that mean): what "no run spiked" can rule out at a run's length and noise.

* z-score exceedances (llm.c's ``--skip_update_lossz``/``gradz`` rule): z of each point against the
  mean and standard deviation of the previous 128 points; an exceedance is z > threshold.
* Weight divergence between two runs (Golden et al. 2024, "Is Flash Attention Stable?", §V): the
  paper's max |W - W_ref| over all weights, tracked over training steps; relative L2
  ||W - W_ref|| / ||W_ref||; and the 1-Wasserstein distance between the value distributions of each
  weight tensor (the paper compares weight distributions with the Wasserstein distance; computing it
  per tensor and averaging with element-count weights, ``w1_mean``, with the largest tensor's as
  ``w1_max``, is this project's convention).
* LR sensitivity (Wortsman et al. 2023, §2.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

ZSCORE_WINDOW = 128
ZSCORE_THRESHOLD = 3.0


@dataclass(frozen=True)
class SpikeDefinition:
    """One source's spike rule: trailing ``window``, ``sigma`` threshold, sides, std flavour, score unit."""

    name: str
    window: int
    sigma: float
    two_sided: bool
    ddof: int              # 1: sample std (pandas' default); 0: population std (OLMo-core)
    span: int | None       # score over the last ``span`` steps with every step in the denominator; None: scored only
    percent: bool          # report 100 x the share
    min_std: float = 0.0   # no spike where the trailing std is below this


OLMO2_PAPER = SpikeDefinition("olmo2_paper", window=1000, sigma=7.0, two_sided=True, ddof=1, span=None, percent=True)
OLMO_CORE = SpikeDefinition("olmo_core", window=128, sigma=6.0, two_sided=False, ddof=0, span=10_000, percent=False,
                            min_std=1e-10)
SPIKE_DEFINITIONS = (OLMO2_PAPER, OLMO_CORE)


def _trailing_stats(values: np.ndarray, window: int, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of the ``window`` finite points before each point; NaN where fewer exist.

    Non-finite points are dropped before the window is taken, so a window always holds ``window``
    finite values; the statistics are mapped back to the positions of the original series.
    """
    x = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(x)
    mean, std = np.full(len(x), np.nan), np.full(len(x), np.nan)
    s = pd.Series(x[finite])
    rolling = s.rolling(window, min_periods=window)
    m, d = rolling.mean().shift(1).to_numpy(), rolling.std(ddof=ddof).shift(1).to_numpy()
    # each finite point gets the stats of the finite points before it; non-finite points keep NaN (unscored)
    idx = np.flatnonzero(finite)
    mean[idx], std[idx] = m, d
    return mean, std


def spike_mask(values, definition: SpikeDefinition) -> np.ndarray:
    """True where a finite point lies ``sigma`` trailing standard deviations from the trailing mean
    (above it only, for a one-sided definition)."""
    x = np.asarray(values, dtype=np.float64)
    mean, std = _trailing_stats(x, definition.window, definition.ddof)
    with np.errstate(invalid="ignore"):
        if definition.two_sided:  # "at least seven standard deviations away"
            hit = np.abs(x - mean) >= definition.sigma * std
        else:  # OLMo-core: value > mean + threshold_std * std
            hit = x - mean > definition.sigma * std
        return np.isfinite(x) & np.isfinite(mean) & (std >= definition.min_std) & hit


@dataclass(frozen=True)
class SpikeStats:
    score: float      # percent or fraction, as the definition says; NaN when nothing could be scored
    spikes: int       # flagged points counted in the score
    scored: int       # points with a full trailing window (in the score's span)
    nonfinite: int


def _score(mask: np.ndarray, scorable: np.ndarray, n: int, definition: SpikeDefinition) -> SpikeStats:
    if definition.span is None:
        spikes, scored, denom = int(mask.sum()), int(scorable.sum()), int(scorable.sum())
    else:
        tail = slice(max(0, n - definition.span), n)
        spikes, scored, denom = int(mask[tail].sum()), int(scorable[tail].sum()), n - tail.start
        if not scored:
            denom = 0
    share = spikes / denom if denom else math.nan
    return SpikeStats(100.0 * share if definition.percent else share, spikes, scored, 0)


def _scorable(values, definition: SpikeDefinition) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    mean, _ = _trailing_stats(x, definition.window, definition.ddof)
    return np.isfinite(x) & np.isfinite(mean)


def spike_score(values, definition: SpikeDefinition) -> SpikeStats:
    """The spike score of one series under ``definition`` (see the module docstring)."""
    x = np.asarray(values, dtype=np.float64)
    stats = _score(spike_mask(x, definition), _scorable(x, definition), len(x), definition)
    return SpikeStats(stats.score, stats.spikes, stats.scored, int((~np.isfinite(x)).sum()))


def spike_score_any(series: list, definition: SpikeDefinition) -> SpikeStats:
    """OLMo-core's step-level score: a step counts once when any of the (equal-length) ``series`` spikes there."""
    xs = [np.asarray(s, dtype=np.float64) for s in series]
    mask = np.logical_or.reduce([spike_mask(x, definition) for x in xs])
    scorable = np.logical_or.reduce([_scorable(x, definition) for x in xs])
    stats = _score(mask, scorable, len(xs[0]), definition)
    return SpikeStats(stats.score, stats.spikes, stats.scored, int(sum((~np.isfinite(x)).sum() for x in xs)))


def min_detectable_jump(values, definition: SpikeDefinition) -> float:
    """The smallest one-step rise above the trailing mean that ``definition`` flags right after the series ends,
    relative to that mean: sigma x trailing std / |trailing mean| over the last ``window`` finite points.

    NaN when the series has fewer than ``window`` finite points (nothing can be flagged at all).
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)][-definition.window:]
    if len(x) < definition.window:
        return math.nan
    mean, std = float(x.mean()), float(x.std(ddof=definition.ddof))
    if std < definition.min_std:
        return math.inf
    return definition.sigma * std / abs(mean) if mean else math.nan


def spike_summary(loss, grad) -> dict:
    """Every spike column of a run summary, for both definitions, with the windows stated.

    ``spike_score_<def>_<loss|grad>`` (``olmo2_paper``: percent of scored points; ``olmo_core``:
    fraction of the last ``spike_span_olmo_core`` steps, plus ``_any``), ``spikes_<def>_<series>``
    (flagged points), ``spike_scored_<def>`` (loss points with a full window), ``spike_window_<def>``,
    ``spike_sigma_<def>`` and ``spike_min_jump_<def>_<series>`` (:func:`min_detectable_jump`).
    """
    out = {}
    for d in SPIKE_DEFINITIONS:
        for name, series in (("loss", loss), ("grad", grad)):
            stats = spike_score(series, d)
            out[f"spike_score_{d.name}_{name}"] = stats.score
            out[f"spikes_{d.name}_{name}"] = stats.spikes
            out[f"spike_min_jump_{d.name}_{name}"] = min_detectable_jump(series, d)
            if name == "loss":
                out[f"spike_scored_{d.name}"] = stats.scored
        out[f"spike_window_{d.name}"], out[f"spike_sigma_{d.name}"] = d.window, d.sigma
    either = spike_score_any([loss, grad], OLMO_CORE)
    out["spike_score_olmo_core_any"], out["spikes_olmo_core_any"] = either.score, either.spikes
    out["spike_span_olmo_core"] = min(len(loss), OLMO_CORE.span)
    return out


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
    Remark 2.19), which is what two snapshots of one tensor take: two sorts instead of a pooled
    sort and two searches.
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


DIVERGENCE_METRICS = ("max_abs", "rel_l2", "w1_mean", "w1_max")


def weight_divergence(ref: dict[str, torch.Tensor], other: dict[str, torch.Tensor],
                      device: str | torch.device = "cpu") -> dict[str, float]:
    """max_abs, rel_l2 (||other - ref|| / ||ref||), w1_mean and w1_max between two runs' weights (same architecture),
    over their floating-point tensors, computed in float64 on ``device`` (a GPU sorts 10M weights in milliseconds)."""
    if sorted(ref) != sorted(other):
        raise ValueError("weight_divergence: the two state dicts hold different parameters")
    max_abs, diff_sq, ref_sq, w1_weighted, w1_max, count = 0.0, 0.0, 0.0, 0.0, 0.0, 0
    for key in sorted(ref):
        if not ref[key].is_floating_point():
            continue
        a = ref[key].detach().to(device, torch.float64).flatten()
        b = other[key].detach().to(device, torch.float64).flatten()
        diff = b - a
        max_abs = max(max_abs, diff.abs().max().item()) if diff.numel() else max_abs
        diff_sq += diff.square().sum().item()
        ref_sq += a.square().sum().item()
        w1 = wasserstein_1(a, b)
        w1_weighted += w1 * a.numel()
        w1_max = max(w1_max, w1)
        count += a.numel()
    return {"max_abs": max_abs, "rel_l2": math.sqrt(diff_sq / ref_sq) if ref_sq else math.nan,
            "w1_mean": w1_weighted / count if count else math.nan, "w1_max": w1_max}


def lr_sensitivity(final_losses: dict[float, float], initial_loss: float) -> float:
    """Wortsman et al. 2023, §2.2: E over the learning-rate grid of [min(final loss, initial loss) - best final loss].

    Every learning rate of the grid counts: a diverged run (non-finite final loss) counts as the
    initial loss, and a truncated run with its last evaluation.
    """
    finals = [min(v, initial_loss) if math.isfinite(v) else initial_loss for v in final_losses.values()]
    return float(np.mean(finals) - min(finals)) if finals else math.nan
