"""PyTorch ``scaled_dot_product_attention``, one backend per kernel, each pinned, and a padded baseline.

``torch.nn.attention.sdpa_kernel([one backend])`` leaves SDPA no fallback: if the
pinned kernel cannot run a case, SDPA raises "No available kernel" (with its
reasons as warnings) and the row becomes ``unsupported`` with those reasons,
never a number from another kernel.

Masks are built in :meth:`_SDPA.build`, outside the timed call:

* causal with ``seq_q < seq_kv`` (chunked prefill against a cached prefix): ``sdpa-flash`` and
  ``sdpa-efficient`` take ``torch.nn.attention.bias.causal_lower_right``, which PyTorch runs as the
  kernels' own bottom-right causal mask; ``sdpa-math`` and ``sdpa-cudnn`` take the same mask
  materialised as a boolean matrix (the lower-right bias would run the flash kernel whatever is
  pinned: ``CausalBias._dispatch`` calls it directly);
* variants: a boolean mask (``sliding_window``, ``prefix_lm``) or an additive bias (``alibi``) from
  :func:`attnbench.workloads.variants.dense_mask`; SDPA has no score transform, so ``softcap`` is
  unsupported;
* ragged batches and the ``document`` variant: nested jagged tensors (``torch.nested``), the native
  varlen path of PyTorch's flash, efficient and cuDNN kernels (``torch/nested/_internal/sdpa.py``),
  with equal query and K/V heads and no mask; PyTorch's CPU and math paths refuse causal nested
  inputs, and its efficient kernel aligns a nested causal mask top-left (``custom_mask_type=1``), so a
  chunk against a prefix is refused there.

``sdpa-padded`` is the baseline a serving stack without a varlen kernel runs: the ragged batch padded
to its longest sequence with a dense mask of padding, causality and variant, every mask built in
``build()``, the kernel left to SDPA's own choice (the ``kernels`` column records which ran).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, register
from attnbench.kernels.varlen import to_case_layout, varlen_view
from attnbench.workloads.variants import Semantics, dense_mask


@contextlib.contextmanager
def _nested_reasons():
    """Nested-tensor SDPA logs why each kernel refused and raises "No viable backend": raise it with them."""
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger, handler = logging.getLogger("torch.nested._internal.sdpa"), Keep()
    logger.addHandler(handler)
    try:
        yield
    except RuntimeError as err:
        if "No viable backend" not in str(err):
            raise
        reasons = " ".join(r for r in records if "not used because" not in r)
        raise RuntimeError(f"{err} {reasons}".strip()) from None
    finally:
        logger.removeHandler(handler)


def _bottom_right(sq: int, skv: int, device) -> torch.Tensor:
    return torch.ones(sq, skv, dtype=torch.bool, device=device).tril(diagonal=skv - sq)


class _SDPA(Backend):
    sdp_backend: SDPBackend | None
    cuda_only: bool = True
    lower_right_bias: bool = False  # takes causal_lower_right as its bottom-right causal mask
    nested_causal_offset: bool = True  # its nested causal mask is bottom-right aligned

    def available(self) -> tuple[bool, str]:
        if self.cuda_only and not torch.cuda.is_available():
            return False, f"{self.name} needs CUDA (torch {torch.__version__} sees no CUDA device)"
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.page_size:
            return False, "SDPA takes a contiguous KV cache, not a paged one"
        if case.variant == "softcap":
            return False, "SDPA has no score transform: a softcap runs on flex, fa4 or FlashInfer"
        if self._nested(case):
            if case.heads_kv != case.heads_q:
                return False, (f"PyTorch's nested-tensor SDPA takes equal query and K/V heads (case {case.heads_q}/"
                               f"{case.heads_kv}): run the ragged GQA batch on sdpa-padded")
            if case.variant not in ("none", "document"):
                return False, f"PyTorch's nested-tensor SDPA takes no mask (variant {case.variant}): see sdpa-padded"
            if case.causal and not self.nested_causal_offset and any(q != kv for q, kv in case.segments()):
                return False, (f"{self.name}'s nested causal mask is top-left aligned (custom_mask_type=1), "
                               "not bottom-right: a chunk against a cached prefix would be computed wrong")
        return True, ""

    @staticmethod
    def _nested(case: Case) -> bool:
        return case.ragged or case.variant == "document"

    def _kernel(self):
        return sdpa_kernel([self.sdp_backend])

    def _call(self, q, k, v, mask, causal: bool, scale: float):
        with self._kernel():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])

    def _causal_mask(self, sq: int, skv: int, device):
        """(mask, is_causal) for a dense bottom-right causal problem."""
        if sq == skv:
            return None, True
        if self.lower_right_bias:
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(sq, skv), False
        return _bottom_right(sq, skv, device), False

    def _dense_mask(self, case: Case, device, dtype):
        """(mask, is_causal) of a dense case: its causal mask, or its variant's mask or bias."""
        if case.variant == "none":
            return self._causal_mask(case.seq_q, case.seq_kv, device) if case.causal else (None, False)
        mask = dense_mask(Semantics.of(case), device, case.seq_q, case.seq_kv, dtype=dtype)
        return (mask.unsqueeze(0) if mask.dim() == 3 else mask), False  # a bias (1, Hq, Sq, Skv): 2-d or 4-d only

    def attention(self, q, k, v, *, causal: bool, scale: float):
        mask, is_causal = self._causal_mask(q.shape[-2], k.shape[-2], q.device) if causal else (None, False)
        return self._call(q, k, v, mask, is_causal, scale)

    def masked(self, q, k, v, *, mask, scale: float):
        """SDPA with an explicit mask or bias (the numerics' math baseline of a variant)."""
        return self._call(q, k, v, mask, False, scale)

    def build(self, case: Case, tensors: Tensors):
        if self._nested(case):
            return self._build_nested(case, tensors)
        q, k, v = tensors.q, tensors.k, tensors.v
        mask, is_causal = self._dense_mask(case, q.device, q.dtype)
        scale = case.scale
        if not case.has_backward:
            return lambda: self._call(q, k, v, mask, is_causal, scale)
        dout, inputs = tensors.dout, (q, k, v)

        def fwd_bwd():
            out = self._call(q, k, v, mask, is_causal, scale)
            return torch.autograd.grad(out, inputs, dout)

        return fwd_bwd

    def _build_nested(self, case: Case, tensors: Tensors):
        """Nested jagged q, k, v (B, H, j, D) from the varlen view; the lengths' bounds are given so that
        no call reads them back from the device."""
        view = varlen_view(case, tensors)

        def nested(rows, cu, lens):
            offsets = cu.to(torch.int64)
            return torch.nested.nested_tensor_from_jagged(rows, offsets, min_seqlen=min(lens),
                                                          max_seqlen=max(lens)).transpose(1, 2)

        q = nested(view.q, view.cu_q, view.lens_q)
        k, v = nested(view.k, view.cu_kv, view.lens_kv), nested(view.v, view.cu_kv, view.lens_kv)
        causal, scale = case.causal, case.scale
        with _nested_reasons():  # one call here, so that a refusal says why
            self._call(q, k, v, None, causal, scale)
        return lambda: self._call(q, k, v, None, causal, scale)

    def output(self, case: Case, result) -> torch.Tensor:
        if self._nested(case):  # nested (B, H, j, Dv) -> rows (total_q, H, Dv) -> the case layout
            return to_case_layout(case, result.transpose(1, 2).values())
        return result


