"""How a sequence of ``total`` tokens is split over ``world`` ranks: the positions each rank holds.

Every sharding gives each rank ``total / world`` positions, in increasing global order within
the rank (so a rank's own keys are causally ordered like its queries, and one causal call covers
a rank against itself). With a causal mask the ranks' work differs by sharding:

* ``contiguous`` (naive): rank r holds ``[r L, (r + 1) L)``, L = total / world. Under a causal
  mask rank r attends to r + 1 shards of keys, so the last rank works ``world`` times as long
  as the first (the imbalance RingAttention leaves, Liu et al. 2023).
* ``zigzag``: the sequence is cut into ``2 world`` chunks and rank r holds chunks r and
  ``2 world - 1 - r`` (an early and a late chunk), so every rank does the same causal work
  (ring-flash-attention's zigzag; PyTorch's head-tail load balancer, which holds the same chunks).
* ``striped``: rank r holds positions ``r, r + world, r + 2 world, ...`` (Brandon et al. 2023,
  "Striped Attention"): every block of a causal ring step is (nearly) half masked, on every rank.

Tensors are sharded along their sequence dimension (``dim``); :func:`Sharding.unshard` puts the
ranks' parts back in global order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SHARDINGS = ("contiguous", "zigzag", "striped")


class ShardingError(ValueError):
    """A sharding that cannot split this sequence over these ranks."""


@dataclass(frozen=True)
class Sharding:
    name: str  # one of SHARDINGS
    world: int  # ranks
    total: int  # tokens of the whole (packed) sequence

    def __post_init__(self):
        if self.name not in SHARDINGS:
            raise ShardingError(f"sharding={self.name!r} is not allowed; allowed: {', '.join(SHARDINGS)}")
        if not isinstance(self.world, int) or self.world < 1:
            raise ShardingError(f"world={self.world!r} is not allowed; allowed: a positive number of ranks")
        parts = self.parts
        if self.total < parts or self.total % parts:
            raise ShardingError(f"sequence length {self.total} is not allowed for {self.name} sharding over "
                                f"{self.world} ranks; allowed: a positive multiple of {parts}")

    @property
    def parts(self) -> int:
        """How many equal pieces the sequence is cut into (zigzag cuts 2 world chunks)."""
        return 2 * self.world if self.name == "zigzag" else self.world

    @property
    def local(self) -> int:
        """Positions per rank."""
        return self.total // self.world

    def runs(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The rank's positions as runs ``(start, end)`` of consecutive global positions, in local order.

        Striped sharding has ``local`` runs of one position; :mod:`attnbench.parallel.blocks` plans
        it by its own rule instead of run by run.
        """
        self._check_rank(rank)
        if self.name == "contiguous":
            return ((rank * self.local, (rank + 1) * self.local),)
        if self.name == "zigzag":
            chunk = self.total // self.parts
            late = self.parts - 1 - rank
            return ((rank * chunk, (rank + 1) * chunk), (late * chunk, (late + 1) * chunk))
        return tuple((p, p + 1) for p in range(rank, self.total, self.world))

    def positions(self, rank: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """Global positions of the rank's tokens, in local order (int64)."""
        self._check_rank(rank)
        if self.name == "striped":
            return torch.arange(rank, self.total, self.world, device=device)
        return torch.cat([torch.arange(a, b, device=device) for a, b in self.runs(rank)])

    def shard(self, x: torch.Tensor, rank: int, dim: int) -> torch.Tensor:
        """The rank's part of ``x`` along ``dim`` (a new contiguous tensor)."""
        if x.shape[dim] != self.total:
            raise ShardingError(f"tensor has {x.shape[dim]} positions along dim {dim}; the sharding is of {self.total}")
        return x.index_select(dim, self.positions(rank, x.device)).contiguous()

    def unshard(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The ranks' parts (rank order) back in global order along ``dim``."""
        if len(parts) != self.world:
            raise ShardingError(f"{len(parts)} parts; the sharding is over {self.world} ranks")
        shape = list(parts[0].shape)
        shape[dim] = self.total
        full = parts[0].new_empty(shape)
        for rank, part in enumerate(parts):
            full.index_copy_(dim, self.positions(rank, part.device), part)
        return full

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world:
            raise ShardingError(f"rank={rank} is not allowed; allowed: 0 to {self.world - 1}")
