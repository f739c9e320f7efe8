"""Case validation and grid expansion: bad shapes are one-line errors naming the field."""
import pytest

from attnbench.case import Case, CaseError
from attnbench.workloads.grid import GridError, expand_grid


def make(**kw):
    base = dict(mode="fwd", layout="mha", batch=1, heads_q=8, heads_kv=8, head_dim_qk=64, head_dim_v=64,
                seq_q=128, seq_kv=128, causal=False, dtype="fp32")
    base.update(kw)
    return Case(**base)


@pytest.mark.parametrize("kw, pattern", [
    (dict(layout="gqa", heads_kv=3), r"heads_kv=3 .* layout gqa .*allowed: a divisor of heads_q \(1, 2, 4, 8\)"),
    (dict(layout="mqa", heads_kv=2), r"heads_kv=2 .* layout mqa; allowed: 1"),
    (dict(layout="mha", heads_kv=2), r"heads_kv=2 .* layout mha; allowed: heads_kv == heads_q"),
    (dict(dtype="fp64"), r"dtype='fp64' is not allowed; allowed: fp32, fp16, bf16"),
    (dict(mode="train"), r"mode='train' is not allowed; allowed: fwd, fwd_bwd, decode"),
    (dict(layout="mxa"), r"layout='mxa' is not allowed; allowed: mha, gqa, mqa, mla"),
    (dict(batch=0), r"batch=0 is not allowed; allowed: a positive integer"),
    (dict(causal=True, seq_q=256), r"seq_q=256 .* allowed: seq_q <= seq_kv"),
])
def test_invalid_cases_name_field_and_allowed_values(kw, pattern):
    with pytest.raises(CaseError, match=pattern) as info:
        make(**kw)
    assert "\n" not in str(info.value)


def test_case_id_is_stable_and_distinct():
    assert make().case_id == make().case_id
    assert make().case_id != make(causal=True).case_id
    assert len(make().case_id) == 12


def test_grid_derives_heads_per_layout():
    cases = expand_grid({"layout": ["mha", "gqa", "mqa"], "heads_q": 8, "gqa_group": 4, "seq": 64})
    assert [(c.layout, c.heads_kv) for c in cases] == [("mha", 8), ("gqa", 2), ("mqa", 1)]


def test_grid_decode_uses_one_query_and_drops_the_redundant_mask():
    cases = expand_grid({"mode": "decode", "seq": [256, 512], "causal": [False, True]})
    assert [(c.seq_q, c.seq_kv, c.causal) for c in cases] == [(1, 256, False), (1, 512, False)]


def test_grid_mla_uses_latent_dims():
    (c,) = expand_grid({"mode": "decode", "layout": "mla", "heads_q": 16, "seq": 128, "dtype": "bf16"})
    assert (c.heads_kv, c.head_dim_qk, c.head_dim_v) == (1, 576, 512)


def test_grid_rejects_unknown_key():
    with pytest.raises(GridError, match=r"unknown key 'seqlen'; allowed: mode, layout"):
        expand_grid({"seqlen": 128})


def test_grid_rejects_impossible_shape():
    with pytest.raises(GridError, match=r"gqa_group=3 .*heads_q=8"):
        expand_grid({"layout": "gqa", "gqa_group": 3, "seq": 64})


def test_grid_rejects_empty_list():
    with pytest.raises(GridError, match=r"grid.dtype=\[\] is not allowed; allowed: fp32, fp16, bf16, or a non-empty list of them"):
        expand_grid({"dtype": [], "seq": 64})


def test_grid_rejects_heads_kv_for_mha():
    with pytest.raises(GridError, match="set heads_kv only for layout gqa"):
        expand_grid({"layout": "mha", "heads_kv": 2, "seq": 64})
