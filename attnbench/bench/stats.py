"""The statistics behind every timing claim: intervals of a median, ratios with intervals, verdicts.

A (case, backend) is timed in R rounds (``timing.repeats``), each round a timer call with its own
samples; within a round the backends of a case run one after another in rotating order
(:mod:`attnbench.bench.microbench`). docs/statistics.md states the methods and their sources:

* **Interval of a row's median** (:func:`median_ci`): a two-level (hierarchical) bootstrap,
  resampling rounds with replacement and then samples within each chosen round with replacement,
  the median of each pooled resample, and the 2.5% and 97.5% percentiles of those medians (the
  percentile interval, Efron & Tibshirani 1993, ch. 13). Resampling at both levels is Kalibera &
  Jones's method for benchmarks repeated at several levels ("Rigorous Benchmarking in Reasonable
  Time", ISMM 2013; Davison & Hinkley 1997, §3.8 for hierarchical data): the round-to-round spread
  (clocks, temperature, other processes) is part of the interval, not only the spread of samples
  inside one round. Resamples are drawn from a fixed seed, so a row's interval is reproducible.
* **Paired ratio of two backends** (:func:`paired_ratio`): the per-round ratios r_i = a_i / b_i of
  their round medians (a and b timed back to back in each round, so drift common to both cancels)
  give the geometric mean ratio exp(mean(log r)) and the Student-t interval
  exp(mean ± t_{0.975, R-1} · sd / √R) on log r: the paired-observation method (Jain 1991, "The
  Art of Computer Systems Performance Analysis", §13.4.1) on log ratios, so that a/b and b/a get
  reciprocal intervals.
* **Ratio of two rows timed apart** (:func:`independent_ratio`, used by ``attnbench compare`` for two
  files or sweeps and for rows of two jobs): the ratio of the rows' medians, and the interval from
  their two intervals on the log scale, se = (log high - log low) / (2 z) each, combined as
  sqrt(se_1^2 + se_2^2) (Altman & Bland 2003, "Interaction revisited: the difference between two
  estimates", BMJ 326:219). It is centred on the ratio the tables show; rows without an interval
  (backends added as rules, old files) give none.
* **Verdicts** (:func:`verdict`): a ratio counts as a difference only when its interval excludes 1
  *and* its margin max(ratio, 1/ratio) - 1 exceeds a threshold (``report.min_margin`` for winners,
  ``--threshold`` for ``attnbench compare``): significant and large enough to matter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000  # enough for a percentile interval (Efron & Tibshirani 1993, §13.3)
BOOTSTRAP_SEED = 0x5EED

FASTER, WITHIN_NOISE, SLOWER = -1, 0, 1


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean); NaN under two samples."""
    x = np.asarray(samples, float)
    return float(x.std(ddof=1) / x.mean()) if len(x) >= 2 and x.mean() else math.nan


