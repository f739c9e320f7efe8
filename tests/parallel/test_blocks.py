"""Sharding layouts, packed documents and the block plan, without processes: the plan must cover exactly
the global mask, each (query, key) pair once, for every sharding, world size, mask and document packing."""
import pytest
import torch

from attnbench.parallel.blocks import plan_blocks, plan_ring, rank_work
from attnbench.parallel.documents import Documents, DocumentsError, synthetic_lengths
from attnbench.parallel.sharding import SHARDINGS, Sharding, ShardingError


def true_mask(total: int, causal: bool, documents: Documents | None) -> torch.Tensor:
    """(query, key) -> visible, for the whole sequence."""
    i = torch.arange(total)[:, None]
    j = torch.arange(total)[None, :]
    visible = (j <= i) if causal else torch.ones(total, total, dtype=torch.bool)
    if documents is not None:
        doc = torch.repeat_interleave(torch.arange(len(documents.lengths)), torch.tensor(documents.lengths))
        visible = visible & (doc[:, None] == doc[None, :])
    return visible


def planned_coverage(sharding: Sharding, causal: bool, documents: Documents | None) -> torch.Tensor:
    """How many times the plan computes each global (query, key) pair."""
    count = torch.zeros(sharding.total, sharding.total, dtype=torch.int32)
    for rank in range(sharding.world):
        q_pos = sharding.positions(rank)
        for step, blocks in enumerate(plan_ring(sharding, rank, causal, documents)):
            kv_pos = sharding.positions((rank - step) % sharding.world)
            for b in blocks:
                qs, ks = q_pos[b.q[0]:b.q[1]], kv_pos[b.kv[0]:b.kv[1]]
                assert len(qs) and len(ks), "an empty block"
                if b.causal:
                    assert len(qs) == len(ks)
                    tile = torch.ones(len(qs), len(ks), dtype=torch.int32).tril()
                else:
                    tile = torch.ones(len(qs), len(ks), dtype=torch.int32)
                count[qs[:, None], ks[None, :]] += tile
    return count


CASES = [(name, world, causal) for name in SHARDINGS for world in (1, 2, 3, 4) for causal in (False, True)]


@pytest.mark.parametrize("name,world,causal", CASES)
def test_plan_covers_the_mask_once_dense(name, world, causal):
    sharding = Sharding(name, world, 2 * world * 6)
    count = planned_coverage(sharding, causal, None)
    assert torch.equal(count, true_mask(sharding.total, causal, None).int())


@pytest.mark.parametrize("name", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_plan_covers_the_document_mask_once(name, world, causal):
    total = 2 * world * 10
    # documents that start and end inside chunks, span chunk and rank boundaries, and one of length 1
    lengths = synthetic_lengths(total - 1, distribution="lognormal", mean=7, sigma=0.8, seed=world) + [1]
    documents = Documents.from_lengths(lengths, total)
    count = planned_coverage(Sharding(name, world, total), causal, documents)
    assert torch.equal(count, true_mask(total, causal, documents).int())


def test_zigzag_is_one_kernel_call_per_step_and_balanced():
    sharding = Sharding("zigzag", 4, 64)
    for rank in range(4):
        assert all(len(step) == 1 for step in plan_ring(sharding, rank, True))
    assert len(set(rank_work(sharding, True))) == 1
    contiguous = rank_work(Sharding("contiguous", 4, 64), True)
    assert contiguous == sorted(contiguous) and contiguous[-1] > 4 * contiguous[0]


def test_striped_off_diagonal_block_drops_the_first_query():
    (block,) = plan_blocks(Sharding("striped", 2, 8), 0, 1, True)
    assert (block.q, block.kv, block.causal) == ((1, 4), (0, 3), True)


def test_striped_refuses_documents():
    with pytest.raises(ShardingError, match="striped sharding of packed documents"):
        plan_blocks(Sharding("striped", 2, 8), 0, 1, True, Documents.from_lengths([4, 4]))


@pytest.mark.parametrize("name", SHARDINGS)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_shard_unshard_round_trip(name, world):
    sharding = Sharding(name, world, 8 * world)
    x = torch.randn(2, 3, sharding.total, 5)
    parts = [sharding.shard(x, r, dim=2) for r in range(world)]
    assert all(p.shape == (2, 3, sharding.local, 5) for p in parts)
    assert torch.equal(torch.cat([sharding.positions(r) for r in range(world)]).sort().values,
                       torch.arange(sharding.total))
    assert torch.equal(sharding.unshard(parts, dim=2), x)


def test_zigzag_holds_the_chunks_of_pytorch_head_tail_balancer():
    from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

    sharding = Sharding("zigzag", 4, 32)
    torch_order = _HeadTailLoadBalancer(32, 4, "cpu")._generate_indices()[0]
    assert torch.equal(torch.cat([sharding.positions(r) for r in range(4)]), torch_order)


def test_sharding_errors_are_one_line():
    with pytest.raises(ShardingError, match="allowed: a positive multiple of 8"):
        Sharding("zigzag", 4, 20)
    with pytest.raises(ShardingError, match="allowed: contiguous, zigzag, striped"):
        Sharding("ring", 2, 8)


def test_synthetic_lengths_fill_the_sequence_and_repeat():
    for distribution in ("lognormal", "uniform", "fixed"):
        lengths = synthetic_lengths(1000, distribution=distribution, mean=50, seed=3)
        assert sum(lengths) == 1000 and min(lengths) >= 1
        assert lengths == synthetic_lengths(1000, distribution=distribution, mean=50, seed=3)
    assert synthetic_lengths(100, distribution="fixed", mean=30) == [30, 30, 30, 10]
    with pytest.raises(DocumentsError, match="sum to 9"):
        Documents.from_lengths([4, 5], total=10)


def test_document_segments_cut_at_boundaries():
    docs = Documents.from_lengths([3, 4, 5])
    assert docs.cu_seqlens == (0, 3, 7, 12)
    assert docs.segments(2, 9) == [(2, 3, 0), (3, 7, 1), (7, 9, 2)]
