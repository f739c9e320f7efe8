"""FlexAttention (``torch.nn.attention.flex_attention``), compiled, causal through a block mask.

The block mask is built in :meth:`Flex.build`, outside the timed call; the first
call compiles (Inductor generates a Triton kernel on CUDA, C++ on CPU), so the
harness records it as setup time, apart from kernel time.
"""
from __future__ import annotations

import functools

import torch

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, register


@functools.cache
def _compiled_flex():
    """One compiled FlexAttention; every new shape recompiles (``dynamic=False`` gives the fastest kernels).

    Dynamo runs a function eagerly once it has been recompiled ``recompile_limit``
    times (8 by default): FlexAttention would then silently run its slow reference
    path under the ``flex`` name. Raise the limit to cover a sweep, and make hitting
    it an error instead of a silent fallback.
    """
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 4096)
    dynamo_config.fail_on_recompile_limit_hit = True
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(seq_q: int, seq_kv: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = seq_kv - seq_q

    def bottom_right_causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return create_block_mask(bottom_right_causal, B=None, H=None, Q_LEN=seq_q, KV_LEN=seq_kv, device=device)


@register
class Flex(Backend):
    name = "flex"
    family = "fused"
    kernel_pattern = r"triton|flex"  # checked on CUDA: the eager fallback runs no Triton kernel

    def available(self) -> tuple[bool, str]:
        try:
            from torch.nn.attention import flex_attention  # noqa: F401
        except ImportError as err:
            return False, f"FlexAttention needs torch>=2.5 ({err})"
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.page_size:
            return False, "this adapter runs FlexAttention on a contiguous KV cache"
        if case.dtype == "fp32" and torch.cuda.is_available() and case.head_dim_qk > 128:
            return False, "FlexAttention's fp32 kernel runs out of shared memory above head_dim 128"
        return True, ""

    def attention(self, q, k, v, *, causal: bool, scale: float):
        mask = _causal_block_mask(q.shape[-2], k.shape[-2], str(q.device)) if causal else None
        return _compiled_flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])

    def build(self, case: Case, tensors: Tensors):
        if case.causal:  # build the mask now, outside the timed call
            _causal_block_mask(case.seq_q, case.seq_kv, str(tensors.q.device))
        return super().build(case, tensors)