@register
class SDPAMath(_SDPA):
    name = "sdpa-math"
    family = "math"
    sdp_backend = SDPBackend.MATH
    cuda_only = False
    kernel_pattern = r"gemm|matmul|softmax|bmm|mm"


@register
class SDPAFlash(_SDPA):
    name = "sdpa-flash"
    sdp_backend = SDPBackend.FLASH_ATTENTION
    cuda_only = False  # PyTorch ships a CPU flash kernel too
    lower_right_bias = True
    kernel_pattern = r"flash"


@register
class SDPAEfficient(_SDPA):
    name = "sdpa-efficient"
    sdp_backend = SDPBackend.EFFICIENT_ATTENTION
    lower_right_bias = True
    nested_causal_offset = False
    kernel_pattern = r"fmha|efficient|cutlass"


@register
class SDPACudnn(_SDPA):
    name = "sdpa-cudnn"
    sdp_backend = SDPBackend.CUDNN_ATTENTION
    kernel_pattern = r"cudnn"  # e.g. cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_...

    def version(self) -> str:
        return f"torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}"

    def available(self) -> tuple[bool, str]:
        ok, reason = super().available()
        if ok and not torch.backends.cudnn.is_available():
            return False, "cuDNN is not available to this torch build"
        return ok, reason


