"""The H200 backends script's tables (FA3-README style, decode bandwidth fraction) on made-up rows."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from attnbench.case import Case
from attnbench.bench.conventions import bytes_model, flops, kv_cache_bytes
from attnbench.bench.results import to_frame

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200_backends.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("h200_backends", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(case: Case, backend: str, ms: float, status="ok", compute_dtype=None, peak=4e12, fp8_inputs=()):
    r = {**case.fields(), "backend": backend, "status": status, "reason": "" if status == "ok" else "why",
         "ms_median": ms, "flops": flops(case), "bytes_model": bytes_model(case, "fused", fp8_inputs),
         "peak_bytes_per_s": peak, "compute_dtype": compute_dtype or case.dtype, "case_id": case.case_id,
         "device_name": "GPU"}
    r["tflops"] = r["flops"] / (ms * 1e-3) / 1e12
    return r


def fwd(seq, causal=False):
    return Case(mode="fwd", layout="mha", batch=32768 // seq, heads_q=16, heads_kv=16, head_dim_qk=128,
                head_dim_v=128, seq_q=seq, seq_kv=seq, causal=causal, dtype="bf16")


def decode(kv, page_size=0):
    return Case(mode="decode", layout="gqa", batch=262144 // kv, heads_q=32, heads_kv=8, head_dim_qk=128,
                head_dim_v=128, seq_q=1, seq_kv=kv, causal=False, dtype="bf16", page_size=page_size)


def test_fa3_style_table_has_backends_down_and_lengths_across(script):
    df = to_frame([row(fwd(512), "fa4", 1.0), row(fwd(16384), "fa4", 2.0), row(fwd(512), "fa3", 1.0, "unavailable")])
    text = script.fa3_style_table(df, mode="fwd", causal=False, dtype="bf16", head_dim=128, layout="mha")
    lines = text.splitlines()
    assert lines[2] == "| backend | 512 | 16k |"
    tf512, tf16k = (flops(fwd(s)) / t / 1e12 for s, t in ((512, 1e-3), (16384, 2e-3)))
    assert lines[4] == f"| fa4 | {tf512:.0f} | {tf16k:.0f} |" and lines[5] == "| fa3 | unavailable |  |"
    assert script.fa3_style_table(df, mode="fwd", causal=True, dtype="bf16", head_dim=128, layout="mha") == ""


def test_decode_table_is_a_fraction_of_copy_bandwidth_with_fp8_kv_at_one_byte(script):
    c, p = decode(4096), decode(4096, page_size=16)
    ms = bytes_model(c, "fused") / 2e12 * 1e3  # half of a 4 TB/s copy rate
    df = to_frame([row(c, "sdpa-cudnn", ms), row(p, "flashinfer", ms),
                   row(p, "flashinfer-fp8kv", ms, compute_dtype="fp8", fp8_inputs=("k", "v"))])
    lines = script.decode_table(df, layout="gqa", dtype="bf16").splitlines()
    assert lines[4] == "| sdpa-cudnn | 0.50 |" and lines[5] == "| flashinfer (page 16) | 0.50 |"
    # the row's bytes_model already counts the e4m3 cache at one byte: the table must not halve it again
    fp8_fraction = (bytes_model(p, "fused") - kv_cache_bytes(p) / 2) / bytes_model(c, "fused") * 0.5
    assert lines[6] == f"| flashinfer-fp8kv (page 16) | {fp8_fraction:.2f} |" == "| flashinfer-fp8kv (page 16) | 0.25 |"


def test_render_lists_rows_that_did_not_run_with_their_reason(script):
    df = to_frame([row(fwd(512), "fa4", 1.0), row(fwd(512), "fa2", 1.0, "unavailable")])
    text = script.render(df, {"prefill single (bf16, D128)": 71.5})
    assert "| fa2 | unavailable | why |" in text and "prefill single (bf16, D128): 71.5" in text
    assert "median setup_s" in text
