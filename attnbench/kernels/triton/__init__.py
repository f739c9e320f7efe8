"""The project's own Triton FlashAttention: forward, backward, GQA, causal, fp16/bf16, and an FP8 forward.

Importing this package registers the ``triton`` and ``triton-fp8`` backends
(:mod:`.backend`) without importing Triton; the kernels (:mod:`.forward`,
:mod:`.backward`), their launchers (:mod:`.launch`), the autograd function
(:mod:`.autograd`) and the fp8 quantiser (:mod:`.fp8`) load on first use.
Design and measured results: ``docs/triton.md``.
"""
from attnbench.kernels.triton import backend  # noqa: F401  (registers the backends)
