"""The compiler's report on our Triton kernels, per (case, triton backend) of the sweep's triton groups.

For each pair: build and run the case once on the GPU (the autotuner picks its configs), then one row per
kernel that ran: the config the autotuner kept, registers, spills, shared memory, warps, stages and the
SASS instruction mix (:func:`attnbench.kernels.triton.sass.compiler_report`, which names what each opcode
means), the forward's key loop (``PIPELINE_QK``: Q K^T one tile ahead of the softmax) and, for the
backward, the dQ path that ran. Each pair's output (and gradients) is compared with cuDNN's (or SDPA
flash's where cuDNN is not available): ``rel_diff`` is the largest relative Frobenius difference. The
fp8 forward reports its quantisation's overflow and underflow shares instead. Without CUDA every pair
is an ``unavailable`` row: the report reads sm_90 SASS.
"""
from __future__ import annotations

import warnings

import pandas as pd
import torch

from attnbench.case import Case
from attnbench.failures import classify

TRITON_BACKENDS = ("triton", "triton-dq-atomic", "triton-dq-separate", "triton-fp8")


def rel_diff(backend, reference, case: Case, tensors) -> float:
    """Largest relative Frobenius difference of the output (and gradients) of two backends' attention()."""
    def run(b):
        q, k, v = (x.detach().requires_grad_(case.has_backward) for x in (tensors.q, tensors.k, tensors.v))
        out = b.attention(q, k, v, causal=case.causal, scale=case.scale)
        grads = torch.autograd.grad(out, (q, k, v), tensors.dout) if case.has_backward else ()
        return [out.detach().float(), *(g.float() for g in grads)]

    return max(((a - b).norm() / b.norm()).item() for a, b in zip(run(backend), run(reference)))


def _kernels_of(backend_name: str, case: Case) -> list[str]:
    """The kernels one timed call launches (of the backward, both paths' names; launch keeps those that ran)."""
    if backend_name == "triton-fp8":
        return ["_attn_fwd_fp8"]
    backward = ["_attn_bwd_preprocess", "_attn_bwd", "_attn_bwd_dkdv", "_attn_bwd_dq"] if case.has_backward else []
    return ["_attn_fwd", *backward]


def report_pair(case: Case, backend, tensors, reference) -> list[dict]:
    """Rows of one (case, triton backend): one per kernel that ran, with the pair's cross-checks."""
    from attnbench.kernels.triton import launch
    from attnbench.kernels.triton.fp8 import BLOCK_ROWS, quantize_qkv
    from attnbench.kernels.triton.sass import compiler_report

    fn = backend.build(case, tensors)
    fn()
    torch.cuda.synchronize()
    pair = {"status": "ok", "reason": ""}
    if backend.name == "triton-fp8":
        _, stats = quantize_qkv(tensors.q.detach(), tensors.k.detach(), tensors.v.detach(), BLOCK_ROWS)
        pair.update(overflow_share=stats.overflow_share, underflow_share=stats.underflow_share)
    elif reference is not None:
        pair.update(rel_diff=rel_diff(backend, reference, case, tensors), rel_diff_vs=reference.name)
        fn()  # the pair's own launches again, after rel_diff's
    if case.has_backward and backend.name != "triton-fp8":
        pair["dq_mode"] = "atomic" if "_attn_bwd" in launch.last_compiled else "separate"
    rows = []
    for kernel in _kernels_of(backend.name, case):
        if kernel in launch.last_compiled:
            rows.append({**pair, **compiler_report(kernel, launch.last_compiled[kernel])})
    return rows


def compiler_rows(cases: list[Case], backends: list[str], device: str, seed: int = 0) -> list[dict]:
    """Every (case, triton backend) pair's rows; never raises for one pair's failure."""
    from attnbench.bench.inputs import make_tensors
    from attnbench.kernels.registry import get_backend, safe_available

    names = [b for b in backends if b in TRITON_BACKENDS]
    rows = []
    if device != "cuda":
        for case in cases:
            rows += [{**case.fields(), "case_id": case.case_id, "backend": name, "status": "unavailable",
                      "reason": "the compiler report reads sm_90 SASS: it needs a CUDA GPU"} for name in names]
        return rows
    cudnn, flash = get_backend("sdpa-cudnn"), get_backend("sdpa-flash")
    reference = cudnn if safe_available(cudnn)[0] else flash
    for case in cases:
        tensors = make_tensors(case, device, seed=seed)
        for name in names:
            backend = get_backend(name)
            base = {**case.fields(), "case_id": case.case_id, "backend": name}
            ok, reason = safe_available(backend)
            if ok:
                ok, reason = backend.supports(case)
            if not ok:
                rows.append({**base, "status": "unsupported", "reason": reason})
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    rows += [{**base, **row} for row in report_pair(case, backend, tensors, reference)]
                except Exception as err:  # this pair's row says why; the others go on
                    status, reason = classify(err, caught)
                    rows.append({**base, "status": status, "reason": reason})
            torch.cuda.empty_cache()
        del tensors
    return rows


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)
