"""Plain PyTorch attention that materialises the scores: the readable reference path.

The recipe of Hugging Face ``eager_attention_forward``: scores in the input
dtype, softmax computed in fp32 and cast back. Its HBM passes over the score
matrix are counted in :func:`attnbench.bench.conventions.score_passes`; keep the
two in step.
"""
from __future__ import annotations

import torch

from attnbench.kernels.registry import Backend, register


def eager_attention(q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with bottom-right causal alignment; BHSD in and out."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # (B, Hkv, S, D) -> (B, Hq, S, D): the K/V head each query head reads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, Hq, Sq, Skv)
    if causal:
        sq, skv = scores.shape[-2:]
        hidden = torch.ones(sq, skv, dtype=torch.bool, device=q.device).triu(diagonal=skv - sq + 1)
        scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # (B, Hq, Sq, Dv)


@register
class Eager(Backend):
    name = "eager"
    family = "eager"
    kernel_pattern = r"gemm|matmul|softmax|bmm|mm"

    def attention(self, q, k, v, *, causal: bool, scale: float):
        return eager_attention(q, k, v, causal=causal, scale=scale)