def median_ci(rounds: Sequence[Sequence[float]], confidence: float = CONFIDENCE,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of the median of all samples, by a two-level bootstrap over rounds and samples.

    With one round it is the ordinary bootstrap of the samples (which assumes them independent:
    an interval that is too narrow when one round's samples drift together).
    """
    arrays = [np.asarray(r, float) for r in rounds if len(r)]
    if sum(len(a) for a in arrays) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    medians = np.empty(resamples)
    n_rounds = len(arrays)
    for b in range(resamples):
        picked = rng.integers(0, n_rounds, n_rounds)
        medians[b] = np.median(np.concatenate([arrays[i][rng.integers(0, len(arrays[i]), len(arrays[i]))]
                                               for i in picked]))
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(medians, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Ratio:
    """A time ratio (first over second: above 1, the first is slower) with its interval."""

    ratio: float
    low: float
    high: float
    n: int  # rounds of a paired ratio; 0 for one of rows timed apart
    method: str  # "paired t", "row intervals" or "none"

    @property
    def margin(self) -> float:
        """How far from a tie, symmetric in a/b: max(ratio, 1/ratio) - 1."""
        if not (self.ratio > 0):
            return math.nan
        return max(self.ratio, 1 / self.ratio) - 1

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def inverted(self) -> "Ratio":
        """The same comparison seen from the other side (b over a)."""
        return Ratio(1 / self.ratio, 1 / self.high, 1 / self.low, self.n, self.method)


NO_RATIO = Ratio(math.nan, math.nan, math.nan, 0, "none")


def _t_interval(logs: np.ndarray, se: float, dof: float, confidence: float) -> tuple[float, float, float]:
    from scipy import stats

    centre = float(np.mean(logs)) if logs.ndim else float(logs)
    half = float(stats.t.ppf(0.5 + confidence / 2, dof)) * se if se > 0 else 0.0
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def paired_ratio(a_rounds: Sequence[float], b_rounds: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """Geometric mean of the per-round ratios a_i / b_i and its paired Student-t interval (R >= 2)."""
    a, b = np.asarray(a_rounds, float), np.asarray(b_rounds, float)
    if len(a) != len(b) or len(a) < 2 or not (np.all(a > 0) and np.all(b > 0)):
        return NO_RATIO
    logs = np.log(a / b)
    n = len(logs)
    ratio, lo, hi = _t_interval(logs, float(logs.std(ddof=1)) / math.sqrt(n), n - 1, confidence)
    return Ratio(ratio, lo, hi, n, "paired t")


def independent_ratio(new: tuple[float, float, float], base: tuple[float, float, float],
                      confidence: float = CONFIDENCE) -> Ratio:
    """new / base of two (median, low, high) estimates made apart, with the interval of their ratio.

    The two intervals (at ``confidence``) give each median's standard error on the log scale,
    se = (log high - log low) / (2 z); the ratio's is the root sum of squares (Altman & Bland 2003).
    """
    from scipy import stats

    (m1, lo1, hi1), (m0, lo0, hi0) = new, base
    if not (m0 > 0 and m1 > 0):
        return NO_RATIO
    if not all(math.isfinite(v) and v > 0 for v in (lo1, hi1, lo0, hi0)):
        return Ratio(m1 / m0, math.nan, math.nan, 0, "none")
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    se = math.hypot(math.log(hi1 / lo1), math.log(hi0 / lo0)) / (2 * z)
    ratio = m1 / m0
    return Ratio(ratio, ratio * math.exp(-z * se), ratio * math.exp(z * se), 0, "row intervals")


def verdict(r: Ratio, threshold: float) -> int:
    """SLOWER (+1) / FASTER (-1) when the interval excludes 1 and the margin exceeds ``threshold``, else 0.

    Without an interval nothing is claimed (0): a difference that cannot be told from noise is not one.
    """
    if not (r.has_interval and r.margin > threshold):
        return WITHIN_NOISE
    if r.low > 1:
        return SLOWER
    if r.high < 1:
        return FASTER
    return WITHIN_NOISE


def present(value) -> bool:
    """A cell that holds a value (not None, NaN or pd.NA); list cells count as present."""
    if value is None or value is pd.NA:
        return False
    return not (isinstance(value, float) and math.isnan(value))


def flag(value) -> bool:
    """A boolean cell, missing values False (a row without a drift check is not flagged)."""
    return bool(value) if present(value) else False


def rounds_of(row) -> list[float]:
    """A row's per-round medians (``round_ms``) as floats; [] when it has none."""
    value = row.get("round_ms")
    return [float(v) for v in value] if present(value) else []


def row_ratio(new, base) -> Ratio:
    """new / base time of two results rows timed apart (two runs, or two jobs): :func:`independent_ratio`."""
    return independent_ratio(*((float(row["ms_median"]), float(row["ms_ci_low"]), float(row["ms_ci_high"]))
                               for row in (new, base)))


# --------------------------------------------------------------------------------------------- pairs

PAIR_KEYS = ("sweep", "group", "job_id", "case_id", "mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk",
             "head_dim_v", "seq_q", "seq_kv", "causal", "dtype", "page_size")
# The pairs table (:func:`pairs`; the microbench stage's `pairs` table is built from it): name -> (type, meaning).
PAIR_COLUMNS = {
    **{k: ("key", "the case and the job both rows come from") for k in PAIR_KEYS},
    "backend_a": ("string", "first backend (earlier in the job's backend list)"),
    "backend_b": ("string", "second backend"),
    "ms_a": ("number", "backend_a's median time, ms"),
    "ms_b": ("number", "backend_b's median time, ms"),
    "n_rounds": ("integer", "rounds both backends completed (the pairs of the ratio)"),
    "ratio": ("number", "geometric mean over rounds of time_a / time_b (above 1: a is slower)"),
    "ratio_ci_low": ("number", "95% paired Student-t interval of the ratio, low end"),
    "ratio_ci_high": ("number", "95% paired Student-t interval of the ratio, high end"),
    "margin": ("number", "max(ratio, 1/ratio) - 1"),
    "faster": ("string", "the faster backend where the interval excludes 1 and margin > min_margin; '' for a tie"),
    "verdict": ("string", "'<backend> faster' or 'tie within noise'"),
    "drift_flag": ("boolean", "either row comes from a job whose clocks drifted (drift_flag)"),
}


def pair_verdict(r: Ratio, a: str, b: str, min_margin: float) -> tuple[str, str]:
    """(faster backend or '', words) for time_a / time_b."""
    v = verdict(r, min_margin)
    faster = {SLOWER: b, FASTER: a}.get(v, "")
    return faster, (f"{faster} faster" if faster else "tie within noise")


def pairs(rows: pd.DataFrame, min_margin: float) -> pd.DataFrame:
    """Every two measured backends of a case within one job (same ``job_id``): paired ratio, interval, verdict.

    Only rows with status ``ok`` and per-round medians of equal length pair up; rows of backends added
    as rules (their own process, no rounds) and rows of other jobs never do.
    """
    out = []
    if "job_id" in rows and "round_ms" in rows:
        ok = rows[(rows["status"] == "ok") & rows["job_id"].notna() & rows["round_ms"].notna()]
        for _, group in ok.groupby(["job_id", "case_id"], sort=False):
            records = group.to_dict("records")
            for i, a in enumerate(records):
                for b in records[i + 1:]:
                    r = paired_ratio(rounds_of(a), rounds_of(b))
                    if r is NO_RATIO:
                        continue
                    faster, words = pair_verdict(r, a["backend"], b["backend"], min_margin)
                    out.append({**{k: a.get(k) for k in PAIR_KEYS}, "backend_a": a["backend"],
                                "backend_b": b["backend"], "ms_a": a["ms_median"], "ms_b": b["ms_median"],
                                "n_rounds": r.n, "ratio": r.ratio, "ratio_ci_low": r.low, "ratio_ci_high": r.high,
                                "margin": r.margin, "faster": faster, "verdict": words,
                                "drift_flag": flag(a.get("drift_flag")) or flag(b.get("drift_flag"))})
    frame = pd.DataFrame(out, columns=list(PAIR_COLUMNS))
    return frame.astype({"n_rounds": "Int64", "drift_flag": "boolean"})


def lookup_pair(pair_table: pd.DataFrame, job_id, case_id, a: str, b: str) -> Ratio | None:
    """time_a / time_b from the pairs table, in either stored orientation; None when the two were not paired."""
    if pair_table is None or pair_table.empty or not present(job_id):
        return None
    same = pair_table[(pair_table["job_id"] == job_id) & (pair_table["case_id"] == case_id)]
    for x, y, flip in ((a, b, False), (b, a, True)):
        hit = same[(same["backend_a"] == x) & (same["backend_b"] == y)]
        if len(hit):
            h = hit.iloc[0]
            r = Ratio(float(h["ratio"]), float(h["ratio_ci_low"]), float(h["ratio_ci_high"]), int(h["n_rounds"]),
                      "paired t")
            return r.inverted() if flip else r
    return None


def compare_rows(first, second, pair_table: pd.DataFrame | None) -> Ratio:
    """time(first) / time(second) for two rows of one case: paired when one job timed both, else unpaired."""
    job = first.get("job_id")
    if present(job) and present(second.get("job_id")) and job == second.get("job_id"):
        paired = lookup_pair(pair_table, first["job_id"], first["case_id"], first["backend"], second["backend"])
        if paired is not None:
            return paired
    return row_ratio(first, second)
