"""flash-attention and FlashInfer adapters without the libraries: availability, supports(), layout
helpers, FP8 quantisation, and the adapters' wiring against stand-ins that implement each
library's API (argument names as in flash-attn-4 4.0.0b36 and flashinfer-python 0.7.4) in plain torch."""
import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch

from attnbench.case import Case
from attnbench.bench.inputs import make_tensors
from attnbench.bench.microbench import RunOptions, base_row, run_group
from attnbench.bench.numerics import check_numerics
from attnbench.kernels import flash_attn, flashinfer, get_backend, safe_available
from attnbench.kernels.eager import eager_attention
from attnbench.kernels.flashinfer import from_ragged, indptr, to_ragged

ADAPTERS = ["fa2", "fa3", "fa3-fp8", "fa4", "flashinfer", "flashinfer-fp8kv", "flashinfer-mla"]
MODULES = {"fa2": "flash_attn", "fa3": "flash_attn_interface", "fa3-fp8": "flash_attn_interface",
           "fa4": "flash_attn.cute", "flashinfer": "flashinfer", "flashinfer-fp8kv": "flashinfer",
           "flashinfer-mla": "flashinfer"}


def case(**kw):
    base = dict(mode="fwd", layout="gqa", batch=2, heads_q=4, heads_kv=2, head_dim_qk=64, head_dim_v=64,
                seq_q=40, seq_kv=40, causal=True, dtype="bf16")
    base.update(kw)
    return Case(**base)


def mla_case(**kw):
    """Absorbed MLA decode, DeepSeek-V2 dims (d_c 512 + d_h^R 64), 16 heads; 45 keys: not a page multiple."""
    return case(**{**dict(mode="decode", layout="mla", heads_q=16, heads_kv=1, head_dim_qk=576, head_dim_v=512,
                          seq_q=1, seq_kv=45, causal=False), **kw})


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@pytest.mark.parametrize("name", ADAPTERS)
def test_missing_library_is_unavailable_with_the_pip_command(name):
    if not _missing(MODULES[name]):
        pytest.skip(f"{MODULES[name]} is installed here")
    backend = get_backend(name)
    ok, reason = safe_available(backend)
    assert not ok
    assert reason.endswith("install: " + backend.install_hint) and backend.install_hint.startswith("pip install")


def test_microbench_rows_for_missing_adapters_say_how_to_install():
    if not all(_missing(MODULES[n]) for n in ADAPTERS):
        pytest.skip("an adapter's library is installed here")
    rows = run_group([case(dtype="fp32", seq_q=8, seq_kv=8)], ADAPTERS, RunOptions(cpu_min_run_time_s=0.01),
                     log=lambda s: None)
    assert [r["backend"] for r in rows] == ADAPTERS
    assert all(r["status"] == "unavailable" and "pip install" in r["reason"] for r in rows)
    assert {r["compute_dtype"] for r in rows if r["backend"] in ("fa3-fp8", "flashinfer-fp8kv")} == {"fp8"}


