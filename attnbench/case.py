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

Real workloads (``docs/workloads.md``) add three things, each a field whose default is the dense case:

* **Ragged batches**: ``seq_lens_q`` / ``seq_lens_kv`` hold one length per sequence (``()``: every
  sequence is ``seq_q`` / ``seq_kv`` long); ``seq_q`` and ``seq_kv`` are then the longest, the shape the
  batch would be padded to. ``seq_q < seq_kv`` per sequence is chunked prefill against a cached prefix
  (bottom-right causal). ``workload`` names where the lengths came from (``fixed`` for a grid's own).
* **Attention variants** (``variant``), each with its one parameter: ``sliding_window`` (``window``: a
  query sees itself and the ``window`` keys before it), ``softcap`` (scores -> ``softcap *
  tanh(scores / softcap)``, Gemma 2), ``alibi`` (bias ``-slope_h * distance``, Press et al. 2022),
  ``document`` (each sequence is packed documents of ``doc_len`` tokens that do not see each other) and
  ``prefix_lm`` (the first ``prefix_len`` tokens see each other both ways, the rest causally).
* The case id hashes only the fields that differ from these defaults, so every dense case keeps the id
  it had before they existed (the committed reference results carry those ids).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import statistics
from dataclasses import dataclass

import torch

from attnbench.errors import NAME_PATTERN

MODES = ("fwd", "fwd_bwd", "decode")
VARIANTS = ("none", "sliding_window", "softcap", "alibi", "document", "prefix_lm")
# the one parameter of each variant (a Case field), and the modes it runs in
VARIANT_PARAMS = {"sliding_window": "window", "softcap": "softcap", "document": "doc_len", "prefix_lm": "prefix_len"}
VARIANT_MODES = {"sliding_window": ("fwd", "decode"), "softcap": ("fwd", "decode"), "alibi": ("fwd", "decode"),
                 "document": ("fwd",), "prefix_lm": ("fwd",)}
CAUSAL_VARIANTS = ("sliding_window", "alibi", "prefix_lm")  # defined on the causal mask
# fields added for real workloads; at these defaults they stay out of the case id (dense ids unchanged)
WORKLOAD_DEFAULTS = {"workload": "fixed", "seq_lens_q": (), "seq_lens_kv": (), "variant": "none", "window": 0,
                     "softcap": 0.0, "doc_len": 0, "prefix_len": 0}
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
    workload: str = "fixed"  # where the lengths come from: fixed, uniform, lognormal, azure-conv, azure-code, a trace
    seq_lens_q: tuple[int, ...] = ()  # ragged batch: query tokens per sequence; () = every sequence seq_q
    seq_lens_kv: tuple[int, ...] = ()  # ragged batch: KV tokens per sequence; () = every sequence seq_kv
    variant: str = "none"  # none, sliding_window, softcap, alibi, document, prefix_lm
    window: int = 0  # sliding_window: keys a query sees before its own position
    softcap: float = 0.0  # softcap: the cap c of c * tanh(score / c)
    doc_len: int = 0  # document: tokens per packed document (the last of a sequence may be shorter)
    prefix_len: int = 0  # prefix_lm: leading tokens that attend bidirectionally

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
        self._check_workload()
        self._check_variant()

    def _check_workload(self) -> None:
        if not isinstance(self.workload, str) or not NAME_PATTERN.match(self.workload):
            raise CaseError(f"workload={self.workload!r} is not allowed; allowed: a name matching {NAME_PATTERN.pattern}")
        for name, longest in (("seq_lens_q", self.seq_q), ("seq_lens_kv", self.seq_kv)):
            lens = getattr(self, name)
            if not isinstance(lens, (tuple, list)):
                raise CaseError(f"{name}={lens!r} is not allowed; allowed: a list of positive integers, one per sequence")
            lens = tuple(lens)
            object.__setattr__(self, name, lens)  # a JSON payload gives lists: store the hashable tuple
            if not lens:
                continue
            if len(lens) != self.batch:
                raise CaseError(f"{name} has {len(lens)} lengths; allowed: one per sequence (batch={self.batch})")
            if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lens):
                raise CaseError(f"{name}={list(lens)[:8]}... is not allowed; allowed: positive integers")
            if max(lens) != longest:
                name_max = name.replace("seq_lens", "seq")
                raise CaseError(f"{name_max}={longest} is not allowed with {name} (longest {max(lens)}); "
                                f"allowed: {name_max} = the longest sequence")
        if not self.ragged:
            return
        if self.mode == "fwd_bwd":
            raise CaseError("mode='fwd_bwd' is not allowed for a ragged batch; allowed: fwd, decode (inference)")
        if self.mode == "decode" and self.seq_lens_q:
            raise CaseError("seq_lens_q is not allowed for mode decode; allowed: () (every request seq_q tokens)")
        if self.causal and any(q > kv for q, kv in zip(self.lens_q, self.lens_kv)):
            raise CaseError("seq_lens_q > seq_lens_kv in a sequence is not allowed with causal=True; "
                            "allowed: query tokens <= KV tokens per sequence (bottom-right aligned mask)")

    def _check_variant(self) -> None:
        if self.variant not in VARIANTS:
            raise _allowed("variant", self.variant, VARIANTS)
        if isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float)):
            raise CaseError(f"softcap={self.softcap!r} is not allowed; allowed: a number")
        object.__setattr__(self, "softcap", float(self.softcap))  # 30 and 30.0 are one case (one id)
        wanted = VARIANT_PARAMS.get(self.variant)
        for param in VARIANT_PARAMS.values():
            value = getattr(self, param)
            if param != wanted and value:
                raise CaseError(f"{param}={value!r} is not allowed with variant={self.variant!r}; allowed: "
                                f"{param} only with variant {[v for v, p in VARIANT_PARAMS.items() if p == param][0]}")
            if param == wanted and param != "softcap" and (isinstance(value, bool) or not isinstance(value, int)
                                                           or value < 1):
                raise CaseError(f"{param}={value!r} is not allowed for variant {self.variant}; allowed: a positive integer")
        if self.variant == "softcap" and not self.softcap > 0:
            raise CaseError(f"softcap={self.softcap!r} is not allowed for variant softcap; allowed: a number > 0")
        if self.variant == "none":
            return
        if self.mode not in VARIANT_MODES[self.variant]:
            raise CaseError(f"mode={self.mode!r} is not allowed for variant {self.variant}; allowed: "
                            f"{', '.join(VARIANT_MODES[self.variant])} (variants are forward-only here)")
        if self.variant in CAUSAL_VARIANTS and not self.implied_causal:
            raise CaseError(f"causal=False is not allowed for variant {self.variant}; allowed: causal=True "
                            "(a one-query decode step is causal either way)")
        if self.variant in ("document", "prefix_lm") and (self.ragged or self.seq_q != self.seq_kv):
            raise CaseError(f"variant {self.variant} is not allowed here; allowed: a dense batch with seq_q == seq_kv")
        if self.variant == "prefix_lm" and self.prefix_len >= self.seq_q:
            raise CaseError(f"prefix_len={self.prefix_len} is not allowed with seq_q={self.seq_q}; allowed: "
                            "0 < prefix_len < seq_q")
        if self.variant == "document" and self.doc_len >= self.seq_q:
            raise CaseError(f"doc_len={self.doc_len} is not allowed with seq_q={self.seq_q}; allowed: "
                            "0 < doc_len < seq_q (one document per sequence is variant none)")

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

    @property
    def ragged(self) -> bool:
        """Sequences of different lengths (``seq_lens_q`` or ``seq_lens_kv`` set)."""
        return bool(self.seq_lens_q or self.seq_lens_kv)

    @property
    def dense(self) -> bool:
        """Equal lengths and no variant: the case every backend and the models' ``attention()`` take."""
        return not self.ragged and self.variant == "none"

    @property
    def implied_causal(self) -> bool:
        """Causal, or one query row per sequence (which sees every key under the bottom-right mask either way)."""
        return self.causal or (self.seq_q == 1 and not self.seq_lens_q)

    @property
    def lens_q(self) -> tuple[int, ...]:
        """Query tokens of each sequence."""
        return self.seq_lens_q or (self.seq_q,) * self.batch

    @property
    def lens_kv(self) -> tuple[int, ...]:
        """KV tokens of each sequence."""
        return self.seq_lens_kv or (self.seq_kv,) * self.batch

    def segments(self) -> tuple[tuple[int, int], ...]:
        """(query, KV) lengths of the independent attention problems: the sequences, or for the
        ``document`` variant each sequence's documents (``doc_len`` tokens, the last one shorter)."""
        if self.variant != "document":
            return tuple(zip(self.lens_q, self.lens_kv))
        full, rest = divmod(self.seq_q, self.doc_len)
        docs = (self.doc_len,) * full + ((rest,) if rest else ())
        return tuple((n, n) for n in docs) * self.batch

    def segment_slices(self) -> tuple[tuple[int, int, int, int, int], ...]:
        """Where each segment of :meth:`segments` lies in the case's tensors (:class:`Tensors`):
        (batch row, first query row, query rows, first key row, key rows). Packed ragged tensors have
        one batch row holding the sequences end to end; dense ones a batch row per sequence."""
        if self.ragged:
            out, q0, kv0 = [], 0, 0
            for nq, nkv in self.segments():
                out.append((0, q0, nq, kv0, nkv))
                q0, kv0 = q0 + nq, kv0 + nkv
            return tuple(out)
        per_sequence = self.segments()[: len(self.segments()) // self.batch]
        out = []
        for b in range(self.batch):
            q0 = kv0 = 0
            for nq, nkv in per_sequence:
                out.append((b, q0, nq, kv0, nkv))
                q0, kv0 = q0 + nq, kv0 + nkv
        return tuple(out)

    def fields(self) -> dict:
        return dataclasses.asdict(self)

    def identity(self) -> dict:
        """The fields the id hashes: every field, less the workload fields left at their defaults."""
        return {k: v for k, v in self.fields().items()
                if k not in WORKLOAD_DEFAULTS or v != WORKLOAD_DEFAULTS[k]}

    @property
    def case_id(self) -> str:
        """Stable 12-hex id: a hash of the field values, independent of process and version."""
        payload = json.dumps(self.identity(), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:12]

    @property
    def shape_class(self) -> tuple:
        """Cases that should run the same kernels: used to profile kernel names once per class."""
        return (self.mode, self.layout, self.dtype, self.causal, self.head_dim_qk, self.head_dim_v, self.page_size > 0,
                self.ragged, self.variant)

    def label(self) -> str:
        if self.ragged:
            q, kv = self.lens_q, self.lens_kv
            lengths = (f"{self.workload} {sum(kv)} tok (q {sum(q)}) Sq<={self.seq_q} Skv<={self.seq_kv} "
                       f"med {statistics.median(kv):g}")
        else:
            lengths = f"Sq{self.seq_q} Skv{self.seq_kv}"
        variant = "" if self.variant == "none" else f"{self.variant}" + (
            f"={getattr(self, VARIANT_PARAMS[self.variant]):g} " if self.variant in VARIANT_PARAMS else " ")
        return (f"{self.mode} {self.layout} B{self.batch} Hq{self.heads_q} Hkv{self.heads_kv} "
                f"{lengths} D{self.head_dim_qk}/{self.head_dim_v} "
                f"{'causal ' if self.causal else ''}{variant}{self.dtype}")


@dataclass
class Tensors:
    """Inputs of one case in BHSD layout; ``dout`` is set for fwd_bwd.

    A ragged case's tensors are *packed*: its sequences laid end to end in one batch row, q (1, Hq,
    total query tokens, D), k and v (1, Hkv, total KV tokens, D), with ``cu_seqlens_q`` and
    ``cu_seqlens_kv`` (int32, B + 1 offsets) marking where each sequence starts: the layout of
    flash-attention's ``cu_seqlens`` and FlashInfer's ``indptr``, without a token of padding.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_kv: torch.Tensor | None = None


def cu_seqlens(lengths, device="cpu") -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as int32: where each sequence starts in a packed tensor."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
