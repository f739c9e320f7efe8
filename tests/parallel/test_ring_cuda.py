"""On 2 or more GPUs (NCCL, one process a GPU): ring attention over every CUDA block kernel and PyTorch's
context_parallel equal fp64 attention on the gathered sequence, forward and backward. Skipped without them."""
import itertools

import pytest
import torch

from attnbench.bench.inputs import make_tensors
from attnbench.case import Case
from attnbench.parallel.backends import get_cp_backend
from attnbench.parallel.documents import Documents
from attnbench.parallel.numerics import gather_shards
from attnbench.parallel.sharding import Sharding
from tests.parallel.helpers import masked_reference, run_ranks

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]


def check(rank, world, backend_name, sharding_name, causal, documents=None):
    backend = get_cp_backend(backend_name)
    total = 1024 * world
    case = Case("fwd_bwd", "gqa", 1, 8, 2, 128, 128, total, total, causal, "bf16")
    ok, why = backend.available("cuda")
    if ok:
        ok, why = backend.supports(case, sharding_name, documents)
    if not ok:
        return
    full = make_tensors(case, "cuda", seed=7, requires_grad=False)
    ref_out, ref_grads = masked_reference(full.q, full.k, full.v, full.dout, causal, case.scale, documents)
    prepared = backend.prepare(case, full, Sharding(sharding_name, world, total), documents, rank)
    try:
        out, grads = prepared.result()
        got = [gather_shards(x, prepared.layout) for x in (out, *grads)]
    finally:
        prepared.close()
    where = f"{backend_name} {sharding_name} causal={causal} docs={documents is not None}"
    for name, g, want in zip(("out", "dq", "dk", "dv"), got, (ref_out, *ref_grads)):
        torch.testing.assert_close(g.double(), want, atol=3e-2, rtol=3e-2, msg=f"rank {rank}: {where}: {name}")


def every_backend(rank, world):
    for backend, sharding, causal in itertools.product(
            ("ring-sdpa-flash", "ring-sdpa-cudnn", "ring-fa4", "ring-triton", "torch-cp-allgather",
             "torch-cp-alltoall"), ("contiguous", "zigzag", "striped"), (True, False)):
        check(rank, world, backend, sharding, causal)
    documents = Documents.from_lengths([300, 1, 700, 1024 * world - 1001])
    for backend, sharding in itertools.product(("ring-sdpa-flash", "ring-sdpa-cudnn", "ring-fa4"),
                                               ("contiguous", "zigzag")):
        check(rank, world, backend, sharding, True, documents)


def test_ring_and_torch_cp_equal_fp64_on_two_gpus(tmp_path):
    run_ranks(2, tmp_path, every_backend, backend="nccl")