@pytest.mark.parametrize("name, kw, allowed", [
    ("fa4", {}, True),
    ("fa4", dict(mode="fwd_bwd", layout="mqa", heads_kv=1), True),
    ("fa4", dict(dtype="fp32"), False),
    ("fa4", dict(mode="decode", seq_q=1, causal=False, page_size=16), True),  # flash_attn_varlen_func's page_table
    ("fa4", dict(variant="alibi"), False),
    ("fa4", dict(variant="prefix_lm", prefix_len=8), False),
    ("fa4", dict(variant="sliding_window", window=8), True),
    ("fa2", dict(variant="softcap", softcap=30.0), False),
    ("fa3", dict(mode="decode", seq_q=1, causal=False, seq_lens_kv=(40, 12)), False),
    ("fa4", dict(layout="mla", heads_kv=1, head_dim_qk=576, head_dim_v=512), False),
    ("fa2", dict(head_dim_qk=32, head_dim_v=32), True),
    ("fa3-fp8", {}, True),
    ("fa3-fp8", dict(mode="fwd_bwd"), False),
    ("fa3-fp8", dict(dtype="fp16"), False),
    ("flashinfer", {}, True),
    ("flashinfer", dict(mode="decode", seq_q=1, causal=False, page_size=16), True),
    ("flashinfer", dict(mode="decode", seq_q=4, causal=True), False),
    ("flashinfer", dict(mode="fwd_bwd"), False),
    ("flashinfer", dict(head_dim_qk=96, head_dim_v=96), False),
    ("flashinfer-fp8kv", dict(mode="decode", seq_q=1, causal=False), True),
    ("flashinfer-fp8kv", {}, False),
    ("flashinfer", dict(mla_case().fields()), False),
    ("flashinfer-mla", dict(mla_case().fields()), True),
    ("flashinfer-mla", dict(mla_case(dtype="fp16", heads_q=128, page_size=1).fields()), True),
    ("flashinfer-mla", dict(mla_case(dtype="fp32").fields()), False),
    ("flashinfer-mla", dict(mla_case(heads_q=8).fields()), False),
    ("flashinfer-mla", dict(mla_case(head_dim_qk=288, head_dim_v=256).fields()), False),  # d_c 256
    ("flashinfer-mla", dict(mla_case(head_dim_qk=544).fields()), False),  # d_h^R 32
    ("flashinfer-mla", dict(mla_case(seq_q=2, causal=True).fields()), False),
    ("flashinfer-mla", dict(mode="fwd", layout="mla", heads_kv=1, head_dim_qk=576, head_dim_v=512), False),
    ("flashinfer-mla", dict(mode="decode", layout="mqa", heads_kv=1, seq_q=1, causal=False), False),
])
def test_supports_rules_give_reasons(name, kw, allowed):
    ok, reason = get_backend(name).supports(case(**kw))
    assert ok is allowed
    assert bool(reason) is not allowed


def test_bshd_and_ragged_layouts_round_trip():
    x = torch.randn(2, 3, 5, 4)  # (B, H, S, D)
    bshd = flash_attn.to_bshd(x)
    assert bshd.shape == (2, 5, 3, 4) and bshd.is_contiguous() and torch.equal(bshd[1, 4, 2], x[1, 2, 4])
    assert torch.equal(flash_attn.from_bshd(bshd), x)
    ragged = to_ragged(x)  # (B*S, H, D): request b's token s is row b*S + s
    assert ragged.shape == (10, 3, 4) and torch.equal(ragged[1 * 5 + 4, 2], x[1, 2, 4])
    assert torch.equal(from_ragged(ragged, 2), x)
    assert indptr(3, 5).tolist() == [0, 5, 10, 15] and indptr(3, 5).dtype == torch.int32


def test_e4m3_quantisation_descales_back_within_fp8_precision():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, 4, 16, generator=gen) * torch.tensor([1e-3, 1.0, 30.0, 500.0]).view(1, 1, 4, 1)
    x8, descale = flash_attn.quantize_e4m3(x, dims=(1, 3))  # one descale per (batch, head)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 4) and descale.dtype == torch.float32
    scale = descale[:, None, :, None]
    back = x8.float() * scale
    # Round to nearest with 3 mantissa bits: half an ulp, 2^-4 relative, for normals; below the
    # smallest normal 2^-6 the step is the subnormal 2^-9, so half of it, 2^-10, absolute (OCP FP8 spec).
    assert ((back - x).abs() <= 2**-4 * x.abs() + 2**-10 * scale).all()
    assert x8.float().abs().amax() == flash_attn.E4M3_MAX  # the range is used in full
    zeros8, one = flash_attn.quantize_e4m3(torch.zeros(3, 4), dims=(0, 1))
    assert float(one) == 1.0 and not zeros8.float().any()


def test_fa3_fp8_descales_are_per_batch_and_kv_head():
    q = torch.randn(2, 7, 8, 64)  # BSHD, Hq 8
    k, v = torch.randn(2, 9, 2, 64), torch.randn(2, 9, 2, 64)
    q8, k8, v8, q_d, k_d, v_d = flash_attn.FA3FP8.quantize(q, k, v)
    assert q8.shape == q.shape and k8.shape == k.shape and {t.shape for t in (q_d, k_d, v_d)} == {(2, 2)}
    group = q.unflatten(2, (2, 4))  # query heads 0-3 share K/V head 0
    assert torch.allclose(q_d, group.abs().amax(dim=(1, 3, 4)) / 448)


