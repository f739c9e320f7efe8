"""Timing fidelity: statistics, the timer choice, drift flag, setup time, GPU naming for clocks."""
import time

import pytest
import torch

from attnbench.bench import microbench, timing
from attnbench.case import Case
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.bench.gpu import gpu_selector
from attnbench.bench.results import to_frame
from attnbench.bench.timing import Timing, time_callable, wants_graph
from attnbench.kernels import registry
from attnbench.kernels.registry import Backend


def tiny(**kw):
    base = dict(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16,
                seq_q=16, seq_kv=16, causal=False, dtype="fp32")
    base.update(kw)
    return Case(**base)


def test_timing_statistics_from_raw_samples():
    t = Timing("x", (1.0, 2.0, 3.0, 4.0, 100.0))
    assert t.n == 5 and t.median == 3.0
    assert t.quantile(0.0) == 1.0 and t.quantile(1.0) == 100.0 and t.quantile(0.25) == 2.0
    assert t.cv == pytest.approx(43.6176 / 22, rel=1e-4)  # std/mean: one outlier dominates it, the median not
    assert Timing("x", (5.0,)).cv != Timing("x", (5.0,)).cv  # NaN with one sample


@pytest.mark.parametrize("device_s, host_s, graph", [
    (20e-6, 1e-6, True),  # short: launch gaps would dominate
    (500e-6, 30e-6, False),  # host far ahead of the GPU: events time the kernel
    (200e-6, 150e-6, True),  # a Python-heavy launcher nearly as slow as the kernel
    (200e-6, 100e-6, True),
])
def test_graph_replay_for_short_or_host_bound_calls(device_s, host_s, graph):
    assert wants_graph(device_s, host_s) is graph


@pytest.mark.parametrize("estimate_s, reps", [
    (40e-3, timing.MIN_REPS),  # a slow decode call: the floor, not seconds of replays
    (1e-3, 100),  # 100 ms of replays at 1 ms a call
    (10e-6, timing.MAX_GRAPH_REPS),  # short calls: the cap
    (None, timing.MAX_GRAPH_REPS),  # no estimate: the cap
])
def test_graph_replays_fill_the_rep_budget(estimate_s, reps):
    assert timing.graph_reps_for(estimate_s, rep_ms=100) == reps


def test_cpu_timer_is_torch_utils_benchmark():
    x = torch.randn(64, 64)
    t = time_callable(lambda: x @ x, "cpu", cpu_min_run_time_s=0.02)
    assert t.method == "torch.utils.benchmark" and t.n >= 1 and t.median > 0


class _Recording(Backend):
    """A backend whose build takes a known time and whose attention records its keyword arguments."""

    name = "recording"
    family = "fused"
    build_sleep_s = 0.05
    seen: list = []

    def attention(self, q, k, v, *, causal, scale, **kw):
        _Recording.seen.append(kw)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    def build(self, case, tensors):
        time.sleep(self.build_sleep_s)  # stands in for planning / JIT done in build()
        return super().build(case, tensors)