def padded_mask(case: Case, device, dtype) -> torch.Tensor | None:
    """(B, 1 or Hq, Sq, Skv) mask of a batch padded to its longest sequence: a key is kept when it is
    inside its sequence and the variant (or causality, bottom-right per sequence) keeps it; padding rows
    keep every real key, so that no row is fully masked (their output is dropped)."""
    sem = Semantics.of(case)
    rows, keys = torch.arange(case.seq_q, device=device), torch.arange(case.seq_kv, device=device)
    parts = []
    for nq, nkv in case.segments() if case.ragged else ((case.seq_q, case.seq_kv),) * case.batch:
        p = rows + (nkv - nq)
        keep = keys[None, :] < nkv
        inner = sem.keep(p, keys)
        if inner is not None:
            keep = keep & (inner | (rows[:, None] >= nq))
        bias = sem.bias(p, keys, slice(None), dtype)
        parts.append(keep if bias is None else bias.masked_fill(~keep, float("-inf")))
    if case.variant == "document":  # dense batch rows, each a run of documents: block-diagonal
        doc = torch.arange(case.seq_q, device=device) // case.doc_len
        same = doc[:, None] == doc[None, :]
        parts = [part & same for part in parts]
    stacked = torch.stack(parts)
    return stacked.unsqueeze(1) if stacked.dim() == 3 else stacked


@register
class SDPAPadded(_SDPA):
    """SDPA on the batch padded to its longest sequence, with a dense mask: the cost of padding, measured."""

    name = "sdpa-padded"
    sdp_backend = None  # SDPA picks its kernel, as in a serving stack's padded batch
    cuda_only = False
    kernel_pattern = ""  # any of SDPA's kernels; the row's kernels column names the one that ran

    def _kernel(self):
        return contextlib.nullcontext()

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.page_size:
            return False, "SDPA takes a contiguous KV cache, not a paged one"
        if case.variant == "softcap":
            return False, "SDPA has no score transform: a softcap runs on flex, fa4 or FlashInfer"
        if case.has_backward:
            return False, "sdpa-padded is the inference baseline of ragged batches (forward only)"
        return True, ""

    def build(self, case: Case, tensors: Tensors):
        q, k, v = (t.detach() for t in (tensors.q, tensors.k, tensors.v))
        if case.ragged:
            q = _pad(q, case.lens_q, case.seq_q)
            k, v = _pad(k, case.lens_kv, case.seq_kv), _pad(v, case.lens_kv, case.seq_kv)
        masked = case.ragged or case.causal or case.variant != "none"
        mask = padded_mask(case, q.device, q.dtype) if masked else None
        scale = case.scale
        return lambda: self._call(q, k, v, mask, False, scale)

    def output(self, case: Case, result) -> torch.Tensor:
        if not case.ragged:
            return result
        return torch.cat([result[b, :, :n] for b, n in enumerate(case.lens_q)], dim=1).unsqueeze(0)


def _pad(x: torch.Tensor, lens, longest: int) -> torch.Tensor:
    """Packed (1, H, total, D) -> padded (B, H, longest, D), zeros past each sequence's end."""
    out = x.new_zeros(len(lens), x.shape[1], longest, x.shape[3])
    start = 0
    for b, n in enumerate(lens):
        out[b, :, :n] = x[0, :, start:start + n]
        start += n
    return out
