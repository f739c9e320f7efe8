"""The fp64 reference in blocks: every element once, memory bounded, the same numbers as one unblocked call;
numerics status apart from the timing status."""
import pytest
import torch

from attnbench.bench import microbench, numerics
from attnbench.bench.inputs import cast_tensors, make_tensors
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.bench.numerics import BLOCK_BUDGET_BYTES, blocks, reference
from attnbench.case import Case
from attnbench.kernels.eager import eager_attention
from attnbench.workloads.grid import expand_grid


def case(**kw):
    base = dict(mode="fwd", layout="gqa", batch=3, heads_q=8, heads_kv=2, head_dim_qk=16, head_dim_v=16, seq_q=37,
                seq_kv=53, causal=True, dtype="fp32")
    base.update(kw)
    return Case(**base)


def covered(c: Case, budget: int) -> torch.Tensor:
    """How many blocks cover each (batch row, query head, query row) of the case's output."""
    t = make_tensors(c, "cpu", seed=0)
    count = torch.zeros(t.q.shape[:-1], dtype=torch.int64)
    for blk in blocks(c, 24, budget):
        count[blk.batch, blk.q_heads, blk.rows] += 1
    return count


@pytest.mark.parametrize("c", [
    case(),
    case(mode="fwd_bwd", causal=False),
    expand_grid({"mode": "fwd", "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 16, "causal": True,
                 "workload": {"distribution": "uniform", "min_len": 3, "max_len": 30, "token_budget": 64,
                              "chunk": 16, "batches": 2}})[-1],
    case(seq_q=60, seq_kv=60, variant="document", doc_len=25),
])
@pytest.mark.parametrize("budget", [BLOCK_BUDGET_BYTES, 20_000, 1])
def test_blocks_cover_every_output_element_once(c, budget):
    assert (covered(c, budget) == 1).all()


def test_small_budgets_split_batch_then_heads_then_rows():
    big = list(blocks(case(), 24))
    assert len(big) == 1 and big[0].batch == slice(0, 3) and big[0].q_heads == slice(0, 8)
    tiny = blocks(case(), 24, budget=1)
    assert all(b.batch.stop - b.batch.start == 1 and b.q_heads.stop - b.q_heads.start == 4 for b in tiny)
    assert {b.rows.stop - b.rows.start for b in tiny} == {1}  # one query row of one K/V head's group
    causal_keys = [b.keys.stop for b in tiny if b.batch.start == 0 and b.kv_heads.start == 0]
    assert causal_keys == list(range(53 - 37 + 1, 54))  # each row reads only the keys it sees


def test_the_decode_that_wanted_64_gib_fits_the_block_budget():
    """B64 GQA 32/8, KV 32k, D128: the fp64 K/V repeated for every query head was 64 GiB at once."""
    c = Case(mode="decode", layout="gqa", batch=64, heads_q=32, heads_kv=8, head_dim_qk=128, head_dim_v=128, seq_q=1,
             seq_kv=32768, causal=False, dtype="bf16")
    width = 2 * 128 * 8
    for blk in blocks(c, 24):
        b, g = blk.batch.stop - blk.batch.start, blk.kv_heads.stop - blk.kv_heads.start
        n, r = blk.keys.stop - blk.keys.start, blk.rows.stop - blk.rows.start
        assert b * g * (4 * r * (n * 24 + width) + n * width) <= BLOCK_BUDGET_BYTES


def test_blocked_reference_equals_one_unblocked_call(monkeypatch):
    c = case(mode="fwd_bwd")
    t = make_tensors(c, "cpu", seed=1)
    t64 = cast_tensors(t, torch.float64, True)
    whole = eager_attention(t64.q, t64.k, t64.v, causal=True, scale=c.scale)
    grads = torch.autograd.grad(whole, (t64.q, t64.k, t64.v), t64.dout.double())
    monkeypatch.setattr(numerics, "BLOCK_BUDGET_BYTES", 30_000)  # many blocks
    assert len(blocks(c, 24)) > 10
    out, ref_grads = reference(t, c)
    assert out.dtype == torch.float64 and ref_grads[1].dtype == torch.float64
    torch.testing.assert_close(out, whole.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(ref_grads, grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def tiny_case(**kw):
    return Case(**{**dict(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16,
                          seq_q=32, seq_kv=32, causal=True, dtype="fp32"), **kw})


def test_a_reference_out_of_memory_leaves_the_timed_row_ok(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(microbench, "baselines", no_memory)
    rows = run_group([tiny_case()], ["eager", "sdpa-math"], RunOptions(cpu_min_run_time_s=0.01), log=lambda s: None)
    for row in rows:
        assert row["status"] == "ok" and row["ms_median"] > 0  # timed
        assert row["numerics_status"] == "oom" and "64.00 GiB" in row["numerics_reason"]


def test_numerics_status_words(monkeypatch):
    rows = run_group([tiny_case()], ["eager", "sdpa-cudnn"], RunOptions(cpu_min_run_time_s=0.01), log=lambda s: None)
    assert [(r["status"], r["numerics_status"]) for r in rows] == [("ok", "ok"), ("unavailable", "not_run")]
    off = run_group([tiny_case()], ["eager"], RunOptions(cpu_min_run_time_s=0.01, numerics=False), log=lambda s: None)
    assert off[0]["numerics_status"] == "off"


def test_a_variant_sdpa_cannot_express_has_no_math_ratio_but_keeps_the_gate():
    from attnbench.bench.numerics import check_built
    from attnbench.kernels import get_backend

    c = tiny_case(variant="softcap", softcap=5.0)
    result = check_built(c, get_backend("eager"), "cpu", seed=0)
    assert result.math_out.rel_err != result.math_out.rel_err  # NaN: SDPA has no softcap
    assert result.ratios()["err_ratio_vs_math"] != result.ratios()["err_ratio_vs_math"]
    assert result.worst_ratio_vs_eager() == 1.0  # eager against itself
