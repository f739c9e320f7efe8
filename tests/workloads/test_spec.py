"""The workload and variant grid keys: cases from a trace, one-line errors, ids of dense cases unchanged."""
import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from attnbench.case import Case, CaseError
from attnbench.plan import grid_groups
from attnbench.errors import ConfigError
from attnbench.workloads.grid import GridError, expand_grid
from attnbench.workloads.spec import WorkloadError, check

# (Case fields, case_id) of the 180 dense cases of the retired H200 core run at commit 0ced706, before the
# workload and variant fields existed: the ids the reference rows made then must still be the ids now
DENSE_CASE_IDS = Path(__file__).with_name("dense_case_ids.csv")


def test_a_trace_workload_gives_one_ragged_case_per_batch():
    cases = expand_grid({"mode": "fwd", "layout": "gqa", "heads_q": 8, "causal": True,
                         "workload": {"trace": "azure-conv", "token_budget": 4096, "max_len": 2048, "batches": 3}})
    assert len(cases) == 3 and all(c.ragged and c.workload == "azure-conv" for c in cases)
    for c in cases:
        assert c.batch == len(c.seq_lens_q) and sum(c.seq_lens_q) <= 4096 and c.seq_lens_q == c.seq_lens_kv
        assert (c.seq_q, c.seq_kv) == (max(c.seq_lens_q), max(c.seq_lens_kv))


def test_decode_and_chunked_workloads():
    (c,) = expand_grid({"mode": "decode", "layout": "gqa", "heads_q": 8, "page_size": 16,
                        "workload": {"trace": "azure-code", "requests": 16, "batches": 1}})
    assert c.seq_q == 1 and c.seq_lens_q == () and len(c.seq_lens_kv) == 16 and c.page_size == 16
    chunked = expand_grid({"mode": "fwd", "causal": True,
                           "workload": {"trace": "azure-code", "token_budget": 4096, "chunk": 1024, "batches": 3}})
    assert any(q < kv for c in chunked for q, kv in zip(c.lens_q, c.lens_kv))  # chunks after cached prefixes


def test_a_fixed_distribution_gives_dense_batches():
    cases = expand_grid({"mode": "fwd", "workload": {"distribution": "fixed", "len": 256, "token_budget": 1024,
                                                      "batches": 2}})
    assert [(c.batch, c.seq_q, c.ragged, c.workload) for c in cases] == [(4, 256, False, "fixed")]  # deduplicated


@pytest.mark.parametrize("grid, pattern", [
    ({"workload": {"trace": "azure-conv", "token_budget": 512}, "batch": 2}, r"batch is not allowed with workload"),
    ({"workload": {"trace": "azure-conv"}}, r"mode fwd needs token_budget"),
    ({"mode": "decode", "workload": {"trace": "azure-conv", "token_budget": 64}}, r"mode decode needs requests"),
    ({"workload": {"trace": "azure-conv", "token_budget": 64, "budget": 1}}, r"unknown key 'budget'; allowed: trace"),
    ({"workload": {"distribution": "lognormal", "token_budget": 64}}, r"distribution lognormal needs median_len"),
    ({"workload": {"token_budget": 64}}, r"needs exactly one of trace"),
    ({"workload": {"trace": "azure-conv", "token_budget": 64, "order": "lifo"}},
     r"order='lifo' is not allowed; allowed: arrival, sampled"),
    ({"workload": "azure-conv"}, r"workload='azure-conv' is not allowed; allowed: a mapping"),
    ({"seq": 64, "variant": "sliding_window"}, r"variant sliding_window needs window"),
    ({"seq": 64, "variant": "alibi"}, r"causal=False is not allowed for variant alibi"),
    ({"seq": 64, "variant": "wavy"}, r"variant='wavy' is not allowed; allowed: none, sliding_window"),
])
def test_bad_workload_and_variant_grids_are_one_line_errors(grid, pattern):
    with pytest.raises((GridError, CaseError, WorkloadError), match=pattern) as info:
        expand_grid(grid)
    assert "\n" not in str(info.value)


