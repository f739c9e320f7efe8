"""The real-workloads report section from hand-made rows: throughput over real tokens, latency percentiles,
the coverage table, padding waste, and a figure that always exists."""
import pytest

from attnbench.bench.microbench import base_row
from attnbench.bench.results import to_frame
from attnbench.kernels import get_backend
from attnbench.report import workloads
from attnbench.report.artifacts import StageOutputs, write_stage
from attnbench.workloads.grid import expand_grid

TRACE = {"mode": "fwd", "layout": "gqa", "heads_q": 8, "head_dim": 64, "causal": True, "dtype": "bf16",
         "workload": {"trace": "azure-conv", "token_budget": 4096, "max_len": 2048, "batches": 4}}
VARIANTS = {"mode": "fwd", "seq": 512, "causal": True, "dtype": "bf16",
            "variant": ["none", "sliding_window", "softcap"], "window": 64, "softcap": 30}


def row(case, backend, group, ms=None, status="ok", err=1.0, reason=""):
    r = base_row(case, get_backend(backend), "cpu", None)
    r.update(group=group, status=status, reason=reason)
    if ms is not None:
        r.update(ms_median=ms, tflops=r["flops"] / (ms / 1e3) / 1e12, err_ratio_vs_eager=err)
    return r


@pytest.fixture(scope="module")
def frame():
    rows = []
    for i, case in enumerate(expand_grid(TRACE)):
        rows.append(row(case, "fa4", "trace", ms=1.0 + i))  # 1, 2, 3, 4 ms
        rows.append(row(case, "sdpa-padded", "trace", ms=3.0 * (1.0 + i)))
        rows.append(row(case, "sdpa-flash", "trace", status="unsupported", reason="nested GQA"))
    for case in expand_grid(VARIANTS):
        rows.append(row(case, "fa4", "variants", ms=0.5, err=1.2))
        supported = case.variant != "softcap"
        rows.append(row(case, "sdpa-padded", "variants", ms=1.0 if supported else None,
                        status="ok" if supported else "unsupported", reason="" if supported else "no score transform"))
    return to_frame(rows)


def test_throughput_counts_real_tokens_over_summed_batch_times(frame):
    t = workloads.throughput_table(frame)
    fa4 = t.values.xs("fa4", level="backend").iloc[0]
    rows = frame[frame.backend == "fa4"].iloc[:4]
    assert fa4["batches"] == 4 and fa4["timed"] == 4
    assert fa4["tokens_per_s"] == pytest.approx(rows.tokens_q.sum() / (10 / 1e3))  # 1+2+3+4 ms
    assert fa4["ms_p50"] == pytest.approx(2.5) and fa4["ms_p99"] == pytest.approx(3.97)
    flash = t.display.xs("sdpa-flash", level="backend").iloc[0]
    assert flash["tokens_per_s"] == "unsupported"  # a backend that timed no batch shows its status
    assert "real tokens" in t.caption and "Device:" in t.caption


def test_coverage_table_says_supported_tflops_and_error_per_variant(frame):
    t = workloads.coverage_table(frame)
    assert list(t.display.columns) == ["none", "sliding_window", "softcap"]
    assert t.display.loc["sdpa-padded", "softcap"] == "unsupported"
    assert t.values.loc["fa4", "softcap supported"] and not t.values.loc["sdpa-padded", "softcap supported"]
    assert t.display.loc["fa4", "sliding_window"].endswith("(1.2x)")
    # the `none` column holds the variant groups' own none cases, not the trace group's batches
    none = frame[(frame.group == "variants") & (frame.variant == "none") & (frame.backend == "fa4")]
    assert t.values.loc["fa4", "none tflops"] == pytest.approx(none.tflops.median())
    assert t.values.index.tolist() == ["fa4", "sdpa-padded"]  # sdpa-flash ran no variant group


def test_padding_waste_measures_the_padded_baseline_against_the_best_native(frame):
    t = workloads.padding_table(frame)
    cell = t.values.iloc[0]
    assert cell["padded_over_best"] == pytest.approx(3.0) and cell["best_native"] == "fa4"
    cases = frame[frame.backend == "fa4"].iloc[:4]
    assert cell["padded_flops_share"] == pytest.approx(1 - cases.flops.sum() / cases.flops_padded.sum())
    assert 0 < cell["padded_flops_share"] < 1 and t.display.iloc[0]["padded_over_best"] == "3x"


def test_batches_table_sums_real_tokens_per_workload(frame):
    t = workloads.batches_table(frame)
    cell = t.values.loc[("azure-conv", "prefill")]
    cases = frame[(frame.backend == "fa4") & (frame.group == "trace")]
    assert cell["batches"] == 4 and cell["tokens_q"] == cases.tokens_q.sum()
    assert cell["longest_kv"] == cases.seq_kv.max()


def test_sections_without_data_say_so_and_files_always_exist(tmp_path):
    empty = to_frame([row(expand_grid({"seq": 64})[0], "eager", "g", ms=1.0)])
    tables = workloads.build_tables(empty)
    assert all(t.empty and t.group == workloads.GROUP for t in tables)
    index = write_stage("microbench", StageOutputs(tables, workloads.build_figures(empty)), tmp_path)
    assert [e["name"] for e in index["tables"]] == list(workloads.TABLE_NAMES)
    assert {e["group"] for e in index["tables"] + index["figures"]} == {workloads.GROUP}
    assert all((tmp_path / path).stat().st_size > 0 for e in index["figures"] for path in e["files"].values())


def test_the_latency_figure_draws_a_panel_per_workload(frame):
    fig = workloads.latency_figure(frame)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 1  # one workload, one kind: prefill
