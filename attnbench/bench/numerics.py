"""Numerical error against an fp64 reference, and against SDPA math in the same dtype.

Method (Golden et al. 2024, "Is Flash Attention Stable?"; flash-attention's test
suite): draw fresh random inputs, round them to the case dtype, and compute the
reference with the same rounded values in fp64. Outputs are poisoned (NaN) before
the backend runs, so an unwritten element cannot pass. ``err_ratio_vs_math`` is
the backend's relative error over SDPA math's in the same dtype on the same
inputs. The pass/fail gate is flash-attention's test rule: a kernel's error may
be at most 2x that of the same computation done by plain PyTorch in the input
precision (``eager``: matmuls in the input dtype, softmax in fp32), reported as
``err_ratio_vs_eager``. SDPA math upcasts fp16/bf16 to fp32, so it is the
stricter yardstick and is reported, not gated on.

The fp64 reference and the math baseline run over blocks of query rows, so a 16k
context needs memory for a block of scores, not all of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.case import Case
from attnbench.bench.inputs import cast_tensors, make_tensors
from attnbench.kernels.eager import eager_attention
from attnbench.case import Tensors

SCORE_BUDGET_BYTES = 2 * 1024**3  # per query block of the chunked reference


@dataclass(frozen=True)
class Errors:
    rel_err: float  # ||out - ref||_F / ||ref||_F
    max_abs_err: float

    @staticmethod
    def of(out: torch.Tensor, ref: torch.Tensor) -> "Errors":
        diff = out.double() - ref
        norm = ref.norm().item()
        rel = diff.norm().item() / norm if norm else float("inf")
        return Errors(rel, diff.abs().max().item())


def _query_block(case: Case, element_bytes: int) -> int:
    per_row = case.batch * case.heads_q * case.seq_kv * element_bytes
    return max(1, min(case.seq_q, SCORE_BUDGET_BYTES // max(per_row, 1)))


def chunked_attention(t: Tensors, case: Case, attend: Callable, element_bytes: int) -> tuple[torch.Tensor, tuple | None]:
    """Output (and dq, dk, dv for fwd_bwd) of ``attend`` computed over blocks of query rows.

    Each block is an independent problem: queries [i, j) see keys up to
    ``Skv - Sq + row`` (bottom-right causal), expressed with ``seq_q=j-i`` and the
    key prefix it may see, so ``attend`` needs no explicit mask offsets.
    """
    q, k, v = t.q, t.k, t.v
    block = _query_block(case, element_bytes)
    outs = []
    grads = [torch.zeros_like(x) for x in (q, k, v)] if case.has_backward else None
    for i in range(0, case.seq_q, block):
        j = min(case.seq_q, i + block)
        q_blk = q[:, :, i:j].detach().requires_grad_(case.has_backward)
        kv_len = case.seq_kv - (case.seq_q - j) if case.causal else case.seq_kv
        k_blk = k[:, :, :kv_len].detach().requires_grad_(case.has_backward)
        v_blk = v[:, :, :kv_len].detach().requires_grad_(case.has_backward)
        out = attend(q_blk, k_blk, v_blk)
        if case.has_backward:
            dq, dk, dv = torch.autograd.grad(out, (q_blk, k_blk, v_blk), t.dout[:, :, i:j])
            grads[0][:, :, i:j] += dq
            grads[1][:, :, :kv_len] += dk
            grads[2][:, :, :kv_len] += dv
        outs.append(out.detach())
    return torch.cat(outs, dim=2), (tuple(grads) if grads else None)


def reference(t64: Tensors, case: Case):
    """fp64 eager attention over query blocks: the golden output and gradients."""
    def attend(q, k, v):
        return eager_attention(q, k, v, causal=case.causal, scale=case.scale)
    return chunked_attention(t64, case, attend, element_bytes=8 * 3)


def poison_allocator(case: Case, device: str) -> None:
    """Fill freed allocator blocks of the output's size with NaN before the backend runs.

    A functional kernel returns a fresh tensor, usually carved from a block the
    caching allocator just freed: poisoning those blocks makes an element the
    kernel never wrote show up as NaN instead of a stale correct value.
    """
    shapes = [(case.batch, case.heads_q, case.seq_q, case.head_dim_v)]
    if case.has_backward:
        shapes += [(case.batch, case.heads_q, case.seq_q, case.head_dim_qk),
                   (case.batch, case.heads_kv, case.seq_kv, case.head_dim_qk),
                   (case.batch, case.heads_kv, case.seq_kv, case.head_dim_v)]
    poison = [torch.full(s, float("nan"), dtype=case.torch_dtype, device=device) for s in shapes]
    del poison


def run_backend(attention: Callable, t: Tensors, case: Case, device: str):
    """Output (and dq, dk, dv) of a backend's ``attention`` on the full case, allocator poisoned first."""
    poison_allocator(case, device)
    out = attention(t.q, t.k, t.v)
    grads = torch.autograd.grad(out, (t.q, t.k, t.v), t.dout) if case.has_backward else None
    return out.detach(), grads


