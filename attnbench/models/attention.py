"""Causal self-attention in four head layouts, calling any registered backend by name.

Shape legend: B batch, S sequence, D model width, H query heads, Hkv K/V heads,
Dh head dim, Dqk / Dv query-key and value head dims, C latent rank (kv_lora_rank),
R decoupled RoPE dim. Tensors handed to the backend are BHSD (the contract of
:mod:`attnbench.kernels.registry`).

* :class:`GroupedQueryAttention`: ``mha`` (Hkv = H, Vaswani et al. 2017), ``gqa``
  (H % Hkv == 0, Ainslie et al. 2023) and ``mqa`` (Hkv = 1, Shazeer 2019). Decode
  caches K and V: ``2 * Hkv * Dh`` elements per token per layer.
* :class:`MultiHeadLatentAttention`: DeepSeek-V2 §2.1 (and ``deepseek-ai/DeepSeek-V3``
  ``inference/model.py`` class MLA, its ``naive`` path). Keys and values are
  up-projected per head from a shared latent ``c_kv`` of rank C; the query is
  optionally low-rank (``q_lora_rank``); a decoupled RoPE key of R dims is computed
  once and shared by every head; the softmax scale is ``1/sqrt(d_nope + d_rope)``.
  Training runs the naive form (per-head K/V, Dqk = d_nope + R, Dv = v_head_dim);
  decode caches only ``c_kv`` and the RoPE key: ``C + R`` elements per token per
  layer (DeepSeek-V2 Table 1).

qk-layernorm (Dehghani et al. 2023; Wortsman et al. 2023 §3.1.1) normalises each
head's query and key before RoPE.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from attnbench.case import Case
from attnbench.kernels.registry import get_backend
from attnbench.models.rope import apply_rope

LOGIT_BLOCK_ELEMENTS = 1 << 24  # score elements per query block of the max-logit probe


def causal_max_logit(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """max over heads and causal (i >= j) pairs of scale * q_i . k_j, in fp32, over blocks of query rows; a 0-d
    tensor on q's device, so that a probe of every layer syncs with the device once, not once a block."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
    b, h, s, _ = q.shape
    block = max(1, LOGIT_BLOCK_ELEMENTS // max(1, b * h * s))
    best = q.new_full((), float("-inf"), dtype=torch.float32)  # a fill: a tensor copied from the host would sync
    kf = k.float().transpose(-2, -1)  # (B, H, Dqk, S)
    for i in range(0, s, block):
        j = min(s, i + block)
        scores = torch.matmul(q[:, :, i:j].float() * scale, kf[..., :j])  # (B, H, j-i, j)
        hidden = torch.ones(j - i, j, dtype=torch.bool, device=q.device).triu(diagonal=i + 1)
        best = torch.maximum(best, scores.masked_fill(hidden, float("-inf")).amax())
    return best


class _Attention(nn.Module):
    """What both families share: the backend call, the probe and the decode-cache ledger."""

    scale: float
    heads: int

    def __init__(self, backend: str):
        super().__init__()
        self.backend_name = backend
        self.backend = get_backend(backend)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        y = self.backend.attention(q, k, v, causal=True, scale=self.scale)  # (B, H, S, Dv)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))

    @torch.no_grad()
    def max_logit(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Largest pre-softmax attention logit on this input (Wortsman et al. 2023, attention logit growth)."""
        q, k, _ = self.qkv(x, cos, sin)
        return causal_max_logit(q, k, self.scale)

    def case(self, batch: int, seq_len: int, dtype: str, mode: str = "fwd_bwd") -> Case:
        """The attention problem this layer hands its backend (naive MLA is an MHA-shaped problem)."""
        dqk, dv = self.head_dims
        layout = "mha" if self.kv_heads == self.heads else "mqa" if self.kv_heads == 1 else "gqa"
        return Case(mode=mode, layout=layout, batch=batch, heads_q=self.heads, heads_kv=self.kv_heads,
                    head_dim_qk=dqk, head_dim_v=dv, seq_q=seq_len, seq_kv=seq_len, causal=True, dtype=dtype)


class GroupedQueryAttention(_Attention):
    """MHA / GQA / MQA: H query heads share Hkv K/V heads."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, head_dim: int, backend: str, qk_norm: bool):
        super().__init__(backend)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wq = nn.Linear(d_model, heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, d_model, bias=False)
        self.q_norm = nn.LayerNorm(head_dim, bias=False) if qk_norm else None
        self.k_norm = nn.LayerNorm(head_dim, bias=False) if qk_norm else None
        self.scale = head_dim ** -0.5

    @property
    def head_dims(self) -> tuple[int, int]:
        return self.head_dim, self.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.head_dim

    @property
    def cache_elements_per_token(self) -> int:
        """K and V of every K/V head: 2 * Hkv * Dh (DeepSeek-V2 Table 1)."""
        return 2 * self.kv_heads * self.head_dim

    def qkv(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, Dh)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, Dh)
        if self.q_norm is not None:  # LayerNorm runs in fp32 under autocast: cast back for the kernel
            q, k = self.q_norm(q).to(v.dtype), self.k_norm(k).to(v.dtype)
        q = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype))
        k = apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))
        return q, k, v

    def kv_cache(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        """What decode keeps per token: the roped K and V, (B, Hkv, S, Dh) each."""
        _, k, v = self.qkv(x, cos, sin)
        return k, v


class MultiHeadLatentAttention(_Attention):
    """DeepSeek-V2 MLA, naive (non-absorbed) form for training; names follow DeepSeek-V3's ``MLA``."""

    def __init__(self, d_model: int, heads: int, kv_lora_rank: int, q_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, backend: str, qk_norm: bool):
        super().__init__(backend)
        self.heads, self.kv_heads = heads, heads  # naive form: per-head K/V up-projected from the latent
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.nope, self.rope, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        dqk = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank:
            self.wq_a = nn.Linear(d_model, q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(q_lora_rank)
            self.wq_b = nn.Linear(q_lora_rank, heads * dqk, bias=False)
        else:
            self.wq = nn.Linear(d_model, heads * dqk, bias=False)
        self.wkv_a = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)  # latent + shared RoPE key
        self.kv_norm = nn.RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(heads * v_head_dim, d_model, bias=False)
        self.qk_norm_q = nn.LayerNorm(dqk, bias=False) if qk_norm else None
        self.qk_norm_k = nn.LayerNorm(dqk, bias=False) if qk_norm else None
        self.scale = dqk ** -0.5  # over (nope + rope) dims, DeepSeek-V2 eq. 17

    @property
    def head_dims(self) -> tuple[int, int]:
        return self.nope + self.rope, self.v_head_dim

    @property
    def rotary_dim(self) -> int:
        return self.rope

    @property
    def cache_elements_per_token(self) -> int:
        """The latent and the shared RoPE key: d_c + d_h^R (DeepSeek-V2 Table 1)."""
        return self.kv_lora_rank + self.rope

    def _latent(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(c_kv (B, S, C) normalised, k_pe (B, 1, S, R) before RoPE): everything decode needs from a token."""
        b, s, _ = x.shape
        kv = self.wkv_a(x)  # (B, S, C + R)
        c_kv, k_pe = kv.split([self.kv_lora_rank, self.rope], dim=-1)
        return self.kv_norm(c_kv), k_pe.view(b, 1, s, self.rope)  # one RoPE key for all heads

    def expand(self, c_kv: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head (k_nope (B, H, S, nope), v (B, H, S, Dv)) up-projected from the latent."""
        b, s, _ = c_kv.shape
        kv = self.wkv_b(c_kv).view(b, s, self.heads, self.nope + self.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_head_dim], dim=-1)
        return k_nope, v

    def _rope_tail(self, t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate the last R dims (the decoupled RoPE part); the first ``nope`` dims carry no position."""
        t_nope, t_pe = t.split([self.nope, self.rope], dim=-1)
        return torch.cat((t_nope, apply_rope(t_pe, cos.to(t.dtype), sin.to(t.dtype))), dim=-1)

    def qkv(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_lora_rank else self.wq(x)
        q = q.view(b, s, self.heads, self.nope + self.rope).transpose(1, 2)  # (B, H, S, Dqk)
        c_kv, k_pe = self._latent(x)
        k_nope, v = self.expand(c_kv)
        k = torch.cat((k_nope, k_pe.to(k_nope.dtype).expand(b, self.heads, s, self.rope)), dim=-1)  # (B, H, S, Dqk)
        if self.qk_norm_q is not None:  # LayerNorm runs in fp32 under autocast: cast back for the kernel
            q, k = self.qk_norm_q(q).to(v.dtype), self.qk_norm_k(k).to(v.dtype)
        return self._rope_tail(q, cos, sin), self._rope_tail(k, cos, sin), v

    def kv_cache(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        """What decode keeps per token: the latent (B, S, C) and the roped shared key (B, S, R)."""
        c_kv, k_pe = self._latent(x)
        return c_kv, apply_rope(k_pe, cos.to(k_pe.dtype), sin.to(k_pe.dtype)).squeeze(1)
