"""Backends ``triton`` (forward + backward, fp16/bf16; the dQ path timed per shape), ``triton-dq-atomic`` and
``triton-dq-separate`` (the same with the backward's dQ path pinned) and ``triton-fp8`` (e4m3 forward with
block scales).

Nothing here imports Triton at module level: the registry lists both backends
on hosts without it, as unavailable with the install hint. The kernels run on
a CUDA GPU, or on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1``
is set before the kernels are first imported (the tests do this).

``triton`` runs ragged batches, chunked prefill and the ``document`` variant through the forward
kernel's varlen path (``cu_seqlens``, :func:`attnbench.kernels.triton.launch.varlen_forward`) on the
varlen view of :mod:`attnbench.kernels.varlen`; the kernels implement no other variant.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, dense_only, register
from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv
from attnbench.kernels.varlen import to_case_layout, varlen_view

INSTALL_HINT = "pip install triton (or attnbench[triton]); kernels need a CUDA GPU, or TRITON_INTERPRET=1 on CPU"


def _interpreting() -> bool:
    """Whether the kernels run in the interpreter: fixed when they were decorated, else read from the env."""
    tuning = sys.modules.get("attnbench.kernels.triton.tuning")
    if tuning is not None:
        return tuning.INTERPRET
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


class _Triton(Backend):
    family = "fused"
    install_hint = INSTALL_HINT
    head_dims = (32, 64, 128)

    def version(self) -> str:
        try:
            return f"triton {importlib.metadata.version('triton')}"
        except importlib.metadata.PackageNotFoundError:
            return ""

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("triton") is None:
            return False, INSTALL_HINT
        import torch

        if _interpreting() or torch.cuda.is_available():
            return True, ""
        return False, "Triton kernels need a CUDA GPU, or TRITON_INTERPRET=1 to run in the CPU interpreter"

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.dtype not in ("fp16", "bf16"):
            return False, f"dtype {case.dtype} is not supported; the kernels take fp16 or bf16 (fp32 accumulation)"
        if case.head_dim_qk != case.head_dim_v or case.head_dim_qk not in self.head_dims:
            return False, (f"head dims {case.head_dim_qk}/{case.head_dim_v} are not supported; allowed: equal "
                           f"q/k/v head dims in {', '.join(map(str, self.head_dims))}")
        if case.page_size:
            return False, "the kernels read a contiguous KV cache, not a paged one"
        if case.dtype == "bf16" and _interpreting():
            return False, ("bf16 does not run in Triton's CPU interpreter (its tl.dot multiplies bf16 bit patterns, "
                           "triton-lang/triton#11584); use fp16 there, bf16 on a GPU")
        return True, ""


@register
class TritonFlash(_Triton):
    name = "triton"
    kernel_pattern = r"_attn_fwd|_attn_bwd"  # _attn_bwd_dq too
    dq_mode: str | None = None  # the backward's dQ path ("atomic", "separate"); None: timed per shape on a GPU

    def supports(self, case: Case) -> tuple[bool, str]:
        ok, reason = super().supports(case)
        if ok and case.variant not in ("none", "document"):
            return False, f"the Triton kernels implement the causal and document masks only (case variant {case.variant})"
        return ok, reason

    def attention(self, q, k, v, *, causal: bool, scale: float):
        from attnbench.kernels.triton.autograd import attention

        return attention(q, k, v, causal=causal, scale=scale, dq_mode=self.dq_mode)

    def build(self, case: Case, tensors: Tensors):
        if case.dense:
            return super().build(case, tensors)
        from attnbench.kernels.triton.launch import varlen_forward

        view = varlen_view(case, tensors)
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (view.q, view.k, view.v))  # (1, H, tokens, D)
        causal, scale = case.causal, case.scale
        return lambda: varlen_forward(q, k, v, view.cu_q, view.cu_kv, max_seqlen_q=view.max_q,
                                      max_seqlen_kv=view.max_kv, causal=causal, scale=scale)[0]

    def output(self, case: Case, result):
        out = result[0] if isinstance(result, tuple) else result
        return out if case.dense else to_case_layout(case, out[0].transpose(0, 1))


@register
class TritonDqAtomic(TritonFlash):
    """``triton`` with the backward's dQ path pinned to one kernel adding dQ with atomics."""

    name = "triton-dq-atomic"
    dq_mode = "atomic"


@register
class TritonDqSeparate(TritonFlash):
    """``triton`` with the backward's dQ path pinned to a dK/dV kernel, then a dQ kernel."""

    name = "triton-dq-separate"
    dq_mode = "separate"


@register
class TritonFP8(_Triton):
    name = "triton-fp8"
    kernel_pattern = r"_attn_fwd"
    compute_dtype = "fp8"
    fp8_inputs = ("q", "k", "v")

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.has_backward:
            return False, "triton-fp8 is a forward kernel; it has no backward"
        ok, reason = super().supports(case)
        return dense_only(self.name, case) if ok else (ok, reason)

    def attention(self, q, k, v, *, causal: bool, scale: float):
        """Quantise (one scale per BLOCK_ROWS rows) and run the fp8 forward; not differentiable."""
        from attnbench.kernels.triton.launch import fp8_forward

        (q8, k8, v8), _ = quantize_qkv(q.detach(), k.detach(), v.detach(), BLOCK_ROWS)
        return fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=q.dtype)[0]

    def build(self, case: Case, tensors: Tensors):
        """Quantise here, outside the timed call; the callable runs only the fp8 kernel."""
        from attnbench.kernels.triton.launch import fp8_forward

        (q8, k8, v8), _ = quantize_qkv(tensors.q.detach(), tensors.k.detach(), tensors.v.detach(), BLOCK_ROWS)
        causal, scale, dtype = case.causal, case.scale, case.torch_dtype
        return lambda: fp8_forward(q8, k8, v8, causal=causal, scale=scale, out_dtype=dtype)
