"""Numerical error against an fp64 reference; the gate; the same error relative to other backends.

Method (Golden et al. 2024, "Is Flash Attention Stable?"; flash-attention's test suite): draw
fresh random inputs, round them to the case dtype, and compute the reference with the same rounded
values in fp64. Outputs are poisoned (NaN) before the backend runs, so an unwritten element cannot
pass.

The gate (``numerics_fail``), one baseline everywhere (the config's ``max_err_ratio``, the
``err_ratio`` table and figure, docs/architecture.md):

* a backend that computes in the case dtype may have at most ``max_err_ratio`` (2) times the error
  of plain PyTorch doing the same computation in that dtype, ``eager`` (matmuls in the input dtype,
  softmax in fp32): flash-attention's test rule. The worst ratio over the output and, in fwd_bwd,
  dQ, dK and dV is ``err_ratio_vs_eager``;
* an fp8 backend (``compute_dtype = "fp8"``: it quantises its inputs to e4m3 itself) may have a
  relative error against fp64 of at most :data:`FP8_REL_ERR_BOUND` = 2u, twice e4m3's unit roundoff
  u = 2^-4 (3 stored mantissa bits: OCP 8-bit floating point specification, 2023; Micikevicius et
  al. 2022, "FP8 Formats for Deep Learning"; u = 2^-p for p = 4 significand bits, Higham 2002,
  §2.1). Each e4m3 rounding of Q, K, V (and of P where a kernel quantises it) has a relative error
  of at most u, with root mean square about u/√3 for values spread over a binade; the output's
  relative error is, to first order, their root sum of squares, about 2u/√3 ≈ 0.072 with four
  roundings. The bound leaves a factor of about 1.7 over that, as the 2x rule does over eager's;
  a kernel with a wrong scale or a lost block fails it by orders of magnitude. On the H200
  reference, flashinfer-fp8kv (K, V in e4m3) measured 0.039 and triton-fp8 (Q, K, V) 0.047-0.053;
* a non-finite output or gradient fails any backend.

Reported, not gated: ``err_ratio_vs_math`` (over SDPA math, which upcasts fp16/bf16 to fp32: a
stricter yardstick than the kernels' own test suites use) and ``err_ratio_vs_best_fused`` (over the
most accurate fused backend of the same job and case that computes in the case dtype: how far a
kernel is from the best of its kind, :func:`ratios_vs_best_fused`).

The fp64 reference and the math baseline run over blocks of query rows, so a 16k context needs
memory for a block of scores, not all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.case import Case
from attnbench.bench.inputs import cast_tensors, make_tensors
from attnbench.kernels.eager import eager_attention
from attnbench.case import Tensors

SCORE_BUDGET_BYTES = 2 * 1024**3  # per query block of the chunked reference
E4M3_UNIT_ROUNDOFF = 2.0 ** -4  # 3 stored mantissa bits + the implicit one: u = 2^-p, p = 4
FP8_REL_ERR_BOUND = 2 * E4M3_UNIT_ROUNDOFF  # the fp8 backends' gate on rel_err against fp64
ERROR_COLUMNS = ("rel_err", "rel_err_dq", "rel_err_dk", "rel_err_dv")  # output, then fwd_bwd's gradients


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


def ratios_vs_best_fused(rows: list[dict], fused: list[bool]) -> list[float]:
    """Each row's worst error (output and gradients) over the smallest error among the ``fused`` rows.

    ``rows`` are one case's rows of one job; ``fused[i]`` says whether row i is a fused backend
    computing in the case dtype. Per error column the baseline is the smallest finite error among
    those rows; a row's ratio is its largest ratio over the columns both have. NaN where there is
    no such baseline (no fused backend measured) or the row has no errors.
    """
    def finite(value) -> bool:
        return isinstance(value, (int, float)) and math.isfinite(value)

    best = {}
    for column in ERROR_COLUMNS:
        values = [r.get(column) for r, f in zip(rows, fused) if f and r.get("status") in ("ok", "numerics_fail")]
        values = [v for v in values if finite(v)]
        if values:
            best[column] = min(values)
    out = []
    for row in rows:
        ratios = [row[c] / b if b > 0 else (1.0 if row[c] == 0 else math.inf)
                  for c, b in best.items() if finite(row.get(c))]
        out.append(max(ratios) if ratios and row.get("status") in ("ok", "numerics_fail") else math.nan)
    return out
