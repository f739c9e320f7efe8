"""Block kernels and the log-sum-exp merge in one process: blocks of a causal problem, merged, equal the
whole problem, and the blocks' backward with the merged output and LSE sums to the whole gradient."""
import pytest
import torch

from attnbench.kernels.eager import eager_attention
from attnbench.parallel.kernels import KERNELS, get_kernel
from attnbench.parallel.merge import empty_accumulators, merge_block

# (query rows, key rows, causal) covering a causal 12 x 12 problem: two diagonal squares and the block below
BLOCKS = [((0, 6), (0, 6), True), ((6, 12), (0, 6), False), ((6, 12), (6, 12), True)]
CPU_KERNELS = [("math", torch.float32), ("math", torch.bfloat16), ("sdpa-flash", torch.float32),
               ("sdpa-flash", torch.bfloat16), ("triton", torch.float16)]


def to_layout(x, kernel):
    return x if kernel.layout == "bhsd" else x.transpose(1, 2).contiguous()


@pytest.mark.parametrize("name,dtype", CPU_KERNELS)
@pytest.mark.parametrize("heads_kv", [4, 2])
def test_merged_blocks_equal_whole_attention_forward_and_backward(name, dtype, heads_kv):
    kernel = get_kernel(name)
    torch.manual_seed(0)
    d = 32 if name == "triton" else 16
    q64 = torch.randn(1, 4, 12, d, dtype=torch.float64, requires_grad=True)
    k64 = torch.randn(1, heads_kv, 12, d, dtype=torch.float64, requires_grad=True)
    v64 = torch.randn(1, heads_kv, 12, d, dtype=torch.float64, requires_grad=True)
    do64 = torch.randn(1, 4, 12, d, dtype=torch.float64)
    scale = d ** -0.5
    ref = eager_attention(q64, k64, v64, causal=True, scale=scale)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do64)
    q, k, v, do = (to_layout(x.detach().to(dtype), kernel) for x in (q64, k64, v64, do64))
    sd = kernel.seq_dim

    def rows(x, r):
        return x.narrow(sd, r[0], r[1] - r[0])

    out, lse = empty_accumulators(q, d, sd)
    for qr, kr, causal in BLOCKS:
        o_b, lse_b, aux = kernel.forward(rows(q, qr), rows(k, kr), rows(v, kr), causal=causal, scale=scale)
        merge_block(out, lse, qr, o_b, lse_b, sd)
    out = out.to(dtype)
    tol = 2e-2 if dtype != torch.float32 else 1e-5
    torch.testing.assert_close(to_layout(out, kernel).double(), ref.detach(), atol=tol, rtol=tol)

    grads = [torch.zeros_like(x, dtype=torch.float32) for x in (q, k, v)]
    for qr, kr, causal in BLOCKS:
        _, _, aux = kernel.forward(rows(q, qr), rows(k, kr), rows(v, kr), causal=causal, scale=scale)
        dq, dk, dv = kernel.backward(rows(do, qr), rows(q, qr), rows(k, kr), rows(v, kr), rows(out, qr),
                                     lse[:, :, qr[0]:qr[1]], aux, causal=causal, scale=scale)
        rows(grads[0], qr).add_(dq.float())
        rows(grads[1], kr).add_(dk.float())
        rows(grads[2], kr).add_(dv.float())
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(to_layout(got, kernel).double(), want, atol=3 * tol, rtol=3 * tol)


def test_every_kernel_names_its_backend_and_layout():
    from attnbench.kernels.registry import backend_names

    for kernel in KERNELS.values():
        assert kernel.backend in backend_names()
        assert kernel.layout in ("bhsd", "bshd")
    with pytest.raises(KeyError, match="allowed: math, sdpa-flash"):
        get_kernel("nope")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa-flash", "sdpa-cudnn", "fa4", "triton"])
@pytest.mark.parametrize("heads_kv", [8, 2])
def test_cuda_kernels_merge_to_whole_attention(name, heads_kv):
    """The CUDA block calls (flash, cuDNN, fa4, triton) against fp64: forward and backward, MHA and GQA."""
    kernel = get_kernel(name)
    ok, reason = kernel.available()
    if not ok:
        pytest.skip(reason)
    torch.manual_seed(0)
    s, d = 512, 128
    q64 = torch.randn(2, 8, s, d, dtype=torch.float64, device="cuda", requires_grad=True)
    k64 = torch.randn(2, heads_kv, s, d, dtype=torch.float64, device="cuda", requires_grad=True)
    v64 = torch.randn(2, heads_kv, s, d, dtype=torch.float64, device="cuda", requires_grad=True)
    do64 = torch.randn(2, 8, s, d, dtype=torch.float64, device="cuda")
    scale = d ** -0.5
    ref = eager_attention(q64, k64, v64, causal=True, scale=scale)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), do64)
    q, k, v, do = (to_layout(x.detach().to(torch.bfloat16), kernel) for x in (q64, k64, v64, do64))
    sd, half = kernel.seq_dim, s // 2
    blocks = [((0, half), (0, half), True), ((half, s), (0, half), False), ((half, s), (half, s), True)]

    def rows(x, r):
        return x.narrow(sd, r[0], r[1] - r[0])

    out, lse = empty_accumulators(q, d, sd)
    auxes = []
    for qr, kr, causal in blocks:
        o_b, lse_b, aux = kernel.forward(rows(q, qr), rows(k, kr), rows(v, kr), causal=causal, scale=scale)
        merge_block(out, lse, qr, o_b, lse_b, sd)
        auxes.append(aux)
    out = out.to(torch.bfloat16)
    torch.testing.assert_close(to_layout(out, kernel).double(), ref.detach(), atol=2e-2, rtol=2e-2)
    grads = [torch.zeros_like(x, dtype=torch.float32) for x in (q, k, v)]
    for (qr, kr, causal), aux in zip(blocks, auxes):
        dq, dk, dv = kernel.backward(rows(do, qr), rows(q, qr), rows(k, kr), rows(v, kr), rows(out, qr),
                                     lse[:, :, qr[0]:qr[1]], aux, causal=causal, scale=scale)
        for acc, g, r in zip(grads, (dq, dk, dv), (qr, kr, kr)):
            rows(acc, r).add_(g.float())
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(to_layout(got, kernel).double(), want, atol=5e-2, rtol=5e-2)
