"""Timing records and the three timers: do_bench, CUDA-graph replay, torch.utils.benchmark.

A :class:`Timing` keeps the raw per-call samples in seconds and derives its
statistics (the habit of ``torch.utils.benchmark.Measurement``: raw samples
stored, median and quantiles preferred over mean and std).

* CUDA, normal cases: ``triton.testing.do_bench`` with ``return_mode="all"``:
  CUDA events around each call, the L2 flushed (a 256 MB write) before each.
* CUDA, short cases (decode, or a first estimate under 50 us): one call captured
  in a CUDA graph, then per rep: flush L2 (outside the graph), event, replay,
  event. Launch gaps vanish while the L2 stays cold (FlashInfer #4468 is the
  trap of flushing inside or not at all). A few untimed replays come first: the
  first replay uploads the graph and would be an outlier.
* CUDA, host-bound callables: events time the GPU, but when the host takes
  longer to enqueue a call than the GPU takes to run it (Python-heavy launchers:
  CuTe DSL, FlashInfer's wrappers), the GPU drains its queue and samples
  include host time. A call whose host enqueue time reaches half its device
  median is re-timed by graph replay too.
* CPU: ``torch.utils.benchmark.Timer.blocked_autorange``.

Clocks: a GPU at its power limit lowers its SM clock within tens of ms of
sustained load (the H200 anchor run saw 1980 -> 1650 MHz under cuDNN), so a
short warm-up mixes boost-clock and throttled samples (a large CV, medians that
move between runs). ``warmup_ms`` long enough to reach the throttled steady
state (hundreds of ms) is the remedy short of locking clocks.

Rounds: a (case, backend) is timed in ``timing.repeats`` rounds (:class:`Rounds`), each one call
of the timer chosen in the first round (``method``), the backends of a case in rotating order
within a round (:mod:`attnbench.bench.microbench`). A row's median is over every sample of its
rounds; its interval and the paired ratios come from :mod:`attnbench.bench.stats`.

Drift: a job re-times its first measured case after every case; a relative change
beyond :data:`DRIFT_LIMIT` (3%, the tolerance asked of two independent runs'
medians) at the job's end flags the job's rows (``drift_flag``); the rows of a job stopped
part-way carry the change up to their case's end.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from attnbench.bench import stats

GRAPH_THRESHOLD_S = 50e-6
HOST_BOUND_FRACTION = 0.5  # host enqueue time / device time from which events may time the host
HOST_CHECK_MAX_S = 2e-3  # slower calls are not checked: no launcher spends a millisecond per call on the host
L2_FLUSH_BYTES = 256 * 1024 * 1024
GRAPH_WARMUP_REPLAYS = 5
DRIFT_LIMIT = 0.03


@dataclass(frozen=True)
class Timing:
    method: str
    times_s: tuple[float, ...] = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.times_s)

    def quantile(self, q: float) -> float:
        xs = sorted(self.times_s)
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    @property
    def median(self) -> float:
        return statistics.median(self.times_s)

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean) of the samples."""
        if self.n < 2:
            return float("nan")
        return statistics.stdev(self.times_s) / statistics.fmean(self.times_s)


@dataclass(frozen=True)
class Rounds:
    """The kept rounds of one (case, backend): one :class:`Timing` per round, all with one timer."""

    timings: tuple[Timing, ...]

    @property
    def method(self) -> str:
        return self.timings[0].method

    @property
    def samples(self) -> tuple[float, ...]:
        return tuple(t for timing in self.timings for t in timing.times_s)

    @property
    def pooled(self) -> Timing:
        return Timing(self.method, self.samples)

    @property
    def n_rounds(self) -> int:
        return len(self.timings)

    @property
    def round_medians(self) -> list[float]:
        return [t.median for t in self.timings]

    def ci(self) -> tuple[float, float]:
        """95% interval of the median of all samples (two-level bootstrap, :func:`stats.median_ci`)."""
        return stats.median_ci([t.times_s for t in self.timings])

    @property
    def round_cv(self) -> float:
        """Spread between rounds: the CV of the round medians."""
        return stats.cv(self.round_medians)


