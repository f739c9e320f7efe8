"""Per-block attention kernels that return the log-sum-exp, forward and backward.

A ring step computes one or a few blocks (:mod:`attnbench.parallel.blocks`), each a square causal
or an unmasked problem. A block kernel returns the block's output O_b and its row log-sum-exp
``LSE_b = log sum_j exp(scale q.k_j)`` (natural log, fp32, (B, Hq, Sq)), which is what the
merge needs (:mod:`attnbench.parallel.merge`). Its backward takes the *merged* output and
log-sum-exp of the whole row: with those, the flash-attention backward of a block (Dao 2023,
Algorithm 2: ``P = exp(S - LSE)``, ``dS = P * (dP - rowsum(dO * O))``) gives the block's exact
share of dQ, dK and dV, so the ring backward needs no second pass.

The kernels, and the call each makes:

* ``math``: plain PyTorch in fp32 with an explicit log-sum-exp (any device; the readable one);
* ``sdpa-flash``: ``torch.ops.aten._scaled_dot_product_flash_attention`` on CUDA (FlashAttention-2
  inside PyTorch), ``_scaled_dot_product_flash_attention_for_cpu`` on CPU, and their backward ops;
* ``sdpa-cudnn``: ``torch.ops.aten._scaled_dot_product_cudnn_attention`` with
  ``compute_log_sumexp=True`` and its backward (CUDA);
* ``fa4``: ``flash_attn.cute.interface._flash_attn_fwd(..., return_lse=True)`` and
  ``_flash_attn_bwd`` (flash-attn-4, CUDA, BSHD tensors);
* ``triton``: the project's kernel, ``attnbench.kernels.triton.launch.forward`` (which returns
  ``(O, LSE)``) and ``launch.backward``.

These are the same calls PyTorch's own context parallelism makes per block
(``torch/distributed/tensor/experimental/_context_parallel/_attention.py``). Tensors are in the
kernel's :attr:`BlockKernel.layout` (BHSD, or BSHD for fa4), so no block pays a transpose.
Availability and case support come from the single-device backend of the same name
(:mod:`attnbench.kernels`).
"""
from __future__ import annotations

import torch

from attnbench.case import Case
from attnbench.kernels.registry import get_backend, safe_available, safe_version

aten = torch.ops.aten