def test_decode_uses_tensor_cores_above_group_four():
    assert not flashinfer.use_tensor_cores(32, 8) and flashinfer.use_tensor_cores(32, 4)
    assert flashinfer.use_tensor_cores(32, 1) and not flashinfer.use_tensor_cores(8, 8)


# --- stand-ins for the libraries, written from their documented APIs -------------------------

def _reference(q, k, v, causal, scale):
    """BHSD attention in fp64 (the harness's eager path with bottom-right causal)."""
    return eager_attention(q.double(), k.double(), v.double(), causal=causal, scale=scale)


def csr_rows(pages, indptr, indices, lengths):
    """Each request's KV rows read back from pages through a CSR page table, as a kernel reads them:
    request b's pages ``indices[indptr[b]:indptr[b+1]]``, their first ``lengths[b]`` tokens."""
    ptr, idx = indptr.tolist(), indices.long()
    return [pages[idx[ptr[b]:ptr[b + 1]]].flatten(0, 1)[:n] for b, n in enumerate(lengths)]


class FakeFlashInferMLA(types.ModuleType):
    """flashinfer.mla in 0.7.4: ``BatchMLAPagedAttentionWrapper(workspace, ..., backend="auto")``, ``plan(qo_indptr,
    kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale,
    q_data_type, kv_data_type)``, ``run(q_nope, q_pe, ckv_cache, kpe_cache)`` -> (tokens, heads, head_dim_ckv).

    ``run`` attends in fp64 from the tensors it is given alone, the way the kernel reads them: request b's query
    rows ``qo_indptr[b]:qo_indptr[b+1]``, its pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` and their first
    ``kv_len_arr[b]`` tokens, key = [ckv, kpe], value = ckv."""

    def __init__(self, calls):
        super().__init__("flashinfer.mla")
        self.__spec__ = importlib.machinery.ModuleSpec("flashinfer.mla", None)
        self.calls, self.plans, self.runs = calls, [], []

    def BatchMLAPagedAttentionWrapper(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None,
                                      kv_indptr=None, kv_indices=None, kv_len_arr=None, backend="auto"):
        fake = self
        assert float_workspace_buffer.dtype == torch.uint8 and not float_workspace_buffer.any()
        fake.backend = backend

        class Wrapper:
            def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                     page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
                self.args = {k: v for k, v in locals().items() if k != "self"}
                fake.plans.append(self.args)
                fake.calls.append("mla_plan")

            def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, **unused):
                fake.calls.append("mla_run")
                fake.runs.append((q_nope, q_pe, ckv_cache, kpe_cache))
                a = self.args
                heads, d_c, d_r, size = a["num_heads"], a["head_dim_ckv"], a["head_dim_kpe"], a["page_size"]
                assert q_nope.shape[1:] == (heads, d_c) and q_pe.shape[1:] == (heads, d_r)
                assert ckv_cache.shape[1:] == (size, d_c) and kpe_cache.shape[1:] == (size, d_r)
                assert q_nope.dtype == a["q_data_type"] and ckv_cache.dtype == a["kv_data_type"]
                qo, kv, lens = a["qo_indptr"].tolist(), a["kv_indptr"].tolist(), a["kv_len_arr"].tolist()
                assert all(qo[i + 1] - qo[i] == 1 for i in range(len(lens))) or not a["causal"]
                outs = []
                for b, n in enumerate(lens):
                    pages = a["kv_indices"][kv[b]:kv[b + 1]].long()
                    ckv = ckv_cache[pages].reshape(-1, d_c)[:n].double()  # (n, d_c): the latent, also the value
                    key = torch.cat([ckv, kpe_cache[pages].reshape(-1, d_r)[:n].double()], dim=-1)
                    q = torch.cat([q_nope[qo[b]:qo[b + 1]], q_pe[qo[b]:qo[b + 1]]], dim=-1).double()
                    p = (torch.einsum("thd,nd->thn", q, key) * a["sm_scale"]).softmax(-1)
                    outs.append(torch.einsum("thn,nd->thd", p, ckv))
                return torch.cat(outs).to(q_nope.dtype)

        fake.calls.append("mla_init")
        return Wrapper()


