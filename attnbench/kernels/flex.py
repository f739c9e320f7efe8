"""FlexAttention (``torch.nn.attention.flex_attention``), compiled, masks and variants as mods.

Every mask is a block mask built in :meth:`Flex.build`, outside the timed call (by a compiled
``create_block_mask`` at long sequences: :func:`block_mask`); the first call compiles (Inductor
generates a Triton kernel on CUDA, C++ on CPU), so the harness records it as setup time, apart from
kernel time.

* dense cases: bottom-right causal (``q_idx + Skv - Sq >= kv_idx``);
* ragged batches and the ``document`` variant: the segments packed end to end in one batch row
  (:mod:`attnbench.kernels.varlen`), a ``mask_mod`` that keeps a pair only inside one segment
  (attention-gym's document mask), causal within it bottom-right aligned, so the block mask skips
  every tile between two segments;
* variants (:mod:`attnbench.workloads.variants`) as ``mask_mod`` (sliding window, prefix LM) and
  ``score_mod`` (softcap, ALiBi), on positions within each sequence.
"""
from __future__ import annotations

import functools

import torch

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, register
from attnbench.kernels.varlen import to_case_layout, varlen_view
from attnbench.workloads.variants import Semantics, alibi_slopes


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


DENSE_MASK_ELEMENTS = 1 << 28  # above this many (query, key) pairs, block masks are made by compiled code


@functools.cache
def _compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


def block_mask(mask_mod, q_len: int, kv_len: int, device: str):
    """``create_block_mask`` for one (query length, key length). Run eagerly it first evaluates ``mask_mod``
    at every (query, key) pair, at 8 bytes a pair while the blocks are reduced: 128 GiB at 128k x 128k, the
    H200 context sweep's ``oom`` rows. Above :data:`DENSE_MASK_ELEMENTS` pairs it is compiled, as PyTorch
    advises (the deprecation note of ``create_block_mask``'s ``_compile`` flag), and Inductor fuses the mask
    into the block reduction, so no dense mask is made (``tests/kernels/test_flex_block_mask.py`` bounds the
    memory at 64k x 64k); below, eager spares a compile per shape."""
    from torch.nn.attention.flex_attention import create_block_mask

    make = _compiled_create_block_mask() if q_len * kv_len > DENSE_MASK_ELEMENTS else create_block_mask
    return make(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=device)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(seq_q: int, seq_kv: int, device: str):
    offset = seq_kv - seq_q

    def bottom_right_causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return block_mask(bottom_right_causal, seq_q, seq_kv, device)


def _segment_ids(lens, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment of each packed token, its position within the segment)."""
    lens_t = torch.tensor(lens, device=device)
    seg = torch.repeat_interleave(torch.arange(len(lens), device=device), lens_t)
    starts = torch.cumsum(lens_t, 0) - lens_t
    return seg, torch.arange(int(lens_t.sum()), device=device) - starts[seg]


def mods(case: Case, device, packed: bool):
    """(mask_mod or None, score_mod or None) of a case; ``packed``: its segments lie end to end in one row.

    Positions are per segment: a query at position ``i`` of a segment with ``q`` queries and ``kv`` keys
    sits at ``i + kv - q`` (bottom-right). The mods index small lookup tensors captured here, which
    FlexAttention's compiler reads as kernel inputs."""
    sem = Semantics.of(case)
    if packed:
        segments = case.segments()
        q_seg, q_pos = _segment_ids([q for q, _ in segments], device)
        kv_seg, kv_pos = _segment_ids([kv for _, kv in segments], device)
        offset = torch.tensor([kv - q for q, kv in segments], device=device)

        def where(q_idx, kv_idx):  # same segment, aligned query position, key position
            return q_seg[q_idx] == kv_seg[kv_idx], q_pos[q_idx] + offset[q_seg[q_idx]], kv_pos[kv_idx]
    else:
        shift = case.seq_kv - case.seq_q

        def where(q_idx, kv_idx):
            return None, q_idx + shift, kv_idx

    def mask_mod(b, h, q_idx, kv_idx):
        same, p, j = where(q_idx, kv_idx)
        if sem.variant == "prefix_lm":
            keep = (j <= p) | (j < sem.prefix_len)
        elif sem.causal:
            keep = j <= p
            if sem.variant == "sliding_window":
                keep = keep & (j >= p - sem.window)
        else:
            return same  # packed and not causal: the segment is the whole mask
        return keep if same is None else keep & same

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return sem.softcap * torch.tanh(score / sem.softcap)

    slopes = alibi_slopes(case.heads_q).to(device=device, dtype=torch.float32) if sem.variant == "alibi" else None

    def alibi_mod(score, b, h, q_idx, kv_idx):
        _, p, j = where(q_idx, kv_idx)
        return score - slopes[h] * (p - j)

    score_mod = {"softcap": softcap_mod, "alibi": alibi_mod}.get(sem.variant)
    return (mask_mod if packed or sem.masked else None), score_mod


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
        return self._flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])

    def _flex(self):
        return _compiled_flex()

    def build(self, case: Case, tensors: Tensors):
        if case.dense:
            if case.causal:  # build the mask now, outside the timed call
                _causal_block_mask(case.seq_q, case.seq_kv, str(tensors.q.device))
            return super().build(case, tensors)
        device = tensors.q.device
        packed = case.ragged or case.variant == "document"
        if packed:  # (1, H, total, D): the segments end to end
            view = varlen_view(case, tensors)
            q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (view.q, view.k, view.v))
        else:
            q, k, v = (x.detach() for x in (tensors.q, tensors.k, tensors.v))
        mask_mod, score_mod = mods(case, device, packed)
        mask = None if mask_mod is None else block_mask(mask_mod, q.shape[2], k.shape[2], str(device))
        flex, scale, gqa = self._flex(), case.scale, case.heads_q != case.heads_kv
        return lambda: flex(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=gqa)

    def output(self, case: Case, result) -> torch.Tensor:
        if case.ragged or case.variant == "document":  # (1, H, total, Dv) rows -> the case layout
            return to_case_layout(case, result[0].transpose(0, 1))
        return result
