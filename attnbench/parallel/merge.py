"""Merging the results of attention over disjoint key blocks by their log-sum-exp.

For one query row and key blocks b with scores s_bj, block output O_b = sum_j softmax_b(s)_j v_j
and LSE_b = log sum_j exp(s_bj). Over the union of the blocks (the online softmax of Milakov &
Gimelshein 2018, as FlashAttention applies it tile by tile and RingAttention shard by shard,
Liu et al. 2023)::

    LSE = log(exp(LSE_acc) + exp(LSE_b))
    O   = exp(LSE_acc - LSE) O_acc + exp(LSE_b - LSE) O_b

The accumulators start at O = 0 and LSE = -inf (a row that has seen no key); the first block's
weights are then 0 and 1, so no special case is needed. Accumulation is in fp32.
"""
from __future__ import annotations

import torch


def empty_accumulators(q: torch.Tensor, head_dim_v: int, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) for a row that has seen no key: O = 0 in q's layout with ``head_dim_v``; LSE = -inf, (B, H, S)."""
    out = torch.zeros(*q.shape[:-1], head_dim_v, dtype=torch.float32, device=q.device)
    b = q.shape[0]
    h, s = (q.shape[1], q.shape[2]) if seq_dim == 2 else (q.shape[2], q.shape[1])
    lse = torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse


def lse_like_out(lse: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """(B, H, S) log-sum-exp broadcastable against an output in the layout with sequence dim ``seq_dim``."""
    return lse[..., None] if seq_dim == 2 else lse.transpose(1, 2)[..., None]


def merge_block(out: torch.Tensor, lse: torch.Tensor, rows: tuple[int, int], out_b: torch.Tensor,
                lse_b: torch.Tensor, seq_dim: int) -> None:
    """Fold a block's (O_b, LSE_b) into the accumulators' rows ``[rows[0], rows[1])``, in place."""
    start, end = rows
    acc_out = out.narrow(seq_dim, start, end - start)
    acc_lse = lse[:, :, start:end]
    new_lse = torch.logaddexp(acc_lse, lse_b.float())
    w_acc = lse_like_out(torch.exp(acc_lse - new_lse), seq_dim)
    w_b = lse_like_out(torch.exp(lse_b.float() - new_lse), seq_dim)
    acc_out.mul_(w_acc).add_(out_b.float() * w_b)
    acc_lse.copy_(new_lse)
