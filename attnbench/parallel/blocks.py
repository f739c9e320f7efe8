"""Which blocks of the score matrix a rank computes at each ring step, and under which mask.

Blockwise attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): rank r keeps
its queries and at ring step s holds the keys and values of rank ``(r - s) mod world``. The part
of the global mask that falls between the two shards is a union of rectangular blocks, each of
one of two kinds, so that every block is one call of an ordinary attention kernel:

* full (no mask): every query of the block sees every key;
* causal: queries and keys are the same positions (a square on the diagonal), query i sees key
  j <= i, the mask every kernel's ``causal=True`` applies to a square problem.

A block never has a query row that sees no key, so no kernel is asked for the log-sum-exp of an
empty row (flash-attention writes +inf there, which a merge would turn into NaN).

How the mask decomposes:

* no mask: one full block, the whole shard against the whole shard;
* causal, a rank against itself: one causal block (positions rise within a rank, so the causal
  mask in local order is the global one);
* causal, contiguous or zigzag: each run of consecutive positions held by the query rank against
  each run held by the key rank: a run entirely before the query run is full, a later run is
  skipped (runs of two ranks never overlap);
* causal, striped: query ``r + world a`` sees key ``j + world b`` iff ``b <= a`` when ``j < r``
  (a causal block) and iff ``b <= a - 1`` when ``j > r``: the causal block of queries 1.. against
  keys ..L-1, the first query of the shard seeing nothing (Brandon et al. 2023);
* packed documents: the runs are cut at document boundaries and only pieces of one document
  meet: the same document piece on both sides is causal (full without a causal mask), an
  earlier piece full, a later one skipped.

Full blocks that share their query rows and touch along the key rows (or the reverse) are joined,
so that a zigzag step is one kernel call.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from attnbench.parallel.documents import Documents
from attnbench.parallel.sharding import Sharding, ShardingError


@dataclass(frozen=True)
class Block:
    q: tuple[int, int]  # local query rows [start, end)
    kv: tuple[int, int]  # local rows [start, end) of the key/value shard held at this step
    causal: bool  # a square on the diagonal with the causal mask; else no mask

    @property
    def work(self) -> int:
        """Score elements the block computes (query x key pairs that are not masked)."""
        nq, nk = self.q[1] - self.q[0], self.kv[1] - self.kv[0]
        return nq * (nq + 1) // 2 if self.causal else nq * nk


def plan_blocks(sharding: Sharding, q_rank: int, kv_rank: int, causal: bool,
                documents: Documents | None = None) -> tuple[Block, ...]:
    """The blocks rank ``q_rank``'s queries compute against rank ``kv_rank``'s keys."""
    n = sharding.local
    whole = (0, n)
    if documents is None:
        if not causal:
            return (Block(whole, whole, False),)
        if q_rank == kv_rank:
            return (Block(whole, whole, True),)
        if sharding.name == "striped":
            if kv_rank < q_rank:
                return (Block(whole, whole, True),)
            return (Block((1, n), (0, n - 1), True),) if n > 1 else ()
    elif sharding.name == "striped":
        raise ShardingError("striped sharding of packed documents is not allowed; allowed: contiguous or zigzag "
                            "(striping interleaves every document across every rank)")
    return _coalesce(_segment_blocks(sharding, q_rank, kv_rank, causal, documents))


def plan_ring(sharding: Sharding, rank: int, causal: bool, documents: Documents | None = None
              ) -> tuple[tuple[Block, ...], ...]:
    """Blocks of every ring step of ``rank``: step s holds the keys of rank ``(rank - s) mod world``."""
    return tuple(plan_blocks(sharding, rank, (rank - step) % sharding.world, causal, documents)
                 for step in range(sharding.world))


def rank_work(sharding: Sharding, causal: bool, documents: Documents | None = None) -> list[int]:
    """Score elements each rank computes over the whole ring (the modelled per-rank load)."""
    return [sum(b.work for step in plan_ring(sharding, r, causal, documents) for b in step)
            for r in range(sharding.world)]


def _pieces(sharding: Sharding, rank: int, documents: Documents | None) -> list[tuple[int, int, int, int]]:
    """(global start, global end, local start, document) of each run of the rank cut at document bounds."""
    out, local = [], 0
    for start, end in sharding.runs(rank):
        for a, b, doc in (documents.segments(start, end) if documents else [(start, end, 0)]):
            out.append((a, b, local + a - start, doc))
        local += end - start
    return out


def _segment_blocks(sharding: Sharding, q_rank: int, kv_rank: int, causal: bool,
                    documents: Documents | None) -> list[Block]:
    kv_by_doc: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for a, b, local, doc in _pieces(sharding, kv_rank, documents):
        kv_by_doc[doc].append((a, b, local))
    blocks = []
    for qa, qb, ql, doc in _pieces(sharding, q_rank, documents):
        q = (ql, ql + qb - qa)
        for ka, kb, kl in kv_by_doc.get(doc, ()):
            kv = (kl, kl + kb - ka)
            if not causal or kb <= qa:
                blocks.append(Block(q, kv, False))
            elif (ka, kb) == (qa, qb):
                blocks.append(Block(q, kv, True))
            elif ka < qb:  # the runs of a sharding are equal or disjoint; anything else is a bug
                raise ShardingError(f"runs [{qa}, {qb}) and [{ka}, {kb}) overlap in part")
    return blocks


def _join(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _coalesce(blocks: list[Block]) -> tuple[Block, ...]:
    """Join full blocks: key ranges that touch under the same query rows, then query ranges that touch
    with the same key ranges. Causal blocks stay as they are."""
    causal = [b for b in blocks if b.causal]
    by_q: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for b in blocks:
        if not b.causal:
            by_q[b.q].append(b.kv)
    rows: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []
    for q in sorted(by_q):
        kvs = _join(by_q[q])
        if rows and rows[-1][0][1] == q[0] and rows[-1][1] == kvs:
            rows[-1] = ((rows[-1][0][0], q[1]), kvs)
        else:
            rows.append((q, kvs))
    full = [Block(q, kv, False) for q, kvs in rows for kv in kvs]
    return tuple(sorted(full + causal, key=lambda b: (b.q, b.kv)))
