"""Page tables: contiguous and fragmented (a shuffled free list), CSR and block-table views, scatter/gather."""
import pytest
import torch

from attnbench.workloads.pages import PageTable, case_page_seed, token_rows


def test_a_table_for_sequences_that_do_not_fill_their_last_page():
    table = PageTable.contiguous((40, 16, 1), page_size=16)
    assert table.indptr.tolist() == [0, 3, 4, 5] and table.indices.tolist() == list(range(5))
    assert table.last_page_len.tolist() == [8, 16, 1] and table.num_pages == 5 and table.batch == 3
    assert all(t.dtype == torch.int32 for t in (table.indptr, table.indices, table.last_page_len))
    with pytest.raises(ValueError, match="page_size=0"):
        PageTable.contiguous((32,), page_size=0)


def test_fragmented_pages_are_a_seeded_permutation_of_the_pool():
    lens = (100, 37, 64, 5)
    a = PageTable.fragmented(lens, 16, seed=3)
    assert a.indptr.tolist() == PageTable.contiguous(lens, 16).indptr.tolist()  # the same pages per sequence
    assert sorted(a.indices.tolist()) == list(range(a.num_pages))  # every page of the pool, once
    assert a.indices.tolist() != list(range(a.num_pages))  # not in order
    assert torch.equal(PageTable.fragmented(lens, 16, seed=3).indices, a.indices)
    assert not torch.equal(PageTable.fragmented(lens, 16, seed=4).indices, a.indices)
    # a sequence's pages are scattered: some neighbours in the sequence are not neighbours in the pool
    first = a.indices[:7].tolist()
    assert any(b - a_ != 1 for a_, b in zip(first, first[1:]))


def test_scatter_places_each_row_where_the_table_says_and_pads_with_zeros():
    lens = (40, 9)
    table = PageTable.fragmented(lens, 16, seed=0)
    rows = torch.randn(sum(lens), 3, 8)  # (tokens, H, D), sequences end to end
    pages = table.scatter(rows)
    assert pages.shape == (4, 16, 3, 8)
    assert torch.equal(table.gather(pages), rows)
    last = table.indices[2].item()  # sequence 0's third page holds its tokens 32..39, then padding
    assert torch.equal(pages[last, :8], rows[32:40]) and not pages[last, 8:].any()


def test_block_table_rows_list_each_sequences_pages_padded_with_page_zero():
    table = PageTable.fragmented((40, 9), 16, seed=1)
    block = table.block_table()
    assert block.shape == (2, 3) and block.dtype == torch.int32
    assert block[0].tolist() == table.indices[:3].tolist() and block[1].tolist() == [table.indices[3].item(), 0, 0]


def test_token_rows_and_the_page_seed():
    x = torch.randn(2, 3, 5, 4)  # (B, H, S, D)
    assert torch.equal(token_rows(x)[1 * 5 + 4], x[1, :, 4])
    assert case_page_seed("ffffffffffff") == int("ffffffffffff", 16) % 2**31
