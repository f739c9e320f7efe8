"""The autograd-capable entry point: forward and backward kernels behind one torch.autograd.Function."""
from __future__ import annotations

import torch

from attnbench.kernels.triton import launch


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, dq_mode: str | None):
        o, lse = launch.forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.dq_mode = causal, scale, dq_mode
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = launch.backward(do, q, k, v, o, lse, causal=ctx.causal, scale=ctx.scale, dq_mode=ctx.dq_mode)
        return dq, dk, dv, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
              dq_mode: str | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v over BHSD tensors (GQA when Hq > Hkv), differentiable in q, k, v.

    ``dq_mode``: the backward's dQ path, ``"atomic"`` or ``"separate"`` (``None``: timed per shape on a GPU).
    """
    return _FlashAttention.apply(q, k, v, causal, scale, dq_mode)