class BlockKernel:
    """One kernel's block calls. Subclasses implement :meth:`_forward` and :meth:`_backward`."""

    name: str = ""
    backend: str = ""  # the attnbench.kernels backend this kernel is (availability, version, supports)
    layout: str = "bhsd"  # or "bshd"
    native_gqa: bool = True  # False: K/V heads are repeated for the call and dK/dV summed back over the group

    @property
    def seq_dim(self) -> int:
        return 2 if self.layout == "bhsd" else 1

    @property
    def head_dim(self) -> int:
        return 1 if self.layout == "bhsd" else 2

    def available(self) -> tuple[bool, str]:
        return safe_available(get_backend(self.backend))

    def version(self) -> str:
        return safe_version(get_backend(self.backend))

    def supports(self, case: Case) -> tuple[bool, str]:
        return get_backend(self.backend).supports(case)

    def forward(self, q, k, v, *, causal: bool, scale: float):
        """(O_b in the input dtype, LSE_b fp32 (B, Hq, Sq), aux for the backward)."""
        k, v = self._repeat_kv(q, k), self._repeat_kv(q, v)
        return self._forward(q, k, v, causal=causal, scale=scale)

    def backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        """(dQ, dK, dV) of the block, given the merged output ``o`` and log-sum-exp ``lse`` of its rows."""
        group = q.shape[self.head_dim] // k.shape[self.head_dim]
        dq, dk, dv = self._backward(do, q, self._repeat_kv(q, k), self._repeat_kv(q, v), o, lse.contiguous(), aux,
                                    causal=causal, scale=scale)
        if group > 1 and not self.native_gqa:
            dk, dv = (self._sum_group(x, group) for x in (dk, dv))
        return dq, dk, dv

    def _repeat_kv(self, q, x):
        group = q.shape[self.head_dim] // x.shape[self.head_dim]
        if group == 1 or self.native_gqa:
            return x
        return x.repeat_interleave(group, dim=self.head_dim)

    def _sum_group(self, x, group: int):
        h = self.head_dim
        return x.unflatten(h, (x.shape[h] // group, group)).sum(h + 1)

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        raise NotImplementedError

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        raise NotImplementedError


def _causal_hidden(n: int, device) -> torch.Tensor:
    """The positions a square causal mask hides: key j > query i."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(diagonal=1)


class MathKernel(BlockKernel):
    """softmax(scale q k^T) v in fp32 with the log-sum-exp kept, GQA by viewing query heads in groups."""

    name = "math"
    backend = "sdpa-math"

    def supports(self, case: Case) -> tuple[bool, str]:
        return True, ""

    @staticmethod
    def _grouped(q, k, v):
        b, hq, sq, d = q.shape
        hkv = k.shape[1]
        qg = q.float().view(b, hkv, hq // hkv, sq, d)  # (B, Hkv, G, Sq, D)
        return qg, k.float()[:, :, None], v.float()[:, :, None]  # (B, Hkv, 1, Skv, D)

    def _probabilities(self, qg, kg, lse, causal: bool, scale: float):
        scores = qg @ kg.transpose(-1, -2) * scale  # (B, Hkv, G, Sq, Skv)
        if causal:
            scores = scores.masked_fill(_causal_hidden(scores.shape[-1], scores.device), float("-inf"))
        if lse is None:
            lse = scores.logsumexp(-1)
        return (scores - lse[..., None]).exp(), lse

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        qg, kg, vg = self._grouped(q, k, v)
        p, lse = self._probabilities(qg, kg, None, causal, scale)
        b, hq, sq, _ = q.shape
        out = (p @ vg).reshape(b, hq, sq, v.shape[-1])
        return out.to(q.dtype), lse.reshape(b, hq, sq), None

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        qg, kg, vg = self._grouped(q, k, v)
        p, _ = self._probabilities(qg, kg, lse.view(qg.shape[:-1]), causal, scale)
        dog = do.float().view(*qg.shape[:-1], do.shape[-1])
        og = o.float().view(*qg.shape[:-1], o.shape[-1])
        dv = (p.transpose(-1, -2) @ dog).sum(2)  # (B, Hkv, Skv, Dv)
        ds = p * (dog @ vg.transpose(-1, -2) - (dog * og).sum(-1, keepdim=True))
        dq = (ds @ kg).reshape(q.shape) * scale
        dk = (ds.transpose(-1, -2) @ qg).sum(2) * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class SdpaFlashKernel(BlockKernel):
    """PyTorch's flash kernel: FlashAttention-2 on CUDA, its own tiled CPU kernel on CPU (both GQA-native)."""

    name = "sdpa-flash"
    backend = "sdpa-flash"

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        if q.device.type == "cpu":
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, scale=scale)
            return out, lse, None
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_flash_attention.default(
            q, k, v, 0.0, causal, False, scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        if q.device.type == "cpu":
            return aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                do, q, k, v, o, lse, 0.0, causal, scale=scale)
        cum_q, cum_k, max_q, max_k, seed, offset = aux
        return aten._scaled_dot_product_flash_attention_backward.default(
            do, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)[:3]


class SdpaCudnnKernel(BlockKernel):
    """cuDNN's fused attention through PyTorch (CUDA). K/V heads are repeated for GQA: not checked native."""

    name = "sdpa-cudnn"
    backend = "sdpa-cudnn"
    native_gqa = False

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # a block of rows is a strided view
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, None, True, 0.0, causal, False, scale=scale)
        b, h, s = q.shape[:3]
        return out, lse.reshape(b, h, s), (tuple(lse.shape), cum_q, cum_k, max_q, max_k, seed, offset)

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        lse_shape, cum_q, cum_k, max_q, max_k, seed, offset = aux
        grads = aten._scaled_dot_product_cudnn_attention_backward.default(
            do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), lse.reshape(lse_shape),
            seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale)
        return grads[:3]


class FA4Kernel(BlockKernel):
    """flash-attn-4 (CuTe DSL) on BSHD tensors; GQA-native."""

    name = "fa4"
    backend = "fa4"
    layout = "bshd"

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        from flash_attn.cute.interface import _flash_attn_fwd

        out, lse = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
        return out, lse, None

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        from flash_attn.cute.interface import _flash_attn_bwd

        return tuple(_flash_attn_bwd(q, k, v, o, do, lse, softmax_scale=scale, causal=causal)[:3])


class TritonKernel(BlockKernel):
    """The project's Triton FlashAttention (attnbench/kernels/triton); GQA-native; CUDA, or the interpreter."""

    name = "triton"
    backend = "triton"

    def _forward(self, q, k, v, *, causal: bool, scale: float):
        from attnbench.kernels.triton import launch

        out, lse = launch.forward(q, k, v, causal=causal, scale=scale)
        return out, lse, None

    def _backward(self, do, q, k, v, o, lse, aux, *, causal: bool, scale: float):
        from attnbench.kernels.triton import launch

        return launch.backward(do, q, k, v, o, lse, causal=causal, scale=scale)


KERNELS: dict[str, BlockKernel] = {k.name: k for k in (MathKernel(), SdpaFlashKernel(), SdpaCudnnKernel(), FA4Kernel(),
                                                         TritonKernel())}


def get_kernel(name: str) -> BlockKernel:
    if name not in KERNELS:
        raise KeyError(f"block kernel {name!r} is not known; allowed: {', '.join(KERNELS)}")
    return KERNELS[name]