class FakeFlashInfer(types.ModuleType):
    """flashinfer 0.7.4's prefill and decode entry points, computed with the harness's eager attention."""

    def __init__(self):
        super().__init__("flashinfer")
        self.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
        self.calls, self.plans = [], []
        self.mla = FakeFlashInferMLA(self.calls)

    def single_prefill_with_kv_cache(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                     custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD",
                                     sm_scale=None, **unused):
        assert kv_layout == "NHD" and q.dim() == 3 and scale_q is None
        self.calls.append("single_prefill")
        out = _reference(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal, sm_scale)
        return out[0].transpose(0, 1).to(q.dtype)

    def BatchPrefillWithRaggedKVCacheWrapper(self, workspace, kv_layout="NHD", **unused):
        fake = self

        class Ragged:
            def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
                     custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
                     use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, **unused):
                self.qo, self.kv, self.causal, self.scale = qo_indptr.tolist(), kv_indptr.tolist(), causal, sm_scale
                fake.plans.append(dict(qo_indptr=self.qo, kv_indptr=self.kv, causal=causal, custom_mask=custom_mask,
                                       pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                       logits_soft_cap=logits_soft_cap))
                fake.calls.append("ragged_plan")

            def run(self, q, k, v):
                fake.calls.append("ragged_run")
                outs = []
                for b in range(len(self.qo) - 1):
                    qs, ks = q[self.qo[b]:self.qo[b + 1]], k[self.kv[b]:self.kv[b + 1]]
                    vs = v[self.kv[b]:self.kv[b + 1]]
                    out = _reference(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
                                     self.causal, self.scale)
                    outs.append(out[0].transpose(0, 1))
                return torch.cat(outs).to(q.dtype)

        return Ragged()

    def BatchDecodeWithPagedKVCacheWrapper(self, workspace, kv_layout="NHD", use_cuda_graph=False,
                                           use_tensor_cores=False, **unused):
        fake = self
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8 and not workspace.any()
        fake.tensor_cores = use_tensor_cores

        class Decode:
            def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                     kv_data_type=None, o_data_type=None, sm_scale=None, **unused):
                self.indptr, self.indices, self.size = indptr, indices, page_size
                self.lens = ((indptr[1:] - indptr[:-1] - 1) * page_size + last_page_len).tolist()
                self.scale, self.kv_dtype = sm_scale, kv_data_type
                self.options = dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                    logits_soft_cap=logits_soft_cap)
                fake.plans.append(self.options)
                fake.calls.append("decode_plan")

            def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, **unused):
                fake.calls.append("decode_run")
                k_pages, v_pages = paged_kv_cache
                assert k_pages.dtype == self.kv_dtype
                ks = csr_rows(k_pages.float() * (k_scale or 1.0), self.indptr, self.indices, self.lens)
                vs = csr_rows(v_pages.float() * (v_scale or 1.0), self.indptr, self.indices, self.lens)
                outs = [_reference(q[b:b + 1, :, None], ks[b].transpose(0, 1)[None], vs[b].transpose(0, 1)[None],
                                   False, self.scale)[:, :, 0] for b in range(len(self.lens))]
                return torch.cat(outs).to(q.dtype)

        return Decode()


@pytest.fixture
def fake_flashinfer(monkeypatch):
    fake = FakeFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", fake.mla)
    monkeypatch.setattr(flashinfer, "WORKSPACE_BYTES", 1 << 20)  # 128 MiB of zeros is slow on CPU
    flashinfer._flashinfer.cache_clear()
    yield fake
    flashinfer._flashinfer.cache_clear()


def _check(backend, c, tol, **attention_kw):
    t = make_tensors(c, "cpu", seed=0)
    ref = _reference(t.q, t.k, t.v, c.causal, c.scale)
    out = backend.attention(t.q, t.k, t.v, causal=c.causal, scale=c.scale, **attention_kw)
    assert out.shape == ref.shape and out.dtype == t.q.dtype
    assert (out.double() - ref).norm() / ref.norm() < tol
    return t


