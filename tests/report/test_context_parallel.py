"""The context-parallel tables and figures from rows: the N=1 join that fills the scaling efficiency, a
status word where a cell has no number, the memory fit, and figures that render with and without rows."""
import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.parallel.columns import frame, merge
from attnbench.report import context_parallel as cp
from attnbench.report import stages
from attnbench.workflow import paths

CASE = Case("fwd_bwd", "gqa", 1, 16, 4, 128, 128, 65536, 65536, True, "bf16")


def row(world, sharding, backend, ms, status="ok", seq=65536, **extra):
    case = Case(**{**CASE.fields(), "seq_q": seq, "seq_kv": seq})
    flops = 1e12 * seq / 65536
    base = {**case.fields(), "case_id": case.case_id, "backend": backend, "status": status, "reason": "",
            "world_size": world, "sharding": sharding, "packing": "dense", "doc_lengths": "", "device_name": "GPU",
            "flops": flops}
    if status == "ok":
        base.update(ms_median=ms, tflops=flops / ms * 1e3 / 1e12, tflops_per_gpu=flops / ms * 1e3 / 1e12 / world)
    return {**base, **extra}


ROWS = [row(1, "contiguous", "ring-sdpa-flash", 10.0), row(2, "zigzag", "ring-sdpa-flash", 5.5),
        row(2, "contiguous", "ring-sdpa-flash", 8.0), row(1, "contiguous", "torch-cp-alltoall", 9.0),
        row(2, "zigzag", "torch-cp-alltoall", 6.0),
        row(2, "striped", "torch-cp-alltoall", 0, status="unsupported", reason="striped is not one of its layouts")]


def test_merge_fills_efficiency_from_the_one_gpu_row():
    df = merge([frame(ROWS)]).set_index(["backend", "world_size", "sharding"])
    assert df.loc[("ring-sdpa-flash", 2, "zigzag"), "scaling_efficiency"] == pytest.approx(10.0 / (2 * 5.5))
    assert df.loc[("ring-sdpa-flash", 2, "zigzag"), "speedup_vs_1"] == pytest.approx(10.0 / 5.5)
    assert df.loc[("torch-cp-alltoall", 2, "zigzag"), "scaling_efficiency"] == pytest.approx(9.0 / 12.0)
    assert pd.isna(df.loc[("torch-cp-alltoall", 2, "striped"), "scaling_efficiency"])
    assert df.loc[("ring-sdpa-flash", 1, "contiguous"), "scaling_efficiency"] == pytest.approx(1.0)


def test_tables_show_the_baseline_under_each_sharding_and_status_words(tmp_path):
    df = merge([frame(ROWS)])
    tables = {t.name: t for t in cp.build_tables(df)}
    assert list(tables) == list(cp.TABLE_NAMES)
    tflops = tables["cp_tflops"].values.reset_index().set_index(["sharding", "backend"])
    assert tflops.loc[("zigzag", "ring-sdpa-flash"), "N=1"] == tflops.loc[("contiguous", "ring-sdpa-flash"), "N=1"]
    assert tflops.loc[("striped", "torch-cp-alltoall"), "N=2"] == "unsupported"
    eff = tables["cp_efficiency"].display.reset_index().set_index(["sharding", "backend"])
    assert eff.loc[("zigzag", "ring-sdpa-flash"), "N=2"] == "90.9"
    paths_ = tables["cp_efficiency"].write(tmp_path)
    assert paths_[1].read_text().count("toprule") == 1


def test_memory_fit_follows_the_line_through_the_two_longest_lengths():
    rows = pd.DataFrame({"seq_kv": [1000, 2000, 4000], "peak_mem_bytes": [5.0, 6.0, 8.0]})
    assert cp.fit_length(rows, 10.0) == pytest.approx(6000)  # 1 byte per 1000 tokens above 4 bytes
    assert cp.fit_length(rows.iloc[:1], 10.0) == pytest.approx(2000)


def test_figures_render_with_rows_and_without(tmp_path):
    df = merge([frame(ROWS + [row(2, "zigzag", "ring-sdpa-flash", 1.2, seq=16384, compute_ms_max=1.0,
                                  compute_ms_mean=0.9, comm_ms=0.3, exposed_comm_ms=0.2)])])
    for name, rows in (("with", df), ("without", merge([]))):
        figures = cp.build_figures(rows)
        assert [f.name for f in figures] == list(cp.FIGURE_NAMES) and all(f.caption for f in figures)
        written = [p for f in figures for p in f.write(tmp_path / name)]
        assert all(p.stat().st_size > 1000 for p in written)


def test_the_stage_registry_writes_the_declared_outputs_from_the_merged_file(tmp_path):
    results = tmp_path / "results" / "s"
    merged = paths.within(results, paths.CP_TABLE)
    merged.parent.mkdir(parents=True)
    merge([frame(ROWS)]).to_parquet(merged)
    index = stages.write("context_parallel", results)
    assert [t["name"] for t in index["tables"]] == list(cp.TABLE_NAMES)
    assert [f["name"] for f in index["figures"]] == list(cp.FIGURE_NAMES)
    assert "context_parallel" in [s.name for s in stages.SECTIONS]
