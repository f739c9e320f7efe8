"""Batch formation: token-budget prefill, chunked prefill against cached prefixes, request-count decode."""
import numpy as np
import pytest

from attnbench.workloads.batches import BatchError, chunked_batches, decode_batches, ordered, prefill_batches
from attnbench.workloads.requests import Requests, shipped_trace


def stream(context, generated=None):
    context = np.array(context, dtype=np.int64)
    return Requests("test", context, np.array(generated if generated is not None else [0] * len(context)))


def test_prefill_packs_whole_prompts_in_order_under_the_budget():
    batches = prefill_batches(stream([30, 50, 40, 10, 90, 5]), token_budget=100, count=3)
    assert [b.lens_q for b in batches] == [(30, 50), (40, 10), (90, 5)]
    assert all(b.lens_q == b.lens_kv for b in batches)  # whole prompts: self-attention
    # a prompt longer than the budget is clipped to it, so it fits an empty batch
    assert prefill_batches(stream([300, 20]), token_budget=100, count=2)[0].lens_q == (100,)


def test_prefill_from_the_trace_respects_the_budget_and_arrival_order():
    r = shipped_trace("azure-conv")
    batches = prefill_batches(r, token_budget=8192, count=5, max_len=4096)
    flat = [n for b in batches for n in b.lens_q]
    assert flat == np.minimum(r.context[:len(flat)], 4096).tolist()  # the first requests, in order
    assert all(sum(b.lens_q) <= 8192 for b in batches)
    sampled = prefill_batches(r, token_budget=8192, count=5, order="sampled", seed=1, max_len=4096)
    assert sampled != batches and sampled == prefill_batches(r, token_budget=8192, count=5, order="sampled",
                                                             seed=1, max_len=4096)


def test_sampled_order_is_a_seeded_permutation():
    r = stream(list(range(1, 51)))
    order = ordered(r, "sampled", seed=7)
    assert sorted(order.tolist()) == list(range(50)) and order.tolist() != list(range(50))
    with pytest.raises(BatchError, match="order='random' is not allowed; allowed: arrival, sampled"):
        ordered(r, "random", seed=0)


def test_chunked_prefill_continues_each_prompt_against_its_cached_prefix():
    batches = chunked_batches(stream([100, 30, 70]), token_budget=64, chunk=40, count=4)
    assert all(sum(b.lens_q) <= 64 for b in batches)
    assert all(q <= kv for b in batches for q, kv in zip(b.lens_q, b.lens_kv))
    # step 1: 40 of prompt 0, 24 of prompt 1; step 2: prompt 0 continues (40 more after 40 cached) first
    assert batches[0].lens_q == (40, 24) and batches[0].lens_kv == (40, 24)
    assert batches[1].lens_q[:2] == (40, 6) and batches[1].lens_kv[:2] == (80, 30)
    # every prompt's chunks add up to the prompt: the last KV length of each is its full length
    done = {}
    for b in batches:
        for q, kv in zip(b.lens_q, b.lens_kv):
            done[kv - q] = kv
    assert {100, 30, 70} <= set(done.values())


def test_decode_batches_mix_requests_part_way_through_their_outputs():
    r = shipped_trace("azure-conv")
    batches = decode_batches(r, size=16, count=3, seed=0)
    assert len(batches) == 3 and all(b.lens_q == (1,) * 16 for b in batches)
    kv = np.array([n for b in batches for n in b.lens_kv])
    ctx, gen = r.context[:48], r.generated[:48]
    assert (kv >= ctx).all() and (kv < ctx + gen).all()  # prompt plus the tokens generated so far
    assert decode_batches(r, size=16, count=3, seed=0) == batches


def test_a_stream_too_short_for_the_batches_says_how_many_it_can_give():
    with pytest.raises(BatchError, match=r"has 17 requests: 1 16-request decode batches, not 2; allowed: batches <= 1"):
        decode_batches(stream([5] * 17, [1] * 17), size=16, count=2)
    with pytest.raises(BatchError, match=r"has 2 requests: 1 prefill batches, not 3"):
        prefill_batches(stream([5, 6]), token_budget=100, count=3)