def test_a_variant_parameter_applies_to_its_variant_only():
    cases = expand_grid({"seq": 64, "causal": True, "variant": ["none", "sliding_window", "softcap"], "window": 16,
                         "softcap": 30})
    assert [(c.variant, c.window, c.softcap) for c in cases] == [("none", 0, 0.0), ("sliding_window", 16, 0.0),
                                                                ("softcap", 0, 30.0)]


@pytest.mark.parametrize("kw, pattern", [
    (dict(seq_lens_q=(4, 9), seq_lens_kv=(4, 9), seq_q=9, seq_kv=9, batch=3), r"seq_lens_q has 2 lengths; allowed: one per"),
    (dict(seq_lens_q=(4, 8), seq_lens_kv=(4, 8), seq_q=9, seq_kv=9), r"seq_q=9 is not allowed with seq_lens_q \(longest 8\)"),
    (dict(seq_lens_q=(5, 9), seq_lens_kv=(4, 9), seq_q=9, seq_kv=9, causal=True), r"query tokens <= KV tokens"),
    (dict(seq_lens_q=(4, 9), seq_lens_kv=(4, 9), seq_q=9, seq_kv=9, mode="fwd_bwd"), r"mode='fwd_bwd' is not allowed"),
    (dict(variant="softcap"), r"softcap=0.0 is not allowed for variant softcap"),
    (dict(variant="none", window=3), r"window=3 is not allowed with variant='none'"),
    (dict(variant="document", doc_len=64), r"0 < doc_len < seq_q"),
    (dict(variant="prefix_lm", prefix_len=8, causal=True, mode="decode", seq_q=1), r"mode='decode' is not allowed"),
    (dict(workload="a b"), r"workload='a b' is not allowed"),
])
def test_invalid_workload_cases_name_the_field(kw, pattern):
    base = dict(mode="fwd", layout="mha", batch=2, heads_q=2, heads_kv=2, head_dim_qk=8, head_dim_v=8, seq_q=64,
                seq_kv=64, causal=False, dtype="fp32")
    with pytest.raises(CaseError, match=pattern):
        Case(**{**base, **kw})


def test_dense_case_ids_are_the_committed_ones():
    """Dense cases keep the ids they had before the workload fields existed."""
    df = pd.read_csv(DENSE_CASE_IDS)
    names = [f.name for f in dataclasses.fields(Case) if f.name in df]
    assert len(df) == 180 and len(names) == 12
    for row in df.to_dict(orient="records"):  # native Python values: int, bool, str
        assert Case(**{n: row[n] for n in names}).case_id == row["case_id"]


def test_a_ragged_case_survives_its_job_file_round_trip():
    (c,) = expand_grid({"mode": "fwd", "causal": True, "workload": {"trace": "azure-conv", "token_budget": 2048,
                                                                      "batches": 1}})
    again = Case(**{k: (list(v) if isinstance(v, tuple) else v) for k, v in c.fields().items()})  # JSON gives lists
    assert again == c and again.case_id == c.case_id and isinstance(again.seq_lens_q, tuple)


def test_rule_backends_take_dense_groups_only():
    section = {"backends": ["eager"], "groups": {"ragged": {"workload": {"distribution": "uniform", "min_len": 4,
                                                                         "max_len": 32, "token_budget": 64}}}}
    groups = grid_groups(section, "microbench.cpu", 100)
    from attnbench import plan

    with pytest.raises(ConfigError, match="has ragged or variant cases; allowed: dense groups"):
        plan._rule_backends({"rule_backends": {"c-naive": ["ragged"]}}, groups, "microbench.cpu.rule_backends", None)


def test_check_accepts_a_complete_mapping():
    spec = {"distribution": "uniform", "min_len": 1, "max_len": 8, "token_budget": 16}
    assert check(spec, "w") is spec