def _ratio(a: Errors, b: Errors) -> float:
    return a.rel_err / b.rel_err if b.rel_err > 0 else (1.0 if a.rel_err == 0 else float("inf"))


@dataclass(frozen=True)
class NumericsResult:
    out: Errors
    math_out: Errors
    eager_out: Errors
    grads: tuple[Errors, ...] | None  # dq, dk, dv
    math_grads: tuple[Errors, ...] | None
    eager_grads: tuple[Errors, ...] | None

    def ratios(self) -> dict[str, float]:
        """Error over sdpa-math's, for the output and (fwd_bwd) each gradient."""
        r = {"err_ratio_vs_math": _ratio(self.out, self.math_out)}
        if self.grads:
            for name, g, m in zip(("dq", "dk", "dv"), self.grads, self.math_grads):
                r[f"err_ratio_{name}"] = _ratio(g, m)
        return r

    def worst_ratio_vs_eager(self) -> float:
        """The gate: the largest error over eager's, across output and gradients."""
        pairs = [(self.out, self.eager_out)] + list(zip(self.grads or (), self.eager_grads or ()))
        return max(_ratio(a, b) for a, b in pairs)


@dataclass(frozen=True)
class Baselines:
    """What every backend of one case is compared with: computed once per case, shared by its backends."""

    fresh: Tensors  # the inputs, rounded to the case dtype
    ref_out: torch.Tensor  # fp64
    ref_grads: tuple | None
    math: tuple[Errors, tuple[Errors, ...] | None]
    eager: tuple[Errors, tuple[Errors, ...] | None]


def _errors(out, grads, ref_out, ref_grads):
    return Errors.of(out, ref_out), (tuple(Errors.of(g, r) for g, r in zip(grads, ref_grads)) if grads else None)


def baselines(case: Case, device: str, seed: int) -> Baselines:
    """Fresh inputs, the fp64 reference, and the errors of sdpa-math and eager in the case dtype."""
    from attnbench.kernels.sdpa import SDPAMath

    grad = case.has_backward
    fresh = make_tensors(case, device, seed=seed, requires_grad=False)
    ref_out, ref_grads = reference(cast_tensors(fresh, torch.float64, grad), case)
    math = SDPAMath()

    def math_attend(q, k, v):
        return math.attention(q, k, v, causal=case.causal, scale=case.scale)

    def eager_attend(q, k, v):
        return eager_attention(q, k, v, causal=case.causal, scale=case.scale)

    found = {}
    for name, attend in (("math", math_attend), ("eager", eager_attend)):
        out, grads = chunked_attention(cast_tensors(fresh, case.torch_dtype, grad), case, attend, 4 * 3)
        found[name] = _errors(out, grads, ref_out, ref_grads)
    return Baselines(fresh, ref_out, ref_grads, found["math"], found["eager"])


def check_numerics(case: Case, attention: Callable, device: str, seed: int, base: Baselines | None = None) -> NumericsResult:
    """Errors of ``attention(q, k, v)`` against fp64, beside sdpa-math's and eager's on the same inputs."""
    base = base or baselines(case, device, seed)
    out, grads = run_backend(attention, cast_tensors(base.fresh, case.torch_dtype, case.has_backward), case, device)
    out_err, grad_errs = _errors(out, grads, base.ref_out, base.ref_grads)
    return NumericsResult(out_err, base.math[0], base.eager[0], grad_errs, base.math[1], base.eager[1])
