"""Plain PyTorch attention that materialises the scores: the readable reference path.

The recipe of Hugging Face ``eager_attention_forward``: scores in the input
dtype, softmax computed in fp32 and cast back. Its HBM passes over the score
matrix are counted in :func:`attnbench.bench.conventions.score_passes`; keep the
two in step.

:func:`block_attention` is the same recipe on any block of rows and keys of one sequence, with an
attention variant's mask and score change (:mod:`attnbench.workloads.variants`): the fp64 reference
and the eager baseline of :mod:`attnbench.bench.numerics` run it block by block, and the ``eager``
backend runs it once per sequence (or document) of a ragged batch.
"""
from __future__ import annotations

import torch

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, register
from attnbench.workloads.variants import Semantics


def block_attention(q, k, v, *, scale: float, sem: Semantics, p: torch.Tensor, j: torch.Tensor,
                    heads: slice = slice(None)) -> torch.Tensor:
    """softmax(transform(q k^T * scale) + bias, masked) v for query rows at positions ``p`` and keys at
    positions ``j`` of one sequence; BHSD in and out, ``heads`` the query heads of ``q`` (for ALiBi)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # (B, Hkv, S, D) -> (B, Hq, S, D): the K/V head each query head reads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = sem.transform(torch.matmul(q * scale, k.transpose(-2, -1)))  # (B, Hq, rows, keys)
    bias = sem.bias(p, j, heads, scores.dtype)
    if bias is not None:
        scores = scores + bias
    keep = sem.keep(p, j)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # (B, Hq, rows, Dv)


def eager_attention(q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v with bottom-right causal alignment; BHSD in and out."""
    sq, skv = q.shape[-2], k.shape[-2]
    p = torch.arange(sq, device=q.device) + (skv - sq)
    return block_attention(q, k, v, scale=scale, sem=Semantics(causal=causal), p=p,
                           j=torch.arange(skv, device=q.device))


def segment_attention(case: Case, t: Tensors, sem: Semantics) -> torch.Tensor:
    """:func:`block_attention` over each segment of the case (its sequences or documents), in its layout;
    one batched call when every batch row is one whole sequence."""
    if not case.ragged and case.variant != "document":
        p = torch.arange(case.seq_q, device=t.q.device) + (case.seq_kv - case.seq_q)
        return block_attention(t.q, t.k, t.v, scale=case.scale, sem=sem, p=p,
                               j=torch.arange(case.seq_kv, device=t.q.device))
    out = t.q.new_empty(*t.q.shape[:-1], t.v.shape[-1])
    for b, q0, nq, kv0, nkv in case.segment_slices():
        p = torch.arange(nq, device=t.q.device) + (nkv - nq)
        out[b:b + 1, :, q0:q0 + nq] = block_attention(
            t.q[b:b + 1, :, q0:q0 + nq], t.k[b:b + 1, :, kv0:kv0 + nkv], t.v[b:b + 1, :, kv0:kv0 + nkv],
            scale=case.scale, sem=sem, p=p, j=torch.arange(nkv, device=t.q.device))
    return out


@register
class Eager(Backend):
    name = "eager"
    family = "eager"
    kernel_pattern = r"gemm|matmul|softmax|bmm|mm"

    def attention(self, q, k, v, *, causal: bool, scale: float):
        return eager_attention(q, k, v, causal=causal, scale=scale)

    def build(self, case: Case, tensors: Tensors):
        if case.dense:
            return super().build(case, tensors)
        # a ragged batch or a variant: one call per sequence (or document), as plain PyTorch would loop
        sem = Semantics.of(case)
        t = Tensors(*(x.detach() for x in (tensors.q, tensors.k, tensors.v)))
        return lambda: segment_attention(case, t, sem)
