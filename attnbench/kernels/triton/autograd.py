"""The autograd-capable entry point: forward and backward kernels behind one torch.autograd.Function."""
from __future__ import annotations

import torch

from attnbench.kernels.triton import launch


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        o, lse = launch.forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = launch.backward(do, q, k, v, o, lse, causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v over BHSD tensors (GQA when Hq > Hkv), differentiable in q, k, v."""
    return _FlashAttention.apply(q, k, v, causal, scale)
