"""Backend adapters. Importing this package registers the built-in backends.

Why ``attnbench.kernels`` and not a top-level ``kernels``: an installed top-level
package of that name would shadow, or be shadowed by, Hugging Face's ``kernels``.
"""
from attnbench.kernels import eager, flex, sdpa  # noqa: F401  (register on import)
from attnbench.kernels import flash_attn  # noqa: F401  (fa2, fa3, fa3-fp8, fa4)
from attnbench.kernels import flashinfer  # noqa: F401  (flashinfer, flashinfer-fp8kv, flashinfer-mla)
from attnbench.kernels import triton as _triton  # noqa: F401  (registers triton, triton-dq-*, triton-fp8)
from attnbench.kernels.registry import (Backend, BackendError, all_backends, backend_names,
                                        get_backend, register, safe_available)

__all__ = ["Backend", "BackendError", "all_backends", "backend_names", "get_backend", "register",
           "safe_available"]