@pytest.mark.parametrize("batch, expected", [(1, ["single_prefill"]), (3, ["ragged_plan", "ragged_run"])])
def test_flashinfer_prefill_wiring(fake_flashinfer, batch, expected):
    backend = get_backend("flashinfer")
    c = case(batch=batch, seq_q=24, seq_kv=40)  # causal with seq_q < seq_kv: bottom-right
    _check(backend, c, 1e-2)
    assert fake_flashinfer.calls == expected
    fake_flashinfer.calls.clear()
    run = backend.build(c, make_tensors(c, "cpu", seed=1))
    assert fake_flashinfer.calls == expected  # planned and run once (JIT) inside build
    run()
    assert fake_flashinfer.calls == expected + expected[-1:]  # the timed call is the kernel call alone


@pytest.mark.parametrize("name, tol", [("flashinfer", 1e-2), ("flashinfer-fp8kv", 8e-2)])
@pytest.mark.parametrize("page_size", [0, 16, 7])
def test_flashinfer_paged_decode_wiring(fake_flashinfer, name, tol, page_size):
    backend = get_backend(name)
    c = case(mode="decode", heads_q=8, heads_kv=2, seq_q=1, seq_kv=45, causal=False, page_size=page_size)
    _check(backend, c, tol, **({"page_size": page_size} if page_size else {}))
    assert fake_flashinfer.calls == ["decode_plan", "decode_run"]
    assert fake_flashinfer.tensor_cores is False  # group 4: CUDA-core decode
    fake_flashinfer.calls.clear()
    run = backend.build(c, make_tensors(c, "cpu", seed=1))
    run()
    assert fake_flashinfer.calls == ["decode_plan", "decode_run", "decode_run"]


