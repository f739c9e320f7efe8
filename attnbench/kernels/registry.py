"""The backend contract and the registry that finds every backend by name.

A backend adapts one attention implementation to the harness. The contract
(``DESIGN.md``, Backends):

* ``name``, ``family`` (``fused``/``eager``/``math``: how its bytes are
  modelled), ``kernel_pattern`` (a regex the profiled kernel names must match, so
  a silent fallback is caught instead of mislabelled), ``version()``;
* ``available() -> (bool, reason)``: import and device checks, never raising;
* ``supports(case) -> (bool, reason)``: dtype, head dim, layout, mode;
* ``build(case, tensors) -> callable``: layout conversion and setup happen here,
  the returned zero-argument callable runs only the kernel (and, in fwd_bwd,
  its backward);
* ``attention(q, k, v, *, causal, scale)``: the autograd-capable call models use (dense cases);
* ``output(case, result)``: the timed callable's result as the harness's output tensor (BHSD, packed
  for a ragged case), so that a ragged or variant case is checked on the path that was timed;
* fp8 backends only: ``compute_dtype = "fp8"`` and ``fp8_inputs``, the inputs the
  timed call reads in e4m3 (counted at one byte per element in ``bytes_model``).

Tensors at the contract boundary are BHSD: q (B, Hq, Sq, Dqk), k (B, Hkv, Skv,
Dqk), v (B, Hkv, Skv, Dv). Causal masks are bottom-right aligned.

Built-in backends register on import of :mod:`attnbench.kernels`; third-party
packages register through the ``attnbench.backends`` entry-point group, whose
entry points name either a :class:`Backend` subclass or a callable returning an
iterable of :class:`Backend` instances.
"""
from __future__ import annotations

import functools
import importlib.metadata
import re
from typing import Callable, Iterable

import torch

from attnbench.case import Case, Tensors

ENTRY_POINT_GROUP = "attnbench.backends"


class Backend:
    """Base class: override the methods that differ. Instances are stateless."""

    name: str = ""
    family: str = "fused"
    kernel_pattern: str = ""  # regex over profiled kernel names; "" skips the check
    install_hint: str = ""
    # Precision the kernel computes in when it differs from the case dtype: "fp8" for backends that
    # quantise bf16/fp16 inputs themselves. The 2x-eager gate (a rule for kernels computing in the input
    # precision) does not apply; they are held to attnbench.bench.numerics.FP8_REL_ERR_BOUND instead.
    compute_dtype: str | None = None
    # Inputs among "q", "k", "v" that the timed call reads in e4m3 (quantised in build): bytes_model
    # counts them at one byte per element (attnbench.bench.conventions.bytes_model). Set with compute_dtype.
    fp8_inputs: tuple[str, ...] = ()

    def version(self) -> str:
        return torch.__version__

    def available(self) -> tuple[bool, str]:
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        return True, ""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} has no attention()")

    def output(self, case: Case, result) -> torch.Tensor:
        """The built callable's result in the harness layout (default: BHSD already, or its first item)."""
        return result[0] if isinstance(result, tuple) else result

    def build(self, case: Case, tensors: Tensors) -> Callable[[], object]:
        """Default: time :meth:`attention` (plus its backward in fwd_bwd) on the given tensors."""
        q, k, v = tensors.q, tensors.k, tensors.v
        causal, scale = case.causal, case.scale
        if not case.has_backward:
            return lambda: self.attention(q, k, v, causal=causal, scale=scale)
        dout = tensors.dout
        inputs = (q, k, v)

        def fwd_bwd():
            out = self.attention(q, k, v, causal=causal, scale=scale)
            return torch.autograd.grad(out, inputs, dout)

        return fwd_bwd

    def kernels_match(self, kernel_names: Iterable[str]) -> bool:
        """True when any profiled kernel name matches ``kernel_pattern`` (or no pattern is set)."""
        if not self.kernel_pattern:
            return True
        pattern = re.compile(self.kernel_pattern, re.IGNORECASE)
        return any(pattern.search(name) for name in kernel_names)


def dense_only(name: str, case: Case) -> tuple[bool, str]:
    """The ``supports`` answer of an adapter that runs dense cases only: why it refuses the others."""
    if case.ragged:
        return False, f"this {name} adapter runs equal-length batches; the ragged ({case.workload}) path is not wired"
    if case.variant != "none":
        return False, f"this {name} adapter runs no attention variants (case variant {case.variant})"
    return True, ""


class BackendError(KeyError):
    """An unknown backend name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it one clean line
        return self.args[0]


_REGISTRY: dict[str, Backend] = {}


def register(backend_cls: type[Backend]) -> type[Backend]:
    """Class decorator: instantiate and register under ``backend_cls.name``."""
    instance = backend_cls()
    if not instance.name:
        raise ValueError(f"{backend_cls.__name__} has no name")
    if instance.name in _REGISTRY and type(_REGISTRY[instance.name]) is not backend_cls:
        raise ValueError(f"backend name {instance.name!r} is registered twice "
                         f"({type(_REGISTRY[instance.name]).__name__} and {backend_cls.__name__})")
    _REGISTRY[instance.name] = instance
    return backend_cls


def _load_entry_point(ep) -> list[Backend]:
    obj = ep.load()
    if isinstance(obj, type) and issubclass(obj, Backend):
        return [obj()]
    return list(obj())


@functools.cache
def _discover() -> tuple[str, ...]:
    """Import built-ins and entry points once; a broken plugin becomes an unavailable row."""
    import attnbench.kernels  # noqa: F401  (registers the built-ins)

    broken = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            for backend in _load_entry_point(ep):
                _REGISTRY.setdefault(backend.name, backend)
        except Exception as err:  # a plugin that fails to import must not take the harness down
            _REGISTRY.setdefault(ep.name, _Broken(ep.name, f"entry point {ep.value} failed to load: {err}"))
            broken.append(ep.name)
    return tuple(broken)


class _Broken(Backend):
    """Stands in for a plugin whose entry point raised on import."""

    def __init__(self, name: str, reason: str):
        self.name, self._reason = name, reason

    def version(self) -> str:
        return ""

    def available(self) -> tuple[bool, str]:
        return False, self._reason


def all_backends() -> dict[str, Backend]:
    _discover()
    return dict(_REGISTRY)


def backend_names() -> list[str]:
    return list(all_backends())


def get_backend(name: str) -> Backend:
    backends = all_backends()
    if name not in backends:
        raise BackendError(f"backend={name!r} is not known; allowed: {', '.join(backends)}")
    return backends[name]


def safe_version(backend: Backend) -> str:
    """``version()`` that never raises: a broken install reports "unknown (<error type>)"."""
    try:
        return backend.version()
    except Exception as err:
        return f"unknown ({type(err).__name__})"


def safe_available(backend: Backend) -> tuple[bool, str]:
    """``available()`` with the contract enforced: an exception becomes the reason."""
    try:
        return backend.available()
    except Exception as err:
        return False, f"available() raised {type(err).__name__}: {err}"
