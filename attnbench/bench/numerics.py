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

The fp64 reference and both baselines run block by block (:func:`blocks`): over the batch, over
groups of K/V heads (each with its query heads) and over query rows, each block cast to fp64 on its
own, so memory is bounded by :data:`BLOCK_BUDGET_BYTES` whatever the case (a B64 GQA 32/8 decode at
a 32k KV cache used to repeat its fp64 K/V for every query head: 64 GiB). Every (batch, head) pair
is checked; none is sampled. Ragged batches and the ``document`` variant run per segment (sequence or
document), and variants apply their mask and score change (:mod:`attnbench.workloads.variants`) to
each block. A non-dense case (ragged or a variant) is checked on the path that was timed:
:func:`check_built` runs the backend's ``build()`` on the fresh inputs (``Backend.output`` gives the
result in the harness's layout).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.bench.inputs import cast_tensors, make_tensors
from attnbench.bench.results import MEASURED
from attnbench.case import Case, Tensors
from attnbench.kernels.eager import block_attention
from attnbench.workloads.variants import Semantics

BLOCK_BUDGET_BYTES = 2 * 1024**3  # per block of the chunked reference: its scores and its inputs in fp64
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


MISSING = Errors(math.nan, math.nan)  # a baseline that cannot express the case (SDPA has no softcap)


