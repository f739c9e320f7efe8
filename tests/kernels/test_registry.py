"""Every backend that runs on this host against the fp64 reference; registry behaviour."""
import pytest
import torch

from attnbench.case import Case
from attnbench.bench.numerics import check_numerics
from attnbench.kernels import BackendError, all_backends, get_backend, safe_available

CPU_BACKENDS = ["eager", "sdpa-math", "sdpa-flash", "flex"]
TOL = {"fp32": 1e-5, "bf16": 2e-2}


def small(**kw):
    base = dict(mode="fwd", layout="gqa", batch=2, heads_q=4, heads_kv=2, head_dim_qk=32, head_dim_v=32,
                seq_q=67, seq_kv=67, causal=True, dtype="fp32")  # 67: not a multiple of any tile
    base.update(kw)
    return Case(**base)


def attend(name, case):
    backend = get_backend(name)
    return lambda q, k, v: backend.attention(q, k, v, causal=case.causal, scale=case.scale)


@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_fp64(name, dtype, causal):
    case = small(dtype=dtype, causal=causal)
    result = check_numerics(case, attend(name, case), "cpu", seed=1)
    assert result.out.rel_err < TOL[dtype]
    assert result.out.rel_err > 0  # a real low-precision computation, not the reference itself
    assert result.worst_ratio_vs_eager() <= 2.0


@pytest.mark.parametrize("name", ["eager", "sdpa-math", "sdpa-flash"])
def test_gradients_match_fp64(name):
    case = small(mode="fwd_bwd", seq_q=33, seq_kv=50)
    result = check_numerics(case, attend(name, case), "cpu", seed=2)
    assert all(g.rel_err < 1e-5 for g in result.grads)


def test_decode_with_bottom_right_mask_sees_every_key():
    case = small(mode="decode", seq_q=4, seq_kv=40)
    for name in ("eager", "sdpa-math"):
        assert check_numerics(case, attend(name, case), "cpu", seed=3).out.rel_err < 1e-5


@pytest.mark.parametrize("name", ["eager", "sdpa-math", "sdpa-flash"])
def test_gqa_with_all_heads_equals_mha(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 8, generator=gen) for _ in range(3))
    backend = get_backend(name)
    mha = backend.attention(q, k, v, causal=True, scale=0.3)
    gqa_full = backend.attention(q, k, v, causal=True, scale=0.3)  # heads_kv == heads_q through the gqa path
    shared = backend.attention(q, k[:, :1].expand(-1, 4, -1, -1).contiguous(), v[:, :1].expand(-1, 4, -1, -1).contiguous(),
                               causal=True, scale=0.3)
    mqa = backend.attention(q, k[:, :1], v[:, :1], causal=True, scale=0.3)
    torch.testing.assert_close(gqa_full, mha)
    torch.testing.assert_close(mqa, shared, rtol=1e-5, atol=1e-6)


def test_registry_lists_every_builtin_with_a_reason_when_unavailable():
    backends = all_backends()
    for name in ["eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flex"]:
        assert name in backends
    for backend in backends.values():
        ok, reason = safe_available(backend)
        assert ok or reason


def test_fp8_backends_name_the_inputs_they_read_in_e4m3_and_rows_count_them_at_one_byte():
    from attnbench.bench import conventions
    from attnbench.bench.microbench import base_row

    backends = all_backends()
    assert {n: b.fp8_inputs for n, b in backends.items() if b.fp8_inputs} == {
        "fa3-fp8": ("q", "k", "v"), "flashinfer-fp8kv": ("k", "v"), "triton-fp8": ("q", "k", "v")}
    assert all(bool(b.fp8_inputs) == (b.compute_dtype == "fp8") for b in backends.values())
    decode = Case(mode="decode", layout="gqa", batch=2, heads_q=8, heads_kv=2, head_dim_qk=64, head_dim_v=64,
                  seq_q=1, seq_kv=256, causal=False, dtype="bf16")
    row = base_row(decode, backends["flashinfer-fp8kv"], "cpu", None)
    assert row["bytes_model"] == conventions.bytes_model(decode, "fused") - conventions.kv_cache_bytes(decode) / 2


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(BackendError, match=r"backend='fa9' is not known; allowed: .*sdpa-math"):
        get_backend("fa9")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only host")
def test_cuda_only_backends_say_why():
    ok, reason = safe_available(get_backend("sdpa-cudnn"))
    assert not ok and "CUDA" in reason


def test_entry_point_plugins_are_discovered(monkeypatch):
    import importlib.metadata as md

    from attnbench.kernels import registry

    ep = md.EntryPoint(name="toy", value="tests.plugin_backend:ToyBackend", group=registry.ENTRY_POINT_GROUP)
    broken = md.EntryPoint(name="broken", value="no_such_module:Thing", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(md, "entry_points", lambda group=None: [ep, broken] if group == registry.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry._discover.cache_clear()
    try:
        backends = registry.all_backends()
        assert backends["toy"].name == "toy"
        ok, reason = safe_available(backends["broken"])
        assert not ok and "no_such_module" in reason
    finally:
        registry._discover.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("name, pattern", [("sdpa-flash", "flash"), ("sdpa-efficient", "fmha|efficient"),
                                           ("sdpa-cudnn", "cudnn|sdpa")])
def test_sdpa_backends_run_the_kernel_they_are_named_for(name, pattern):
    import re

    from attnbench.bench.inputs import make_tensors
    from attnbench.bench.provenance import kernel_names

    case = small(dtype="bf16", head_dim_qk=64, head_dim_v=64, heads_kv=4, layout="mha", seq_q=1024, seq_kv=1024)
    backend = get_backend(name)
    fn = backend.build(case, make_tensors(case, "cuda", seed=0))
    names = kernel_names(fn, "cuda")
    assert any(re.search(pattern, n, re.I) for n in names), names