@pytest.fixture
def recording(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", {**registry.all_backends(), "recording": _Recording()})
    _Recording.seen = []
    return "recording"


def test_setup_time_includes_build(recording):
    rows = run_group([tiny()], [recording], RunOptions(cpu_min_run_time_s=0.01), log=lambda s: None)
    assert rows[0]["status"] == "ok" and rows[0]["setup_s"] >= _Recording.build_sleep_s


def test_numerics_of_a_paged_case_check_the_built_path(recording):
    cases = [tiny(mode="decode", seq_q=1, seq_kv=40, page_size=16), tiny()]
    rows = run_group(cases, [recording], RunOptions(cpu_min_run_time_s=0.01), log=lambda s: None)
    assert all(r["status"] == "ok" and r["numerics_status"] == "ok" for r in rows)
    # a paged case is checked on the path that was timed (build() on the fresh inputs, its page table), so
    # attention() never sees a page_size; timed calls and the dense case's check pass no keywords
    assert all(kw == {} for kw in _Recording.seen)


@pytest.mark.parametrize("drift, flagged", [(0.001, False), (-0.05, True), (0.031, True)])
def test_drift_beyond_the_limit_flags_every_row(monkeypatch, drift, flagged):
    monkeypatch.setattr(microbench._Job, "drift", lambda self: drift)
    rows = run_group([tiny(), tiny(causal=True)], ["sdpa-math"], RunOptions(cpu_min_run_time_s=0.01, numerics=False),
                     log=lambda s: None)
    assert [r["drift_flag"] for r in rows] == [flagged, flagged] and all(r["job_drift"] == drift for r in rows)
    assert to_frame(rows)["drift_flag"].dtype == "boolean"


def test_drift_re_times_the_first_case_with_the_same_timer_arguments(monkeypatch):
    calls = []
    real = microbench._Job.time

    def spy(self, fn, case, estimate_s, method=None):
        calls.append((case, estimate_s, method))
        return real(self, fn, case, estimate_s, method)

    monkeypatch.setattr(microbench._Job, "time", spy)
    cases = [tiny(mode="decode", seq_q=1, seq_kv=32), tiny()]  # decode prefers graph replay on CUDA
    rows = run_group(cases, ["sdpa-math"], RunOptions(cpu_min_run_time_s=0.01, numerics=False, repeats=2),
                     log=lambda s: None)
    # two rounds per case, each case followed by the drift check: the first case with the first case's timer
    assert [c for c, _, _ in calls] == [cases[0], cases[0], cases[0], cases[1], cases[1], cases[0]]
    assert calls[2][:2] == calls[5][:2] == calls[0][:2] and calls[5][2] == calls[1][2] == "torch.utils.benchmark"
    assert rows[0]["job_drift"] > -1  # a ratio of two CPU timings minus one: finite (its size is load noise here)


def test_rows_of_a_job_stopped_part_way_carry_the_drift_up_to_their_case(monkeypatch):
    def checks(*values):  # what the drift check finds after each case
        found = iter(values)
        monkeypatch.setattr(microbench._Job, "drift", lambda self: next(found))

    cases, options = [tiny(), tiny(causal=True)], RunOptions(cpu_min_run_time_s=0.01, numerics=False)
    rows = []

    def stop_after_the_first_case(text):
        if "case done" in text:
            raise KeyboardInterrupt  # the guard stopping the job at the sweep deadline

    checks(0.05)
    with pytest.raises(KeyboardInterrupt):
        run_group(cases, ["sdpa-math"], options, log=stop_after_the_first_case, rows=rows)
    assert len(rows) == 1 and rows[0]["job_drift"] == 0.05 and rows[0]["drift_flag"] is True
    checks(0.05, 0.01)  # a job that ends: every row carries the drift over the whole job
    finished = run_group(cases, ["sdpa-math"], options, log=lambda s: None)
    assert [r["job_drift"] for r in finished] == [0.01, 0.01] and not any(r["drift_flag"] for r in finished)


class _Named(_Recording):
    """A backend of its own name (``_Recording`` otherwise), to see the order backends are timed in."""

    def __init__(self, name):
        self.name = name
        self.build_sleep_s = 0.0


@pytest.fixture
def three(monkeypatch):
    names = ["a", "b", "c"]
    monkeypatch.setattr(registry, "_REGISTRY", {**registry.all_backends(), **{n: _Named(n) for n in names}})
    return names


def _spy_order(monkeypatch, order: list, rows: list):
    real = microbench._Job.time_round

    def spy(self, case, entry):
        order.append((case.seq_q, entry.backend.name, len(rows)))
        return real(self, case, entry)

    monkeypatch.setattr(microbench._Job, "time_round", spy)


def test_rounds_rotate_the_backends_of_a_case_and_rows_come_when_a_case_is_done(three, monkeypatch):
    order, rows = [], []
    _spy_order(monkeypatch, order, rows)
    cases = [tiny(), tiny(seq_q=32, seq_kv=32)]
    run_group(cases, three, RunOptions(cpu_min_run_time_s=0.005, numerics=False, repeats=3), log=lambda s: None,
              rows=rows)
    first = [(b, n) for s, b, n in order if s == 16]
    assert [b for b, _ in first] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {n for _, n in first} == {0}  # no row of the first case before all its rounds are done
    assert {n for s, _, n in order if s == 32} == {3}  # the first case's three rows, appended together
    assert len(rows) == 6


def test_a_row_carries_its_rounds_interval_and_job(three, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_LEASE", "cpu")
    rows = run_group([tiny()], three, RunOptions(cpu_min_run_time_s=0.005, numerics=False, repeats=4),
                     log=lambda s: None)
    df = to_frame(rows)
    assert (df["n_rounds"] == 4).all() and df["round_ms"].map(len).eq(4).all()
    assert (df["ms_ci_low"] <= df["ms_median"]).all() and (df["ms_median"] <= df["ms_ci_high"]).all()
    assert df["job_id"].nunique() == 1 and df["timing_lock"].all()
    assert df["cpu_clock_mhz"].notna().all() or not timing_cpu_clock_readable()
    assert df["other_cpu_share"].ge(0).all() and df["device_shared"].notna().all()
    assert df["sm_clock_mhz"].isna().all() and df["energy_j"].isna().all()  # CPU: no NVML, no energy counter


def timing_cpu_clock_readable() -> bool:
    from attnbench.bench.telemetry import CpuSource

    return CpuSource().clock_mhz() == CpuSource().clock_mhz()  # not NaN


def test_a_backend_that_fails_in_a_later_round_is_its_own_error_row(three, monkeypatch):
    real = microbench._Job.time_round
    seen = []

    def flaky(self, case, entry):
        seen.append(entry.backend.name)
        if entry.backend.name == "b" and seen.count("b") == 2:
            raise RuntimeError("the second round of b broke")
        return real(self, case, entry)

    monkeypatch.setattr(microbench._Job, "time_round", flaky)
    rows = run_group([tiny()], three, RunOptions(cpu_min_run_time_s=0.005, numerics=False, repeats=3),
                     log=lambda s: None)
    by = {r["backend"]: r for r in rows}
    assert by["b"]["status"] == "error" and "second round of b broke" in by["b"]["reason"]
    assert by["a"]["status"] == by["c"]["status"] == "ok" and by["a"]["n_rounds"] == by["c"]["n_rounds"] == 3
    assert seen.count("b") == 2  # b is not timed again once it failed


def test_throttled_rounds_are_timed_again_when_asked(three, monkeypatch):
    from attnbench.bench import telemetry

    class Throttled:
        """Every reading of the first two windows says the power cap is active, none after."""

        samples = False
        windows = 0

        def read(self, with_processes=False):
            return telemetry.Reading(throttled=1.0 if Throttled.windows < 4 else 0.0)

        def energy_mj(self):
            return float("nan")

    real_window = telemetry.Telemetry.window

    def counting(self):
        Throttled.windows += 1
        return real_window(self)

    monkeypatch.setattr(telemetry.Telemetry, "open", classmethod(lambda cls, d, i: cls(Throttled(), i)))
    monkeypatch.setattr(telemetry.Telemetry, "window", counting)
    rows = run_group([tiny()], ["a"], RunOptions(cpu_min_run_time_s=0.005, numerics=False, repeats=2,
                                                 discard_throttled=True), log=lambda s: None)
    # windows 1-3 throttled: rounds discarded up to `repeats` (2) times, then kept
    assert rows[0]["n_discarded"] == 2 and rows[0]["n_rounds"] == 2
    assert rows[0]["throttle_share"] == pytest.approx(0.5)  # the kept rounds: window 3 throttled, 4 not


class _Hog(_Named):
    """Holds a 256 MB buffer from build() on, as a backend's layout copies or workspace would."""

    def build(self, case, tensors):
        held = torch.empty(256 * 1024**2, dtype=torch.uint8, device="cuda")
        fn = super().build(case, tensors)
        return lambda: (held, fn())[1]


@pytest.mark.gpu
def test_peak_memory_of_a_row_leaves_out_the_other_backends_callables(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", {**registry.all_backends(), "hog": _Hog("hog"), "b": _Named("b")})
    case = tiny(seq_q=1024, seq_kv=1024)
    rows = run_group([case], ["hog", "b"], RunOptions(device="cuda", numerics=False, repeats=1, energy_ms=0),
                     log=lambda s: None)
    by = {r["backend"]: r for r in rows}
    assert by["hog"]["peak_mem_bytes"] >= 256 * 1024**2
    assert by["b"]["peak_mem_bytes"] < 64 * 1024**2  # the hog's buffer is alive, but not b's


@pytest.mark.parametrize("uuid, visible, index, expected", [
    ("5b8b1a1a-0000-1111-2222-333344445555", "3,5", 1, "GPU-5b8b1a1a-0000-1111-2222-333344445555"),
    ("GPU-abc", None, 0, "GPU-abc"),
    ("", "3,5", 1, "5"),  # no UUID from torch: the CUDA_VISIBLE_DEVICES entry, not physical GPU 0
    ("", "GPU-x, GPU-y", 1, "GPU-y"),
    ("", None, 2, "2"),
])
def test_clock_queries_name_the_gpu_torch_uses(uuid, visible, index, expected):
    assert gpu_selector(uuid, visible, index) == expected


@pytest.mark.gpu
def test_graph_replay_and_events_agree_on_a_kernel_over_100us():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    fn = lambda: a @ a  # noqa: E731  ~140 GFLOP: several hundred us on any recent GPU
    events = time_callable(fn, "cuda", warmup_ms=200, rep_ms=200)
    graph = timing._time_cuda_graph(fn, 100)
    assert events.method == "do_bench" and graph.method == "cuda_graph"
    assert abs(graph.median / events.median - 1) < 0.05


@pytest.mark.gpu
def test_host_bound_call_is_timed_by_graph_replay():
    x = torch.randn(1024, device="cuda")

    def python_heavy():  # ~1 ms of host work around a few-us kernel
        deadline = time.perf_counter() + 1e-3
        while time.perf_counter() < deadline:
            pass
        return x * 2

    t = time_callable(python_heavy, "cuda", warmup_ms=5, rep_ms=20)
    assert t.method == "cuda_graph" and t.median < 1e-3 / 2
