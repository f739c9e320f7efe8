"""Choosing and checking the attention backend a training run calls.

A backend that cannot train the model's attention shape here (FlexAttention has no
backward on CPU; SDPA's flash kernel wants equal q/k/v head dims, which naive MLA
does not have) is found before the first step, by one forward and backward at the
layer's shape, and the run ends as ``unsupported`` with the backend's own reason.
``backend: auto`` times every available backend that passes the check on the
layer's shape and keeps the fastest. A backend that is not available here at all (not
installed, no CUDA device) makes the run an ``unavailable`` row instead.
"""
from __future__ import annotations

import time

import torch

from attnbench.case import Case
from attnbench.kernels.registry import all_backends, get_backend, safe_available


class BackendUnsupported(RuntimeError):
    """The backend cannot run this training shape here; the message says why."""


class BackendUnavailable(BackendUnsupported):
    """The backend cannot run here at all (not installed, no device); the message says why."""


def _tensors(case: Case, device: str, dtype: torch.dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = [(case.batch, case.heads_q, case.seq_q, case.head_dim_qk), (case.batch, case.heads_kv, case.seq_kv, case.head_dim_qk),
              (case.batch, case.heads_kv, case.seq_kv, case.head_dim_v)]
    return [torch.randn(s, device=device, dtype=dtype, generator=gen).requires_grad_() for s in shapes]


def _fwd_bwd(name: str, case: Case, q, k, v) -> None:
    out = get_backend(name).attention(q, k, v, causal=True, scale=case.scale)
    out.float().square().mean().backward()


def check_backend(name: str, case: Case, device: str, dtype: torch.dtype) -> None:
    """One forward + backward of ``name`` at ``case``'s shape; raises BackendUnsupported with the reason."""
    ok, reason = safe_available(get_backend(name))
    if not ok:
        raise BackendUnavailable(f"backend {name} is unavailable: {reason}")
    try:
        _fwd_bwd(name, case, *_tensors(case, device, dtype))
    except Exception as err:  # the backend's own refusal is the reason
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise BackendUnsupported(f"backend {name} cannot train {case.label()} on {device}: "
                                 f"{type(err).__name__}: {first}") from None


def fastest_backend(case: Case, device: str, dtype: torch.dtype, candidates: list[str] | None = None,
                    reps: int = 5) -> tuple[str, dict[str, float]]:
    """The backend with the lowest median forward + backward time at ``case``'s shape, and every time measured.

    Backends that are unavailable or fail the check are left out; baselines
    (sdpa-math) count like any other.
    """
    times = {}
    for name in candidates or list(all_backends()):
        try:
            check_backend(name, case, device, dtype)
        except BackendUnsupported:
            continue
        q, k, v = _tensors(case, device, dtype)
        samples = []
        for _ in range(reps + 1):  # the first call warms up (and compiles, for flex)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            _fwd_bwd(name, case, q, k, v)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        times[name] = sorted(samples[1:])[len(samples[1:]) // 2]
    if not times:
        raise BackendUnsupported(f"no backend can train {case.label()} on {device}")
    return min(times, key=times.get), times
