"""KV bytes/token ledger against DeepSeek-V2 Table 1 by hand, against conventions, and the training-step ledger."""
import pandas as pd
import pytest

from attnbench.bench import conventions
from attnbench.case import Case
from attnbench.cli import main
from attnbench.errors import ConfigError
from attnbench.hbm.ledger import LedgerShape, build_ledger, cache_layouts, kv_measured_table, pretrain_table

SHAPE = LedgerShape()  # n_h 32, d_h 128, n_g 2/4/8/16, d_c 512, d_h^R 64, 32 layers


def test_elements_per_token_by_hand():
    got = {c.name: c.elements for c in cache_layouts(SHAPE)}
    assert got == {
        "mha": 2 * 32 * 128,            # 8192
        "gqa-16": 2 * 16 * 128, "gqa-8": 2 * 8 * 128, "gqa-4": 2 * 4 * 128, "gqa-2": 2 * 2 * 128,
        "mqa": 2 * 128,                 # 256
        "mla-absorbed": 512 + 64,       # 576: DeepSeek-V2's "GQA with 2.25 groups"
        "mla-naive": 32 * (128 + 64) + 32 * 128,
    }
    assert 576 / (2 * 128) == 2.25


@pytest.mark.parametrize("name", ["mha", "gqa-8", "mqa", "mla-absorbed"])
def test_formulas_agree_with_the_byte_conventions(name):
    c = next(c for c in cache_layouts(SHAPE) if c.name == name)
    case = Case(mode="decode", layout=c.layout, batch=3, heads_q=32, heads_kv=c.heads_kv, head_dim_qk=c.head_dim_qk,
                head_dim_v=c.head_dim_v, seq_q=1, seq_kv=1000, causal=False, dtype="bf16")
    assert conventions.kv_cache_bytes(case) == c.elements * 2 * 3 * 1000


def test_kv_table_bytes_scale_with_dtype_layers_and_context():
    df = build_ledger(SHAPE)
    kv = df[df.table == "kv_cache"]
    mha = kv[(kv.name == "mha") & (kv.context == 4096)].set_index("dtype")
    assert mha.loc["bf16", "bytes_per_token_layer"] == 16384 and mha.loc["fp8", "bytes_per_token_layer"] == 8192
    assert mha.loc["bf16", "bytes_per_token_model"] == 16384 * 32
    assert mha.loc["bf16", "kv_bytes_per_seq"] == 16384 * 32 * 4096  # 2 GiB per 4k-token sequence
    assert kv[(kv.name == "mla-absorbed")].gqa_equivalent_groups.eq(2.25).all()
    assert len(kv) == 8 * 2 * 4  # layouts x dtypes x contexts


def test_pretrain_ledger_is_the_byte_model_times_layers():
    rows = {(r["name"], r["family"]): r for r in pretrain_table(SHAPE)}
    case = Case(mode="fwd_bwd", layout="gqa", batch=8, heads_q=32, heads_kv=8, head_dim_qk=128, head_dim_v=128,
                seq_q=4096, seq_kv=4096, causal=True, dtype="bf16")
    r = rows[("gqa-8", "fused")]
    assert r["bytes_fwd_bwd_layer"] == conventions.bytes_model(case, "fused")
    assert r["bytes_per_step"] == 32 * conventions.bytes_model(case, "fused")
    assert r["bytes_per_token_step"] == r["bytes_per_step"] / (8 * 4096)
    assert rows[("gqa-8", "eager")]["bytes_per_step"] > 50 * r["bytes_per_step"]  # S x S passes dominate
    mla = rows[("mla", "fused")]  # trained up-projected: per-head K of d_h + d_h^R, V of d_h
    assert (mla["heads_kv"], mla["head_dim_qk"], mla["head_dim_v"]) == (32, 192, 128)
    assert rows[("mqa", "fused")]["bytes_per_step"] < rows[("mha", "fused")]["bytes_per_step"]


def test_measured_decode_rows_are_checked_per_cached_token():
    case = Case(mode="decode", layout="gqa", batch=16, heads_q=32, heads_kv=8, head_dim_qk=128, head_dim_v=128,
                seq_q=1, seq_kv=4096, causal=False, dtype="bf16")
    kv = conventions.kv_cache_bytes(case)
    # a hand-made hbm row (not a measurement): reads the cache plus 1% more, 0.2 ms per step
    hbm = pd.DataFrame([{**case.fields(), "case_id": case.case_id, "backend": "sdpa-flash", "status": "ok",
                         "reason": "", "bytes_read": 1.01 * kv, "ms_median": 0.2, "time_status": "ok",
                         "peak_bytes_per_s": 4e12},
                        {**case.fields(), "case_id": case.case_id, "backend": "flashinfer-fp8kv", "status": "ok",
                         "compute_dtype": "fp8", "reason": "", "bytes_read": 0.51 * kv, "ms_median": 0.1,
                         "time_status": "ok", "peak_bytes_per_s": 4e12},
                        {**case.fields(), "case_id": case.case_id, "backend": "sdpa-efficient",
                         "status": "unsupported", "reason": "No available kernel", "bytes_read": float("nan"),
                         "ms_median": float("nan"), "time_status": "unsupported", "peak_bytes_per_s": 4e12}])
    ok, fp8, refused = kv_measured_table(hbm)
    assert ok["bytes_per_token_layer"] == 2 * 8 * 128 * 2 == 4096
    assert ok["ratio_measured_formula"] == pytest.approx(1.01)
    assert ok["decode_us_per_token"] == pytest.approx(200 / 16)
    assert ok["frac_of_bw"] == pytest.approx(kv / 0.2e-3 / 4e12)
    # an fp8-KV backend is held against the fp8 formula: 2 * 8 * 128 * 1 bytes per token per layer
    assert fp8["dtype"] == "fp8" and fp8["bytes_per_token_layer"] == 2048
    assert fp8["ratio_measured_formula"] == pytest.approx(1.02)
    assert refused["status"] == "unsupported" and refused["reason"] == "No available kernel"
    assert refused["ratio_measured_formula"] != refused["ratio_measured_formula"]  # NaN


def test_gqa_heads_must_divide_heads():
    section = {"heads": 32, "head_dim": 128, "gqa_kv_heads": [3], "mla_rank": 512, "mla_rope_dim": 64, "layers": 2,
               "kv_dtypes": ["bf16"], "contexts": [1024],
               "pretrain": {"batch": 1, "seq": 128, "causal": True, "dtype": "bf16", "families": ["fused"]}}
    with pytest.raises(ConfigError, match=r"hbm.ledger.gqa_kv_heads: 3 is not allowed with heads=32; allowed: a "
                                          r"divisor of heads \(1, 2, 4, 8, 16, 32\)"):
        LedgerShape.from_config(section)


def test_ledger_cli_uses_the_schema_defaults(tmp_path):
    out = tmp_path / "ledger.parquet"
    assert main(["ledger", "--out", str(out)]) == 0
    df = pd.read_parquet(out)
    assert set(df.table) == {"kv_cache", "pretrain"}
    assert df[df.table == "kv_cache"].heads_q.eq(32).all()
