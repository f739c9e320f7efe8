"""Random inputs for a case: fresh per check, seeded per case, never zeros."""
from __future__ import annotations

import torch

from attnbench.case import Case, Tensors, cu_seqlens


def make_tensors(case: Case, device: str | torch.device, *, seed: int, dtype: torch.dtype | None = None,
                 requires_grad: bool | None = None) -> Tensors:
    """Standard-normal q, k, v (and dO for fwd_bwd) in BHSD layout; packed with ``cu_seqlens`` for a
    ragged case (:class:`attnbench.case.Tensors`).

    ``dtype`` overrides the case's dtype. Values are drawn on ``device`` by its
    own generator: drawing gigabytes of decode KV cache on the host and copying
    them over took tens of seconds per case. The same seed gives the same values
    on the same kind of device.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = dtype or case.torch_dtype
    grad = case.has_backward if requires_grad is None else requires_grad

    def draw(*shape):
        t = torch.randn(*shape, generator=gen, dtype=torch.float32, device=device).to(dtype=dtype)
        return t.requires_grad_(grad)

    # a ragged batch is one packed row of every sequence's tokens, end to end
    b, sq, skv = (1, sum(case.lens_q), sum(case.lens_kv)) if case.ragged else (case.batch, case.seq_q, case.seq_kv)
    q = draw(b, case.heads_q, sq, case.head_dim_qk)
    k = draw(b, case.heads_kv, skv, case.head_dim_qk)
    v = k[..., : case.head_dim_v].detach().clone().requires_grad_(grad) if case.layout == "mla" else \
        draw(b, case.heads_kv, skv, case.head_dim_v)
    dout = draw(b, case.heads_q, sq, case.head_dim_v).detach() if case.has_backward else None
    if not case.ragged:
        return Tensors(q, k, v, dout)
    return Tensors(q, k, v, dout, cu_seqlens(case.lens_q, device), cu_seqlens(case.lens_kv, device))



def cast_tensors(t: Tensors, dtype: torch.dtype, requires_grad: bool) -> Tensors:
    """The same values in another dtype, as fresh leaves."""
    def c(x):
        return None if x is None else x.detach().to(dtype).requires_grad_(requires_grad)
    return Tensors(c(t.q), c(t.k), c(t.v), None if t.dout is None else t.dout.detach().to(dtype),
                   t.cu_seqlens_q, t.cu_seqlens_kv)
