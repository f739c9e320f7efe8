"""Ring attention on real gloo process groups (2 to 4 processes): every rank's output shard and gradient
shards equal unsharded fp64 attention's, for every sharding, causal and not, MHA and GQA, dense and packed
documents, with the math, CPU flash and Triton (interpreter) block kernels."""
import itertools

import torch

from attnbench.parallel.comm import PhaseTimer
from attnbench.parallel.documents import Documents
from attnbench.parallel.kernels import get_kernel
from attnbench.parallel.ring import Ring, ring_attention
from attnbench.parallel.sharding import Sharding
from tests.parallel.helpers import masked_reference, run_ranks


def check_ring(rank, world, *, sharding_name, kernel_name, dtype, heads_kv, causal, total, documents=None,
               serialize=False, head_dim=16, tol=1e-5):
    """One configuration on this rank: ring forward + backward against the sharded fp64 reference."""
    gen = torch.Generator().manual_seed(1234)  # every rank draws the same whole sequence
    q, do = (torch.randn(2, 4, total, head_dim, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(2, heads_kv, total, head_dim, generator=gen).to(dtype) for _ in range(2))
    scale = head_dim ** -0.5
    ref_out, ref_grads = masked_reference(q, k, v, do, causal, scale, documents)
    sharding = Sharding(sharding_name, world, total)
    kernel = get_kernel(kernel_name)
    timer = PhaseTimer("cpu") if serialize else None
    ring = Ring(sharding, rank, kernel, causal, scale, documents, serialize=serialize, timer=timer)
    local = [sharding.shard(x, rank, 2).requires_grad_(i < 3) for i, x in enumerate((q, k, v, do))]
    out = ring_attention(*local[:3], ring)
    grads = torch.autograd.grad(out, local[:3], local[3])
    where = f"rank {rank}: {sharding_name} {kernel_name} {dtype} hkv={heads_kv} causal={causal}"
    torch.testing.assert_close(out.double(), sharding.shard(ref_out, rank, 2), atol=tol, rtol=tol, msg=where)
    for name, got, want in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(got.double(), sharding.shard(want, rank, 2), atol=3 * tol, rtol=3 * tol,
                                   msg=f"{where}: d{name}")
    if serialize:
        spent = timer.totals_s()
        assert spent["compute"] > 0 and (spent["comm"] > 0) == (world > 1), spent


def dense_two_ranks(rank, world):
    for sharding, causal, heads_kv, (kernel, dtype) in itertools.product(
            ("contiguous", "zigzag", "striped"), (False, True), (4, 2),
            (("math", torch.float32), ("sdpa-flash", torch.float32))):
        check_ring(rank, world, sharding_name=sharding, kernel_name=kernel, dtype=dtype, heads_kv=heads_kv,
                   causal=causal, total=24)
    check_ring(rank, world, sharding_name="zigzag", kernel_name="sdpa-flash", dtype=torch.bfloat16, heads_kv=2,
               causal=True, total=24, tol=3e-2)


def test_ring_equals_unsharded_attention_on_two_ranks(tmp_path):
    run_ranks(2, tmp_path, dense_two_ranks)


def dense_four_ranks(rank, world):
    for sharding, causal in itertools.product(("contiguous", "zigzag", "striped"), (False, True)):
        check_ring(rank, world, sharding_name=sharding, kernel_name="sdpa-flash", dtype=torch.float32, heads_kv=2,
                   causal=causal, total=32)


def test_ring_equals_unsharded_attention_on_four_ranks(tmp_path):
    run_ranks(4, tmp_path, dense_four_ranks)


def documents_ranks(rank, world):
    documents = Documents.from_lengths([5, 1, 13, 3, 8, 6, 12])  # 48 tokens; pieces cross every boundary
    for sharding, causal, kernel in itertools.product(("contiguous", "zigzag"), (False, True),
                                                      ("math", "sdpa-flash")):
        check_ring(rank, world, sharding_name=sharding, kernel_name=kernel, dtype=torch.float32, heads_kv=2,
                   causal=causal, total=48, documents=documents)


def test_ring_with_packed_documents_on_three_ranks(tmp_path):
    run_ranks(3, tmp_path, documents_ranks)


def serialised_and_triton(rank, world):
    check_ring(rank, world, sharding_name="zigzag", kernel_name="sdpa-flash", dtype=torch.float32, heads_kv=4,
               causal=True, total=24, serialize=True)
    check_ring(rank, world, sharding_name="zigzag", kernel_name="triton", dtype=torch.float16, heads_kv=2,
               causal=True, total=64, head_dim=32, tol=1e-2)


def test_serialised_ring_is_timed_and_triton_blocks_ring(tmp_path):
    run_ranks(2, tmp_path, serialised_and_triton)


def test_ring_of_one_is_plain_attention_with_and_without_documents():
    """World size 1 (the N=1 baseline, and the unsharded yardstick of the numerics): no exchange at all."""
    for documents in (None, Documents.from_lengths([7, 9, 8])):
        for causal in (False, True):
            check_ring(0, 1, sharding_name="contiguous", kernel_name="sdpa-flash", dtype=torch.float32, heads_kv=2,
                       causal=causal, total=24, documents=documents)


def torch_cp_layouts(rank, world):
    from attnbench.parallel.backends import _mesh
    from attnbench.parallel.torch_cp import sharded

    for name in ("contiguous", "zigzag"):
        positions = torch.arange(16)
        with sharded(_mesh("cpu", world), positions, rotation="alltoall", load_balance=name == "zigzag"):
            assert torch.equal(positions, Sharding(name, world, 16).positions(rank)), (name, positions)


def test_pytorch_context_parallel_holds_our_contiguous_and_zigzag_positions(tmp_path):
    """Entering PyTorch's context_parallel (no attention call: on CPU it has none) shards its position
    buffer exactly as our contiguous and zigzag shardings do, so its output shards unshard with ours."""
    run_ranks(2, tmp_path, torch_cp_layouts)
