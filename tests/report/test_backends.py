"""The FA3-README-style backend tables (attnbench.report.backends) on made-up rows, and the sweep file
that plans the H200 reference grid (config/sweeps/h200-backends.yaml)."""
from pathlib import Path

import pandas as pd
import pytest

from attnbench.bench.conventions import bytes_model, flops, kv_cache_bytes
from attnbench.bench.results import empty_row, to_frame
from attnbench.case import Case
from attnbench.plan import load_plan
from attnbench.report import backends
from attnbench.report.artifacts import to_markdown

REPO = Path(__file__).resolve().parents[2]
PEAK_BW = 4e12


def row(case: Case, backend: str, ms: float, status="ok", fp8_inputs=()):
    r = empty_row() | case.fields()
    r.update(backend=backend, status=status, reason="" if status == "ok" else "why", case_id=case.case_id,
             sweep="t", group="g", device_name="GPU", peak_bytes_per_s=PEAK_BW, flops=flops(case),
             bytes_model=bytes_model(case, "fused", fp8_inputs))
    if status == "ok":
        r.update(ms_median=ms, tflops=r["flops"] / (ms * 1e-3) / 1e12, gbps=r["bytes_model"] / (ms * 1e-3) / 1e9)
    return r


def fwd(seq, causal=False, mode="fwd"):
    return Case(mode=mode, layout="mha", batch=32768 // seq, heads_q=16, heads_kv=16, head_dim_qk=128,
                head_dim_v=128, seq_q=seq, seq_kv=seq, causal=causal, dtype="bf16")


def decode(kv, page_size=0):
    return Case(mode="decode", layout="gqa", batch=262144 // kv, heads_q=32, heads_kv=8, head_dim_qk=128,
                head_dim_v=128, seq_q=1, seq_kv=kv, causal=False, dtype="bf16", page_size=page_size)


def test_fa3_table_has_backends_down_and_lengths_across_with_status_cells():
    df = to_frame([row(fwd(512), "fa4", 1.0), row(fwd(16384), "fa4", 2.0), row(fwd(512), "fa3", 1.0, "unavailable")])
    table = backends.prefill_table(df, "fwd")
    block = table.values.xs((False, "bf16", "mha", 16, 16, 128, 32768), level=(0, 1, 2, 3, 4, 5, 6))
    assert list(block.columns) == ["512", "16k"]
    assert block.loc["fa4", "512"] == pytest.approx(flops(fwd(512)) / 1e-3 / 1e12)
    assert block.loc["fa4", "16k"] == pytest.approx(flops(fwd(16384)) / 2e-3 / 1e12)
    assert block.loc["fa3", "512"] == "unavailable" and block.loc["fa3", "16k"] == ""
    md = to_markdown(table)
    assert "*causal False, dtype bf16, layout mha, Hq 16, Hkv 16, D 128, B·S 32768*" in md
    fa3_line = next(line for line in md.splitlines() if line.startswith("| fa3"))
    assert [cell.strip() for cell in fa3_line.strip("|").split("|")] == ["fa3", "unavailable", ""]
    assert backends.prefill_table(df, "fwd_bwd").empty  # no fwd_bwd rows: a note, not a failure


def test_a_fixed_batch_grid_is_not_an_fa3_grid():
    cases = [Case(mode="fwd", layout="mha", batch=4, heads_q=16, heads_kv=16, head_dim_qk=128, head_dim_v=128,
                  seq_q=s, seq_kv=s, causal=False, dtype="bf16") for s in (1024, 4096)]
    table = backends.prefill_table(to_frame([row(c, "fa4", 1.0) for c in cases]), "fwd")
    assert table.empty and "no fwd grid at constant batch x length" in table.values.index[0]


def test_decode_table_is_a_fraction_of_copy_bandwidth_with_fp8_kv_at_one_byte():
    c, p = decode(4096), decode(4096, page_size=16)
    ms = bytes_model(c, "fused") / (PEAK_BW / 2) * 1e3  # half of the copy rate
    df = to_frame([row(c, "sdpa-cudnn", ms), row(p, "flashinfer", ms),
                   row(p, "flashinfer-fp8kv", ms, fp8_inputs=("k", "v")),
                   row(decode(8192), "sdpa-cudnn", ms)])
    values = backends.decode_table(df).values.droplevel([0, 1, 2, 3, 4, 5])
    assert values.loc["sdpa-cudnn", "4k"] == pytest.approx(0.5)
    # the paged row's bytes_model adds its page table
    assert values.loc["flashinfer (page 16)", "4k"] == pytest.approx(bytes_model(p, "fused") / bytes_model(c, "fused") / 2)
    # the row's bytes_model already counts the e4m3 cache at one byte: the table must not halve it again
    fp8_fraction = bytes_model(p, "fused", ("k", "v")) / bytes_model(c, "fused") / 2
    assert bytes_model(p, "fused", ("k", "v")) == bytes_model(p, "fused") - kv_cache_bytes(p) / 2
    assert values.loc["flashinfer-fp8kv (page 16)", "4k"] == pytest.approx(fp8_fraction)


def test_the_sweep_file_plans_every_committed_reference_pair():
    """config/sweeps/h200-backends.yaml replaces scripts/h200_backends.py: every (case, backend) the script
    measured is planned, with the FA3-style grids (constant B·S) the tables need."""
    plan = load_plan(REPO / "config/sweeps/h200-backends.yaml", "cuda")
    planned = {(c.case_id, b) for g in plan.microbench.values() for c in g.cases for b in g.backends}
    reference = pd.read_parquet(REPO / "results/reference/h200/backends/backends.parquet")
    assert set(zip(reference["case_id"], reference["backend"])) <= planned
    backends_named = {b for g in plan.microbench.values() for b in g.backends}
    assert {"fa4", "sdpa-cudnn", "sdpa-flash", "flashinfer", "flashinfer-fp8kv", "flashinfer-mla", "triton",
            "fa2", "fa3", "fa3-fp8"} <= backends_named
    assert plan.stages == ("microbench",) and plan.view["timing"]["warmup_ms"] == 150
    cases = pd.DataFrame([c.fields() for g in plan.microbench.values() for c in g.cases])
    assert set(backends.constant_tokens(cases[cases["mode"] == "fwd"], backends.PREFILL_BLOCK)["tokens"]) == {32768}
    assert set(backends.constant_tokens(cases[cases["mode"] == "decode"], backends.DECODE_BLOCK)["tokens"]) == {262144}
