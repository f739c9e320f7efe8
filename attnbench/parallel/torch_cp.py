"""PyTorch's own context parallelism: ``torch.distributed.tensor.experimental.context_parallel``.

Inside the context, ``F.scaled_dot_product_attention`` on the sharded buffers dispatches (through
DTensor) to PyTorch's ring attention, which runs the pinned SDPA kernel per block and merges by
the log-sum-exp, forward and backward (``_context_parallel/_attention.py``). Its two ways of
moving K/V (``set_rotate_method``):

* ``allgather``: one all-gather of every rank's K/V after the first block, then each step reads
  its shard from the gathered buffer (memory: all of K/V on every rank);
* ``alltoall``: a permutation collective per step that passes each rank's shard to the next,
  a ring in collective form (the backward always rotates dK/dV this way).

Sharding: with load balancing on (causal only) PyTorch rearranges the sequence head-tail, rank r
holding chunks r and 2 world - 1 - r (our ``zigzag``, checked against its
``_HeadTailLoadBalancer`` in the tests); off, each rank holds one contiguous chunk.

What it cannot run, as the reason a row gives: striped sharding (not one of its layouts),
zigzag without a causal mask (its load balancing raises "Load balancing requires
`is_causal=True`"), packed documents (its SDPA path takes no document mask; its flex_attention
path would), and the CPU (:data:`CPU_REASON`).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

ROTATIONS = ("allgather", "alltoall")
SDPA_KERNEL = "sdpa-flash"  # the kernel PyTorch's ring runs per block (pinned with sdpa_kernel)
CPU_REASON = (f"PyTorch's context_parallel (torch {torch.__version__}) routes only the CUDA SDPA ops (flash, "
              "efficient, cuDNN) to its ring attention; on CPU DTensor raises for the causal CPU flash op "
              "('does not have a sharding strategy registered') and runs the non-causal one through its "
              "decomposition (over four minutes to plan one 256-token call on a 2-core host), neither of "
              "which is context parallelism")


def blocker(sharding: str, causal: bool, documents) -> str:
    """Why PyTorch's context_parallel cannot run this layout, or ""."""
    if sharding == "striped":
        return ("PyTorch's context_parallel shards contiguously or head-tail (zigzag, with load balancing); "
                "striped is not one of its layouts")
    if sharding == "zigzag" and not causal:
        return "PyTorch's context_parallel balances load only under a causal mask (it raises otherwise)"
    if documents is not None:
        return ("PyTorch's context_parallel SDPA path takes no document mask (its flex_attention path would; "
                "not run here)")
    return ""


@contextlib.contextmanager
def sharded(mesh, positions: torch.Tensor, *, rotation: str, load_balance: bool):
    """Enter context_parallel with this rotation and load balancing; the global options are restored after.

    ``positions`` (``arange(S)``, every rank) is its one buffer: context_parallel picks its load
    balancer from the buffer's length and shards it in place, so that afterwards it holds the positions
    this rank's queries must be (checked against our sharding by the caller). The inputs themselves are
    sharded by :mod:`attnbench.parallel.sharding`: handing context_parallel the whole q, k, v would
    leave their full-length storage allocated (it shards buffers with ``resize_``) and inflate every
    rank's peak memory.
    """
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    saved = (_cp_options.rotate_method, _cp_options.enable_load_balance)
    set_rotate_method(rotation)
    _cp_options.enable_load_balance = load_balance
    try:
        with context_parallel(mesh, buffers=[positions], buffer_seq_dims=[0], no_restore_buffers={positions}):
            yield
    finally:
        _cp_options.rotate_method, _cp_options.enable_load_balance = saved


def attention(q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
    """SDPA on the sharded buffers (inside :func:`sharded`) with the flash kernel pinned: left to choose,
    SDPA on CPU takes its math path, which DTensor runs by gathering K and V (no ring, and not this backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