MIN_REPS = 10
MAX_GRAPH_REPS = 200


def _time_do_bench(fn: Callable, warmup_ms: float, rep_ms: float, estimate_s: float | None = None,
                   min_reps: int = MIN_REPS) -> Timing:
    """do_bench sizes its repetitions from ``rep_ms``; slow calls get at least ``min_reps`` samples."""
    from triton.testing import do_bench

    if estimate_s:
        rep_ms = max(rep_ms, min_reps * estimate_s * 1e3)
    times_ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    return Timing("do_bench", tuple(t * 1e-3 for t in times_ms))


def _time_cuda_graph(fn: Callable, reps: int) -> Timing:
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as graph capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(GRAPH_WARMUP_REPLAYS):
        flush.zero_()
        graph.replay()
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return Timing("cuda_graph", tuple(s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)))


def _time_cpu(fn: Callable, min_run_time_s: float) -> Timing:
    from torch.utils.benchmark import Timer

    m = Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time_s)
    return Timing("torch.utils.benchmark", tuple(t for t in m.times))


def host_enqueue_s(fn: Callable, calls: int = 10) -> float:
    """Median host time to enqueue one call of an asynchronous ``fn`` (its device work is not waited for)."""
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times)


def wants_graph(device_median_s: float, host_s: float) -> bool:
    """Graph replay is the faithful timer for short calls and for calls whose host launch cost rivals the kernel."""
    return device_median_s < GRAPH_THRESHOLD_S or host_s >= HOST_BOUND_FRACTION * device_median_s


def graph_reps_for(estimate_s: float | None, rep_ms: float, max_reps: int = MAX_GRAPH_REPS,
                   min_reps: int = MIN_REPS) -> int:
    """Replays that fill ``rep_ms`` at ``estimate_s`` per call, between ``min_reps`` and ``max_reps``.

    A 40 ms decode call (sdpa-math at a 16k KV cache) gets ``min_reps`` replays, not 200 (8 s a row).
    """
    if not estimate_s or estimate_s <= 0:
        return max(max_reps, min_reps)
    return int(min(max(max_reps, min_reps), max(min_reps, rep_ms * 1e-3 / estimate_s)))


def time_callable(fn: Callable, device: str, *, prefer_graph: bool = False, warmup_ms: float = 25,
                  rep_ms: float = 100, cpu_min_run_time_s: float = 0.2,
                  estimate_s: float | None = None, min_reps: int = MIN_REPS, method: str | None = None) -> Timing:
    """Time ``fn`` on ``device`` with the right timer for it (see module docstring).

    ``estimate_s`` (e.g. the first call's wall time) lets slow calls get at least ``min_reps``
    samples (``timing.min_reps``) and sizes the graph replays (:func:`graph_reps_for`).
    ``method`` (the ``method`` of an earlier round's Timing) uses that timer again without choosing.
    """
    if device == "cpu":
        return _time_cpu(fn, cpu_min_run_time_s)
    if method == "do_bench":
        return _time_do_bench(fn, warmup_ms, rep_ms, estimate_s, min_reps)
    if method == "cuda_graph":
        prefer_graph = True
    if not prefer_graph:
        first = _time_do_bench(fn, warmup_ms, rep_ms, estimate_s, min_reps)
        host_s = host_enqueue_s(fn) if first.median < HOST_CHECK_MAX_S else 0.0
        if not wants_graph(first.median, host_s):
            return first
        estimate_s = first.median
    try:
        return _time_cuda_graph(fn, graph_reps_for(estimate_s, rep_ms, min_reps=min_reps))
    except RuntimeError:  # a kernel that cannot be captured (host sync inside): time it eagerly
        torch.cuda.synchronize()
        return _time_do_bench(fn, warmup_ms, rep_ms, min_reps=min_reps)
