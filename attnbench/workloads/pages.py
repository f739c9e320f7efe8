"""Paged KV caches: the page table of a batch and the pages its K/V rows are scattered into.

A serving engine keeps the KV cache in fixed-size pages (vLLM's blocks, Kwon et al., SOSP 2023) taken
from a free list; once it has run for a while the free list is in no order, so a request's pages are
scattered over the pool. :meth:`PageTable.fragmented` builds that state: the pool holds exactly the
batch's pages, the free list is a seeded random permutation of them, and each sequence takes its
pages from the front of the list in turn. :meth:`PageTable.contiguous` is the fresh-engine layout
(pages numbered in order), kept for tests and comparisons.

Two views of one table, for the two kinds of kernel API:

* CSR (FlashInfer, "KV-Cache Layout in FlashInfer"): ``indptr`` (B + 1), ``indices`` (one entry per
  page), ``last_page_len`` (B, 1..page_size);
* a block table (vLLM's ``block_tables``, flash-attention's ``page_table``): (B, max pages) int32,
  unused entries 0 (a valid page the kernel never reads past the sequence's length).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PageTable:
    """Sequence ``b`` owns pages ``indices[indptr[b]:indptr[b+1]]`` of a pool of ``num_pages``."""

    indptr: torch.Tensor  # (B + 1,) int32
    indices: torch.Tensor  # (total pages,) int32
    last_page_len: torch.Tensor  # (B,) int32
    page_size: int
    kv_lens: tuple[int, ...]

    @staticmethod
    def _build(kv_lens, page_size: int, order: torch.Tensor, device) -> "PageTable":
        pages = [-(-n // page_size) for n in kv_lens]
        indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
        last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)], dtype=torch.int32)
        return PageTable(indptr.to(device), order.to(torch.int32).to(device), last.to(device), page_size,
                         tuple(int(n) for n in kv_lens))

    @staticmethod
    def _check(kv_lens, page_size: int) -> None:
        if page_size < 1 or not kv_lens or min(kv_lens) < 1:
            raise ValueError(f"page_size={page_size} and KV lengths {list(kv_lens)[:4]}... are not allowed; "
                             "allowed: positive integers")

    @staticmethod
    def contiguous(kv_lens, page_size: int, device="cpu") -> "PageTable":
        """Pages numbered in order: sequence 0 owns the first pages, and so on."""
        PageTable._check(kv_lens, page_size)
        total = sum(-(-n // page_size) for n in kv_lens)
        return PageTable._build(kv_lens, page_size, torch.arange(total), device)

    @staticmethod
    def fragmented(kv_lens, page_size: int, *, seed: int, device="cpu") -> "PageTable":
        """Pages taken from a seeded, shuffled free list (module docstring)."""
        PageTable._check(kv_lens, page_size)
        total = sum(-(-n // page_size) for n in kv_lens)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
        return PageTable._build(kv_lens, page_size, order, device)

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def num_pages(self) -> int:
        return int(self.indices.numel())

    def block_table(self) -> torch.Tensor:
        """(B, max pages) int32, rows padded with page 0."""
        counts = (self.indptr[1:] - self.indptr[:-1]).tolist()
        table = torch.zeros(self.batch, max(counts), dtype=torch.int32, device=self.indices.device)
        for b, n in enumerate(counts):
            table[b, :n] = self.indices[int(self.indptr[b]):int(self.indptr[b]) + n]
        return table

    def slots(self, device) -> torch.Tensor:
        """Flat pool slot (page * page_size + offset) of every KV row, sequences in order: (sum kv_lens,) int64."""
        rows = []
        for b, n in enumerate(self.kv_lens):
            pos = torch.arange(n)
            page = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].cpu().long()[pos // self.page_size]
            rows.append(page * self.page_size + pos % self.page_size)
        return torch.cat(rows).to(device)

    def scatter(self, rows: torch.Tensor) -> torch.Tensor:
        """KV rows (sum kv_lens, H, D), sequences end to end -> pages (num_pages, page_size, H, D); padding zero."""
        pages = torch.zeros(self.num_pages * self.page_size, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
        pages[self.slots(rows.device)] = rows
        return pages.unflatten(0, (self.num_pages, self.page_size))

    def gather(self, pages: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`scatter`: the KV rows back from the pages, sequences end to end."""
        return pages.flatten(0, 1)[self.slots(pages.device)]


def token_rows(x: torch.Tensor) -> torch.Tensor:
    """BHSD (B, H, S, D) -> (B*S, H, D): the token rows of every sequence end to end (a packed ragged
    tensor has B = 1 and is already in sequence order)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def case_page_seed(case_id: str) -> int:
    """The free list's seed: one per case, so every backend of a case reads the same page layout."""
    return int(case_id, 16) % (2**31)
