"""PyTorch ``scaled_dot_product_attention``, one backend per kernel, each pinned.

``torch.nn.attention.sdpa_kernel([one backend])`` leaves SDPA no fallback: if the
pinned kernel cannot run a case, SDPA raises "No available kernel" (with its
reasons as warnings) and the row becomes ``unsupported`` with those reasons,
never a number from another kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnbench.case import Case
from attnbench.kernels.registry import Backend, register


class _SDPA(Backend):
    sdp_backend: SDPBackend
    cuda_only: bool = True

    def available(self) -> tuple[bool, str]:
        if self.cuda_only and not torch.cuda.is_available():
            return False, f"{self.name} needs CUDA (torch {torch.__version__} sees no CUDA device)"
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.page_size:
            return False, "SDPA takes a contiguous KV cache, not a paged one"
        return True, ""

    def attention(self, q, k, v, *, causal: bool, scale: float):
        # SDPA's is_causal is top-left aligned; it equals bottom-right only for square problems.
        sq, skv = q.shape[-2], k.shape[-2]
        mask = None
        if causal and sq != skv:
            mask = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(diagonal=skv - sq)
        gqa = q.shape[1] != k.shape[1]
        with sdpa_kernel([self.sdp_backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                                  scale=scale, enable_gqa=gqa)


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
    kernel_pattern = r"flash"


@register
class SDPAEfficient(_SDPA):
    name = "sdpa-efficient"
    sdp_backend = SDPBackend.EFFICIENT_ATTENTION
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