@pytest.mark.parametrize("page_size", [0, 16, 7])
def test_flashinfer_mla_build_pages_the_latent_and_plans_outside_the_timed_call(fake_flashinfer, page_size):
    c = mla_case(page_size=page_size)
    t = make_tensors(c, "cpu", seed=1)
    run = get_backend("flashinfer-mla").build(c, t)
    mla = fake_flashinfer.mla
    assert fake_flashinfer.calls == ["mla_init", "mla_plan", "mla_run"] and mla.backend == "auto"
    run()
    assert fake_flashinfer.calls == ["mla_init", "mla_plan", "mla_run", "mla_run"]  # the timed call is run() alone
    size = page_size or flashinfer.DEFAULT_PAGE_SIZE
    pages = -(-45 // size)
    plan = mla.plans[0]
    assert plan["qo_indptr"].tolist() == [0, 1, 2]  # one query token per request
    # pages from a shuffled free list: every page of the pool once, not in order
    assert plan["kv_indptr"].tolist() == [0, pages, 2 * pages]
    assert sorted(plan["kv_indices"].tolist()) == list(range(2 * pages))
    assert plan["kv_len_arr"].tolist() == [45, 45]
    assert all(plan[k].dtype == torch.int32 for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"))
    assert (plan["num_heads"], plan["head_dim_ckv"], plan["head_dim_kpe"], plan["page_size"]) == (16, 512, 64, size)
    assert plan["causal"] is False and plan["sm_scale"] == c.scale == 576 ** -0.5  # the harness reference's scale
    assert plan["q_data_type"] == plan["kv_data_type"] == torch.bfloat16
    q_nope, q_pe, ckv, kpe = mla.runs[-1]
    assert torch.equal(q_nope, t.q[:, :, 0, :512]) and torch.equal(q_pe, t.q[:, :, 0, 512:])
    assert ckv.shape == (2 * pages, size, 512) and kpe.shape == (2 * pages, size, 64)
    assert all(x.is_contiguous() for x in (q_nope, q_pe, ckv, kpe))
    for b, rows in enumerate(csr_rows(ckv, plan["kv_indptr"], plan["kv_indices"], [45, 45])):
        assert torch.equal(rows, t.k[b, 0, :, :512])  # (Skv, d_c)
    for b, rows in enumerate(csr_rows(kpe, plan["kv_indptr"], plan["kv_indices"], [45, 45])):
        assert torch.equal(rows, t.k[b, 0, :, 512:])
    last = plan["kv_indices"][pages - 1].item()  # request 0's last page
    assert not ckv[last, 45 - (pages - 1) * size:].any()  # its padding is zero


@pytest.mark.parametrize("page_size", [0, 16, 7])
def test_flashinfer_mla_output_matches_the_harness_fp64_reference(fake_flashinfer, page_size):
    backend, c = get_backend("flashinfer-mla"), mla_case(page_size=page_size)
    paged = {"page_size": page_size} if page_size else {}
    t = make_tensors(c, "cpu", seed=2)
    out = backend.attention(t.q, t.k, t.v, causal=False, scale=c.scale, **paged)
    assert out.shape == (2, 16, 1, 512) and out.dtype == torch.bfloat16
    result = check_numerics(c, lambda q, k, v: backend.attention(q, k, v, causal=c.causal, scale=c.scale, **paged),
                            "cpu", seed=3)
    assert 0 < result.out.rel_err < 1e-2 and result.worst_ratio_vs_eager() <= 2.0


def test_flashinfer_mla_refuses_a_value_that_is_not_the_latent(fake_flashinfer):
    c = mla_case()
    t = make_tensors(c, "cpu", seed=4)
    with pytest.raises(ValueError, match=r"v must equal k\[\.\.\., :512\]"):
        get_backend("flashinfer-mla").attention(t.q, t.k, t.v + 1, causal=False, scale=c.scale)


def test_flashinfer_mla_available_needs_sm80_and_the_mla_wrapper(fake_flashinfer, monkeypatch):
    backend = get_backend("flashinfer-mla")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert safe_available(backend) == (True, "")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert safe_available(backend) == (False, "flashinfer-mla here needs compute capability >= 8.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setitem(sys.modules, "flashinfer.mla", None)  # an install without the MLA module
    ok, reason = safe_available(backend)
    assert not ok and reason.startswith("flashinfer.mla.BatchMLAPagedAttentionWrapper is missing")
    assert reason.endswith("install: pip install flashinfer-python")


def test_flashinfer_mla_rows_count_the_latent_once_by_hand():
    # the hbm `mla` case: B16 H16 Skv 4096, d_c 512 + d_h^R 64, bf16; the ledger's absorbed formula,
    # (d_c + d_h^R) * 2 = 1152 bytes per token per layer, read once
    c = mla_case(batch=16, seq_kv=4096)
    latent = 16 * 4096 * 1152  # 75,497,472
    q, o, lse = 16 * 16 * 576 * 2, 16 * 16 * 512 * 2, 16 * 16 * 4  # 294,912 + 262,144 + 1,024
    assert base_row(c, get_backend("flashinfer-mla"), "cpu", None)["bytes_model"] == latent + q + o + lse == 76_055_552
    table = 4 * (17 + 16 * 256 + 16)  # kv_indptr, kv_indices (256 pages each), kv_len_arr: int32
    paged = mla_case(batch=16, seq_kv=4096, page_size=16)
    assert base_row(paged, get_backend("flashinfer-mla"), "cpu", None)["bytes_model"] == 76_055_552 + table


class FakeFlashAttnCute(types.ModuleType):
    """flash_attn.cute.flash_attn_func as in 4.0.0b36: qv and gather_kv_indices precede softmax_scale."""

    def __init__(self):
        super().__init__("flash_attn.cute")
        self.__spec__ = importlib.machinery.ModuleSpec("flash_attn.cute", None)

    @staticmethod
    def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                        window_size=(None, None), learnable_sink=None, softcap=0.0, **unused):
        assert q.dim() == 4 and q.is_contiguous() and qv is None
        outs = [FakeFlashAttnCute._attend(q[b], k[b], v[b], softmax_scale, causal, window_size, softcap)
                for b in range(q.shape[0])]
        return torch.stack(outs), None

    @staticmethod
    def _attend(qb, kb, vb, softmax_scale, causal, window_size, softcap):
        """One sequence, (S, H, D) each: causal bottom-right, window (left, right), softcap on the scaled scores."""
        group = qb.shape[1] // kb.shape[1]
        kk, vv = (x.repeat_interleave(group, dim=1).float() for x in (kb, vb))
        scores = torch.einsum("shd,thd->hst", qb.float(), kk) * softmax_scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        sq, skv = qb.shape[0], kb.shape[0]
        p = torch.arange(sq)[:, None] + skv - sq
        j = torch.arange(skv)[None, :]
        keep = torch.ones(sq, skv, dtype=torch.bool)
        if causal:
            keep &= j <= p
        left, right = window_size
        if left is not None:
            keep &= j >= p - left
        if right is not None:
            keep &= j <= p + right
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.einsum("hst,thd->shd", scores.softmax(-1), vv).to(qb.dtype)

    @staticmethod
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                               seqused_q=None, seqused_k=None, page_table=None, softmax_scale=None, causal=False,
                               window_size=(None, None), learnable_sink=None, softcap=0.0, **unused):
        """Varlen (q (total, H, D) with cu_seqlens) or paged (q (B, Sq, H, D), k/v pages with page_table and
        seqused_k); causal bottom-right per sequence, window (left, right), softcap on the scaled scores."""
        if page_table is not None:
            assert cu_seqlens_k is None and page_table.dtype == torch.int32 and seqused_k.dtype == torch.int32
            size = k.shape[1]
            qs = [q[b] for b in range(q.shape[0])]
            ks = [k[page_table[b]].flatten(0, 1)[:n] for b, n in enumerate(seqused_k.tolist())]
            vs = [v[page_table[b]].flatten(0, 1)[:n] for b, n in enumerate(seqused_k.tolist())]
            assert all(n <= page_table.shape[1] * size for n in seqused_k.tolist())
        else:
            assert cu_seqlens_q.dtype == torch.int32 and q.dim() == 3 and q.is_contiguous()
            cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
            assert max_seqlen_q == max(b - a for a, b in zip(cq, cq[1:]))
            qs = [q[a:b] for a, b in zip(cq, cq[1:])]
            ks, vs = [k[a:b] for a, b in zip(ck, ck[1:])], [v[a:b] for a, b in zip(ck, ck[1:])]
        outs = [FakeFlashAttnCute._attend(qb, kb, vb, softmax_scale, causal, window_size, softcap)
                for qb, kb, vb in zip(qs, ks, vs)]
        out = torch.stack(outs) if page_table is not None else torch.cat(outs)
        return out, None


def test_fa4_wiring_forward_and_backward(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", FakeFlashAttnCute())
    flash_attn._import.cache_clear()
    try:
        backend = get_backend("fa4")
        _check(backend, case(seq_q=24, seq_kv=40), 1e-2)
        c = case(mode="fwd_bwd")
        t = make_tensors(c, "cpu", seed=2)
        dq, dk, dv = backend.build(c, t)()  # BSHD gradients of the BSHD leaves
        assert dq.shape == (2, 40, 4, 64) and dk.shape == (2, 40, 2, 64) and dv.shape == dk.shape
        q, k, v = (x.detach().requires_grad_() for x in (t.q, t.k, t.v))
        ref = torch.autograd.grad(eager_attention(q, k, v, causal=True, scale=c.scale), (q, k, v), t.dout)
        for got, want in zip((dq, dk, dv), ref):
            torch.testing.assert_close(flash_attn.from_bshd(got), want, rtol=5e-2, atol=5e-2)
    finally:
        flash_attn._import.cache_clear()


@pytest.fixture
def fake_fa4(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", FakeFlashAttnCute())
    flash_attn._import.cache_clear()
    yield get_backend("fa4")
    flash_attn._import.cache_clear()


FA4_CASES = {
    "ragged prefill": dict(layout="gqa", heads_q=4, head_dim=64, gqa_group=2, causal=True, dtype="bf16",
                           workload={"distribution": "uniform", "min_len": 5, "max_len": 40, "token_budget": 90,
                                     "batches": 1}),
    "chunked": dict(layout="mha", heads_q=2, head_dim=64, causal=True, dtype="bf16",
                    workload={"distribution": "uniform", "min_len": 30, "max_len": 60, "token_budget": 64,
                              "chunk": 24, "batches": 2}),
    "paged decode": dict(mode="decode", layout="gqa", heads_q=4, gqa_group=2, head_dim=64, dtype="bf16",
                         page_size=16, workload={"distribution": "lognormal", "median_len": 40, "sigma": 0.5,
                                                 "requests": 3, "batches": 1}),
    "dense paged decode": dict(mode="decode", layout="gqa", heads_q=4, gqa_group=2, head_dim=64, dtype="bf16",
                               page_size=16, batch=2, seq=45),
    "sliding window": dict(layout="gqa", heads_q=4, gqa_group=2, head_dim=64, dtype="bf16", causal=True, seq=40,
                           batch=2, variant="sliding_window", window=7),
    "softcap": dict(layout="gqa", heads_q=4, gqa_group=2, head_dim=64, dtype="bf16", seq=40, batch=2,
                    variant="softcap", softcap=2.0),
    "documents": dict(layout="gqa", heads_q=4, gqa_group=2, head_dim=64, dtype="bf16", causal=True, seq=40,
                      batch=2, variant="document", doc_len=15),
}


@pytest.mark.parametrize("name", list(FA4_CASES))
def test_fa4_ragged_paged_and_variant_wiring_matches_fp64(fake_fa4, name):
    from attnbench.bench.numerics import check_built
    from attnbench.workloads.grid import expand_grid

    c = expand_grid({"mode": "fwd", **FA4_CASES[name]})[-1]
    ok, reason = fake_fa4.supports(c)
    assert ok, reason
    result = check_built(c, fake_fa4, "cpu", seed=3)
    assert 0 < result.out.rel_err < 1e-2 and result.worst_ratio_vs_eager() <= 2.0


def test_flashinfer_ragged_prefill_plans_the_real_indptr(fake_flashinfer):
    from attnbench.bench.numerics import check_built
    from attnbench.workloads.grid import expand_grid

    c = expand_grid({"mode": "fwd", "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 64, "causal": True,
                     "dtype": "bf16", "workload": {"distribution": "uniform", "min_len": 20, "max_len": 60,
                                                   "token_budget": 96, "chunk": 32, "batches": 2}})[-1]
    result = check_built(c, get_backend("flashinfer"), "cpu", seed=1)
    assert result.out.rel_err < 1e-2 and result.worst_ratio_vs_eager() <= 2.0
    plan = fake_flashinfer.plans[-1]
    assert plan["qo_indptr"] == [0, *torch.tensor(c.lens_q).cumsum(0).tolist()]
    assert plan["kv_indptr"] == [0, *torch.tensor(c.lens_kv).cumsum(0).tolist()] and plan["causal"] is True


@pytest.mark.parametrize("variant, plan_keys", [
    (dict(variant="sliding_window", window=7), {"window_left": 7}),
    (dict(variant="softcap", softcap=30.0), {"logits_soft_cap": 30.0}),
    (dict(variant="alibi"), {"pos_encoding_mode": "ALIBI"}),
])
def test_flashinfer_variants_go_through_plan(fake_flashinfer, variant, plan_keys):
    for mode, seq_q in (("fwd", 40), ("decode", 1)):
        c = case(mode=mode, seq_q=seq_q, seq_kv=40, causal=mode == "fwd", **variant)
        get_backend("flashinfer").build(c, make_tensors(c, "cpu", seed=0))
        plan = fake_flashinfer.plans[-1]
        assert {k: plan[k] for k in plan_keys} == plan_keys


def test_flashinfer_prefix_lm_passes_the_flattened_custom_mask(fake_flashinfer):
    c = case(seq_q=12, seq_kv=12, variant="prefix_lm", prefix_len=5)
    get_backend("flashinfer").build(c, make_tensors(c, "cpu", seed=0))
    mask = fake_flashinfer.plans[-1]["custom_mask"]
    assert mask.dtype == torch.bool and mask.shape == (2 * 12 * 12,)  # each request's (q, kv) mask, row-major
    first = mask[:144].view(12, 12)
    assert first[0, 4] and not first[0, 5] and first[11].all() and first[6, 6] and not first[6, 7]
