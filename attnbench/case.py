"""The unit of measurement: one attention problem, frozen and hashable.

A :class:`Case` says *what* is run (shapes, mode, layout, dtype), never how it is
timed or which backend runs it; a results row is one (case, backend) pair.
Layout rules follow the head-sharing schemes they name:

* ``mha``: every query head has its own K/V head (``heads_kv == heads_q``).
* ``gqa``: groups of query heads share a K/V head (Ainslie et al. 2023),
  ``heads_q % heads_kv == 0``; ``heads_kv == heads_q`` is allowed and equals MHA.
* ``mqa``: one K/V head for all query heads (Shazeer 2019), ``heads_kv == 1``.
* ``mla``: DeepSeek-V2 multi-head latent attention in its absorbed form: one
  shared latent "head" (``heads_kv == 1``) whose key is the latent plus the
  decoupled RoPE key (``head_dim_qk = kv_lora_rank + rope_dim``) and whose value
  is the latent itself (``head_dim_v = kv_lora_rank``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import torch

MODES = ("fwd", "fwd_bwd", "decode")
LAYOUTS = ("mha", "gqa", "mqa", "mla")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class CaseError(ValueError):
    """A case field holds a value its layout or mode does not allow."""


def _allowed(field: str, value, allowed) -> CaseError:
    return CaseError(f"{field}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class Case:
    """One attention problem. Tensors are BHSD: q (batch, heads_q, seq_q, head_dim_qk)."""

    mode: str
    layout: str
    batch: int
    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    seq_q: int
    seq_kv: int
    causal: bool
    dtype: str
    page_size: int = 0  # 0: contiguous KV; >0: paged KV cache (decode backends that page)

    def __post_init__(self):
        if self.mode not in MODES:
            raise _allowed("mode", self.mode, MODES)
        if self.layout not in LAYOUTS:
            raise _allowed("layout", self.layout, LAYOUTS)
        if self.dtype not in DTYPES:
            raise _allowed("dtype", self.dtype, DTYPES)
        for name in ("batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "seq_q", "seq_kv"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CaseError(f"{name}={value!r} is not allowed; allowed: a positive integer")
        if self.page_size < 0:
            raise CaseError(f"page_size={self.page_size!r} is not allowed; allowed: 0 (contiguous) or a positive integer")
        if self.layout == "mha" and self.heads_kv != self.heads_q:
            raise CaseError(f"heads_kv={self.heads_kv} is not allowed for layout mha; allowed: heads_kv == heads_q ({self.heads_q})")
        if self.layout == "gqa" and self.heads_q % self.heads_kv:
            divisors = [d for d in range(1, self.heads_q + 1) if self.heads_q % d == 0]
            raise CaseError(f"heads_kv={self.heads_kv} is not allowed for layout gqa with heads_q={self.heads_q}; "
                            f"allowed: a divisor of heads_q ({', '.join(map(str, divisors))})")
        if self.layout in ("mqa", "mla") and self.heads_kv != 1:
            raise CaseError(f"heads_kv={self.heads_kv} is not allowed for layout {self.layout}; allowed: 1")
        if self.layout == "mla" and self.head_dim_v >= self.head_dim_qk:
            raise CaseError(f"head_dim_v={self.head_dim_v} is not allowed for layout mla; allowed: "
                            f"the latent rank, smaller than head_dim_qk={self.head_dim_qk} (latent + rope dims)")
        if self.mode != "decode" and self.page_size:
            raise CaseError(f"page_size={self.page_size} is not allowed for mode {self.mode}; allowed: 0 (paging is decode-only)")
        if self.causal and self.seq_q > self.seq_kv:
            raise CaseError(f"seq_q={self.seq_q} is not allowed with causal=True and seq_kv={self.seq_kv}; "
                            "allowed: seq_q <= seq_kv (bottom-right aligned mask)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(d_qk) (Vaswani et al. 2017), the one every backend and the reference use.

        For absorbed MLA decode d_qk = d_c + d_h^R (576), while DeepSeek-V2 scales by the head dim
        before absorption, 1/sqrt(d_h + d_h^R) (192), which a case does not record; the scale
        changes no kernel's work, and numerics compare like with like.
        """
        return self.head_dim_qk ** -0.5

    @property
    def has_backward(self) -> bool:
        return self.mode == "fwd_bwd"

    def fields(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def case_id(self) -> str:
        """Stable 12-hex id: a hash of the field values, independent of process and version."""
        payload = json.dumps(self.fields(), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:12]

    @property
    def shape_class(self) -> tuple:
        """Cases that should run the same kernels: used to profile kernel names once per class."""
        return (self.mode, self.layout, self.dtype, self.causal, self.head_dim_qk, self.head_dim_v, self.page_size > 0)

    def label(self) -> str:
        return (f"{self.mode} {self.layout} B{self.batch} Hq{self.heads_q} Hkv{self.heads_kv} "
                f"Sq{self.seq_q} Skv{self.seq_kv} D{self.head_dim_qk}/{self.head_dim_v} "
                f"{'causal ' if self.causal else ''}{self.dtype}")


@dataclass
class Tensors:
    """Inputs of one case in BHSD layout; ``dout`` is set for fwd_bwd."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None = None
