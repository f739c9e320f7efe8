"""Block-wise e4m3 quantisation of Q, K, V for the FP8 forward, with its overflow and underflow shares.

One fp32 scale per tile of ``block_rows`` consecutive rows (positions) of one
(batch, head), over all head dims: ``scale = amax / 448`` (448 is e4m3's
largest finite value, OCP FP8 spec), ``x8 = round_to_nearest(x / scale)``.
The kernel folds the descale back in (:mod:`attnbench.kernels.triton.forward`),
so a tile's scale must be constant over the kernel's tile: kernel tiles divide
``block_rows`` (:data:`BLOCK_ROWS`, 128, for the benchmarks and the backend).

V is stored transposed (sequence contiguous, padded to 16 positions so rows
are 16-byte aligned for TMA): Hopper's fp8 wgmma takes its B operand only
K-major, and the reduction dimension of ``P V`` is the sequence.

Shares reported by :class:`QuantStats`: overflow, elements whose ``|x / scale|``
reached 464 (past 448 by half a step, so rounding has no finite e4m3 value)
and were clamped to 448: zero by construction with an amax scale unless the
input holds inf; underflow, non-zero elements that quantised to zero.
This module needs only torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK_ROWS = 128  # rows of Q, K or V sharing one scale
E4M3_MAX = 448.0
E4M3_OVERFLOW = 464.0  # half an e4m3 step above 448: from here on round-to-nearest has no finite value
FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class QuantStats:
    elements: int
    overflow: int  # clamped to +-448
    underflow: int  # non-zero inputs that became zero

    @property
    def overflow_share(self) -> float:
        return self.overflow / self.elements if self.elements else 0.0

    @property
    def underflow_share(self) -> float:
        return self.underflow / self.elements if self.elements else 0.0

    def __add__(self, other: "QuantStats") -> "QuantStats":
        return QuantStats(self.elements + other.elements, self.overflow + other.overflow,
                          self.underflow + other.underflow)


@dataclass(frozen=True)
class Quantized:
    """An e4m3 tensor viewed as (B, H, S, D) with one fp32 scale per ``block_rows`` rows: scale (B, H, n_blocks)."""

    data: torch.Tensor
    scale: torch.Tensor
    block_rows: int

    def dequantize(self) -> torch.Tensor:
        rows = torch.arange(self.data.shape[2], device=self.data.device) // self.block_rows
        return self.data.float() * self.scale[:, :, rows, None]


def quantize_blockwise(x: torch.Tensor, block_rows: int, *, transpose: bool = False) -> tuple[Quantized, QuantStats]:
    """Quantise BHSD ``x`` to e4m3 with one scale per ``block_rows`` rows; ``transpose`` stores it (B, H, D, S)."""
    b, h, s, d = x.shape
    n_blocks = -(-s // block_rows)
    blocks = F.pad(x.float(), (0, 0, 0, n_blocks * block_rows - s)).view(b, h, n_blocks, block_rows, d)
    amax = blocks.abs().amax(dim=(-2, -1))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    y = blocks / scale[..., None, None]
    overflow = int((y.abs() >= E4M3_OVERFLOW).sum())
    y8 = y.clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    underflow = int(((y8.float() == 0) & (blocks != 0)).sum())
    y8 = y8.view(b, h, n_blocks * block_rows, d)[:, :, :s]
    if transpose:
        padded = -(-s // 16) * 16
        storage = torch.zeros(b, h, d, padded, dtype=FP8_DTYPE, device=x.device)
        storage[..., :s] = y8.transpose(-1, -2)
        data = storage[..., :s].transpose(-1, -2)
    else:
        data = y8.contiguous()
    return Quantized(data, scale.contiguous(), block_rows), QuantStats(x.numel(), overflow, underflow)


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_rows: int):
    """Q, K, V quantised for the FP8 forward (V transposed), and the shares over all three tensors."""
    (q8, sq), (k8, sk), (v8, sv) = (quantize_blockwise(q, block_rows), quantize_blockwise(k, block_rows),
                                    quantize_blockwise(v, block_rows, transpose=True))
    return (q8, k8, v8), sq + sk + sv
