"""FLOPs and bytes of real workloads: over the real tokens, per sequence, and at each variant's unmasked pairs.

The variant counts are checked against brute-force pair counts of the mask (the variant's definition,
attnbench.workloads.variants) in a form that holds whatever the per-sequence formula counts for the
causal diagonal, so that a change to that convention flows through without breaking them.
"""
import dataclasses

import torch

from attnbench.bench import conventions as cv
from attnbench.case import Case
from attnbench.workloads.variants import Semantics


def case(**kw):
    base = dict(mode="fwd", layout="gqa", batch=1, heads_q=4, heads_kv=2, head_dim_qk=16, head_dim_v=16, seq_q=50,
                seq_kv=50, causal=True, dtype="bf16")
    base.update(kw)
    return Case(**base)


def visible_pairs(c: Case) -> int:
    """(query, key) pairs the case's mask keeps, counted from the mask itself."""
    sem, total = Semantics.of(c), 0
    for nq, nkv in c.segments():
        keep = sem.keep(torch.arange(nq) + (nkv - nq), torch.arange(nkv))
        total += nq * nkv if keep is None else int(keep.sum())
    return total


PER_PAIR = 2 * 4 * (16 + 16)  # 2 * Hq * (D_qk + D_v)


def test_a_dense_case_counts_as_before():
    for c in (case(), case(causal=False, seq_q=20, seq_kv=70), case(mode="fwd_bwd")):
        assert cv.workload_flops(c) == cv.flops(c) and cv.workload_bytes_min(c) == cv.bytes_min(c)
        assert cv.workload_bytes_model(c, "fused") == cv.bytes_model(c, "fused")


def test_a_ragged_batch_is_the_sum_of_its_sequences():
    c = case(batch=3, seq_q=40, seq_kv=90, seq_lens_q=(40, 7, 25), seq_lens_kv=(90, 7, 30))
    parts = [case(seq_q=q, seq_kv=kv) for q, kv in ((40, 90), (7, 7), (25, 30))]
    assert cv.workload_flops(c) == sum(cv.flops(p) for p in parts) < cv.flops(c)  # padding would add work
    assert cv.workload_bytes_min(c) == sum(cv.bytes_min(p) for p in parts)
    assert cv.workload_bytes_model(c, "eager") == sum(cv.bytes_model(p, "eager") for p in parts)


def test_real_token_bytes_by_hand():
    c = case(batch=2, causal=False, seq_q=30, seq_kv=30, seq_lens_q=(30, 10), seq_lens_kv=(30, 10))
    q = o = 40 * 4 * 16 * 2  # 40 real query tokens, Hq 4, D 16, bf16
    kv = 2 * 40 * 2 * 16 * 2  # K and V: 40 tokens, Hkv 2
    assert cv.workload_bytes_min(c) == q + kv + o


def test_page_table_of_the_real_lengths_by_hand():
    c = case(mode="decode", batch=3, seq_q=1, seq_kv=40, causal=False, page_size=16, seq_lens_kv=(40, 16, 1))
    pages = 3 + 1 + 1
    assert cv.workload_page_table_bytes(c) == 4 * ((3 + 1) + pages + 3)
    assert cv.workload_bytes_model(c, "fused") == cv.workload_bytes_model(dataclasses.replace(c, page_size=0),
                                                                           "fused") + cv.workload_page_table_bytes(c)


def test_sliding_window_removes_exactly_the_pairs_outside_the_window():
    for sq, skv, w in ((50, 50, 7), (12, 50, 7), (50, 50, 60), (1, 300, 32)):
        causal = case(seq_q=sq, seq_kv=skv, mode="decode" if sq == 1 else "fwd", causal=sq > 1)
        window = dataclasses.replace(causal, variant="sliding_window", window=w)
        hidden = visible_pairs(causal) - visible_pairs(window)
        assert cv.flops(causal) - cv.workload_flops(window) == PER_PAIR * hidden


def test_documents_count_each_document_alone():
    c = case(causal=False, variant="document", doc_len=20)  # documents of 20, 20 and 10 tokens
    assert cv.workload_flops(c) == PER_PAIR * visible_pairs(c) == PER_PAIR * (400 + 400 + 100)
    causal = dataclasses.replace(c, causal=True)
    assert cv.workload_flops(causal) == sum(cv.flops(case(seq_q=n, seq_kv=n)) for n in (20, 20, 10))


def test_prefix_lm_adds_the_prefix_blocks_upper_triangle():
    c = case(variant="prefix_lm", prefix_len=12)
    extra = visible_pairs(c) - visible_pairs(case())
    assert extra == 12 * 11 // 2  # pairs (i, j) with i < j < prefix_len
    dense_prefix, causal_prefix = case(causal=False, seq_q=12, seq_kv=12), case(seq_q=12, seq_kv=12)
    assert cv.workload_flops(c) - cv.flops(case()) == cv.flops(dense_prefix) - cv.flops(causal_prefix)
    assert cv.flops(case()) < cv.workload_flops(c) < cv.flops(case(causal=False))


def test_softcap_and_alibi_compute_every_pair_of_their_mask():
    assert cv.workload_flops(case(variant="alibi")) == cv.flops(case())
    assert cv.workload_flops(case(causal=False, variant="softcap", softcap=30.0)) == cv.flops(case(causal=False))