@dataclass(frozen=True)
class Block:
    """One piece of the chunked computation: tensor slices and where its rows sit in their sequence."""

    batch: slice
    kv_heads: slice
    q_heads: slice
    rows: slice  # query rows of the tensors
    keys: slice  # key rows of the tensors: the segment's first key up to the last one these rows see
    first_position: int  # bottom-right aligned position of the first row in its sequence

    def positions(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(query positions p, key positions j) within the sequence, for the variant's mask."""
        n = self.rows.stop - self.rows.start
        return (torch.arange(n, device=device) + self.first_position,
                torch.arange(self.keys.stop - self.keys.start, device=device))


def _split(total: int, size: int):
    return ((i, min(total, i + size)) for i in range(0, total, size))


def blocks(case: Case, element_bytes: int, budget: int | None = None) -> list[Block]:
    """Blocks covering every (batch row, query head, query row) of the case once.

    A block of b batch rows, g K/V heads (g * group query heads) and r query rows against n keys holds
    ``b * g * group * r * n`` scores of ``element_bytes`` and its inputs in fp64; the batch, then the
    heads, then the rows are halved until that fits ``budget``. Dense batches block over the batch;
    segments (ragged sequences, documents) one at a time. ``budget`` defaults to :data:`BLOCK_BUDGET_BYTES`.
    """
    budget = BLOCK_BUDGET_BYTES if budget is None else budget
    sem = Semantics.of(case)
    group, heads_kv = case.heads_q // case.heads_kv, case.heads_kv
    width = (case.head_dim_qk + case.head_dim_v) * 8
    if not case.ragged and case.variant != "document":
        spans = [(0, case.batch, 0, case.seq_q, 0, case.seq_kv)]
    else:
        spans = [(b, 1, q0, nq, kv0, nkv) for b, q0, nq, kv0, nkv in case.segment_slices()]
    out = []
    for b0, nb, q0, nq, kv0, nkv in spans:
        def cost(b, g, r):
            return b * g * (group * r * (nkv * element_bytes + width) + nkv * width)
        nb_blk, g_blk = nb, heads_kv
        while nb_blk > 1 and cost(nb_blk, g_blk, 1) > budget:
            nb_blk = -(-nb_blk // 2)
        while g_blk > 1 and cost(nb_blk, g_blk, 1) > budget:
            g_blk = -(-g_blk // 2)
        per_row = cost(nb_blk, g_blk, 1) - cost(nb_blk, g_blk, 0)
        r_blk = max(1, min(nq, (budget - cost(nb_blk, g_blk, 0)) // max(per_row, 1)))
        for bi, bj in _split(nb, nb_blk):
            for gi, gj in _split(heads_kv, g_blk):
                for ri, rj in _split(nq, r_blk):
                    first = ri + nkv - nq
                    limit = sem.key_limit(rj - 1 + nkv - nq, nkv)
                    out.append(Block(slice(b0 + bi, b0 + bj), slice(gi, gj), slice(gi * group, gj * group),
                                     slice(q0 + ri, q0 + rj), slice(kv0, kv0 + limit), first))
    return out


def blockwise_attention(t: Tensors, case: Case, attend: Callable, element_bytes: int, dtype: torch.dtype
                        ) -> tuple[torch.Tensor, tuple | None]:
    """Output (and dq, dk, dv for fwd_bwd) of ``attend(q, k, v, block)`` over :func:`blocks`, each block's
    inputs cast to ``dtype`` as fresh leaves (so an fp64 reference's gradients are fp64 too)."""
    grad = case.has_backward
    out = torch.empty(*t.q.shape[:-1], t.v.shape[-1], dtype=dtype, device=t.q.device)
    grads = [torch.zeros(x.shape, dtype=dtype, device=x.device) for x in (t.q, t.k, t.v)] if grad else None
    for blk in blocks(case, element_bytes):
        idx_q = (blk.batch, blk.q_heads, blk.rows)
        idx_kv = (blk.batch, blk.kv_heads, blk.keys)
        q, k, v = (x[idx].detach().to(dtype).requires_grad_(grad)
                   for x, idx in ((t.q, idx_q), (t.k, idx_kv), (t.v, idx_kv)))
        o = attend(q, k, v, blk)
        if grad:
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), t.dout[idx_q].to(dtype))
            grads[0][idx_q] += dq
            grads[1][idx_kv] += dk
            grads[2][idx_kv] += dv
        out[idx_q] = o.detach()
    return out, (tuple(grads) if grads else None)


def _eager_attend(case: Case) -> Callable:
    """Plain PyTorch on a block (in whatever dtype it is given): the reference in fp64, the eager baseline
    in the case dtype."""
    sem = Semantics.of(case)

    def attend(q, k, v, blk: Block):
        p, j = blk.positions(q.device)
        return block_attention(q, k, v, scale=case.scale, sem=sem, p=p, j=j, heads=blk.q_heads)
    return attend


def _math_attend(case: Case) -> Callable:
    """SDPA's math kernel on a block: causal through the block's trimmed keys (bottom-right aligned), a
    variant through an explicit mask or bias. SDPA has no score transform, so softcap raises."""
    from attnbench.kernels.sdpa import SDPAMath

    math_backend, sem = SDPAMath(), Semantics.of(case)
    if case.variant == "softcap":
        raise NotImplementedError("SDPA cannot apply a softcap (no score transform)")

    def attend(q, k, v, blk: Block):
        if case.variant in ("none", "document"):
            return math_backend.attention(q, k, v, causal=sem.causal, scale=case.scale)
        p, j = blk.positions(q.device)
        keep, bias = sem.keep(p, j), sem.bias(p, j, blk.q_heads, q.dtype)
        mask = keep if bias is None else (bias if keep is None else bias.masked_fill(~keep, float("-inf")))
        return math_backend.masked(q, k, v, mask=mask, scale=case.scale)
    return attend


def reference(t64: Tensors, case: Case):
    """fp64 eager attention over :func:`blocks`: the golden output and gradients."""
    return blockwise_attention(t64, case, _eager_attend(case), 8 * 3, torch.float64)


def poison_allocator(case: Case, device: str, t: Tensors | None = None) -> None:
    """Fill freed allocator blocks of the output's size with NaN before the backend runs.

    A functional kernel returns a fresh tensor, usually carved from a block the
    caching allocator just freed: poisoning those blocks makes an element the
    kernel never wrote show up as NaN instead of a stale correct value.
    """
    shapes = [(case.batch, case.heads_q, case.seq_q, case.head_dim_v)]
    if t is not None:  # the output in the given tensors' layout (packed for a ragged case)
        shapes = [(*t.q.shape[:-1], t.v.shape[-1])]
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
    if math.isnan(b.rel_err):  # no baseline for this case
        return float("nan")
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
    grad = case.has_backward
    fresh = make_tensors(case, device, seed=seed, requires_grad=False)
    ref_out, ref_grads = reference(fresh, case)
    found = {}
    for name, make in (("math", _math_attend), ("eager", _eager_attend)):
        try:
            attend = make(case)
        except NotImplementedError:  # the baseline cannot express this variant: its ratio is NaN
            found[name] = (MISSING, tuple(MISSING for _ in range(3)) if grad else None)
            continue
        out, grads = blockwise_attention(cast_tensors(fresh, case.torch_dtype, grad), case, attend, 4 * 3,
                                         case.torch_dtype)
        found[name] = _errors(out, grads, ref_out, ref_grads)
    return Baselines(fresh, ref_out, ref_grads, found["math"], found["eager"])


def check_numerics(case: Case, attention: Callable, device: str, seed: int, base: Baselines | None = None) -> NumericsResult:
    """Errors of ``attention(q, k, v)`` against fp64, beside sdpa-math's and eager's on the same inputs."""
    base = base or baselines(case, device, seed)
    out, grads = run_backend(attention, cast_tensors(base.fresh, case.torch_dtype, case.has_backward), case, device)
    out_err, grad_errs = _errors(out, grads, base.ref_out, base.ref_grads)
    return NumericsResult(out_err, base.math[0], base.eager[0], grad_errs, base.math[1], base.eager[1])


def check_built(case: Case, backend, device: str, seed: int, base: Baselines | None = None) -> NumericsResult:
    """Errors of the backend's timed path (``build()`` on the fresh inputs, its result through
    ``backend.output``) against fp64: the check of ragged and variant cases, which have no
    ``attention(q, k, v)`` (forward only)."""
    base = base or baselines(case, device, seed)
    fresh = cast_tensors(base.fresh, case.torch_dtype, False)
    fn = backend.build(case, fresh)
    poison_allocator(case, device, fresh)
    out = backend.output(case, fn()).detach()
    out_err, _ = _errors(out, None, base.ref_out, None)
    return NumericsResult(out_err, base.math[0], base.eager[0], None, None, None)


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
        values = [r.get(column) for r, f in zip(rows, fused) if f and r.get("status") in MEASURED]
        values = [v for v in values if finite(v)]
        if values:
            best[column] = min(values)
    out = []
    for row in rows:
        ratios = [row[c] / b if b > 0 else (1.0 if row[c] == 0 else math.inf)
                  for c, b in best.items() if finite(row.get(c))]
        out.append(max(ratios) if ratios and row.get("status") in MEASURED else math.nan)
    return out
