"""The tiny GPT: shapes per layout, the MLA cache ledger, parameter matching, backends agreeing on the loss, the
SwiGLU MLP and Smooth-SwiGLU."""
import dataclasses

import pytest
import torch

from attnbench.errors import ConfigError
from attnbench.kernels.registry import all_backends, safe_available
from attnbench.models.gpt import GPT, GPTConfig, SwiGLU, count_params, match_params, smooth_scales
from attnbench.train.attention_backend import BackendUnsupported, check_backend, fastest_backend
from attnbench.train.loop import lm_loss

LAYOUTS = {
    "mha": {},
    "gqa": {"n_kv_heads": 2},
    "mqa": {},
    "mla": {},
    "mla-lowrank-q": {"layout": "mla", "q_lora_rank": 16, "qk_norm": True},
}


def _cfg(name: str, **kw) -> GPTConfig:
    over = dict(LAYOUTS[name])
    layout = over.pop("layout", name)
    return GPTConfig(layout=layout, d_model=32, n_heads=4, max_seq_len=32, **{**over, **kw})


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_forward_backward_shapes_for_every_layout(name):
    torch.manual_seed(0)
    model = GPT(_cfg(name))
    idx = torch.randint(0, 256, (2, 24))
    logits = model(idx)
    assert logits.shape == (2, 24, 256)
    lm_loss(logits, idx)[0].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.num_params() == count_params(model.cfg)
    logits_max = model.max_attention_logits(idx)
    assert len(logits_max) == model.cfg.n_layers and all(v == v for v in logits_max)


def test_max_logit_probe_is_the_largest_causal_score_over_query_blocks(monkeypatch):
    from attnbench.models import attention

    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 40, 8), torch.randn(2, 2, 40, 8)  # GQA: each K head serves two query heads
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-2, -1) * 0.5
    expected = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf")).max()
    monkeypatch.setattr(attention, "LOGIT_BLOCK_ELEMENTS", 2 * 4 * 40 * 7)  # blocks of 7 query rows
    assert attention.causal_max_logit(q, k, 0.5).item() == pytest.approx(expected.item())


@pytest.mark.parametrize("name", ["mha", "mla"])
def test_max_logit_probe_waits_for_the_device_once(name, monkeypatch):
    """The probe reads its per-layer maxima from the device in one transfer and copies nothing to it."""
    model, idx, reads = GPT(_cfg(name)), torch.randint(0, 256, (2, 24)), []
    for attr in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, attr)
        monkeypatch.setattr(torch.Tensor, attr, lambda self, *a, _name=attr, _original=original, **k: (
            reads.append(_name), _original(self, *a, **k))[1])
    monkeypatch.setattr(torch, "tensor", lambda *a, _original=torch.tensor, **k: (
        reads.append("tensor"), _original(*a, **k))[1])
    values = model.max_attention_logits(idx)
    monkeypatch.undo()
    assert reads == ["tolist"] and len(values) == model.cfg.n_layers


def test_attention_shapes_per_layout():
    x = torch.randn(2, 10, 32)
    for name, kv_heads, dqk, dv in (("mha", 4, 8, 8), ("gqa", 2, 8, 8), ("mqa", 1, 8, 8), ("mla", 4, 24, 16)):
        model = GPT(_cfg(name))
        attn = model.blocks[0].attn
        cos, sin = model.rope_tables(10)
        q, k, v = attn.qkv(x, cos, sin)
        assert q.shape == (2, 4, 10, dqk) and k.shape == (2, kv_heads, 10, dqk) and v.shape == (2, kv_heads, 10, dv)
        assert attn(x, cos, sin).shape == x.shape


def test_mla_cache_bytes_per_token_match_the_formula():
    """DeepSeek-V2 Table 1: MLA caches d_c + d_h^R elements per token per layer; MHA/GQA/MQA 2 * n_kv * d_h."""
    cfg = _cfg("mla", kv_lora_rank=20, qk_rope_head_dim=6, n_layers=3)
    model = GPT(cfg)
    x = torch.randn(2, 12, 32)
    cos, sin = model.rope_tables(12)
    attn = model.blocks[0].attn
    cache = attn.kv_cache(x, cos, sin)
    per_token = sum(t[0, 0].numel() if t.dim() == 3 else t[0, :, 0].numel() for t in cache)
    assert per_token == cfg.kv_lora_rank + cfg.qk_rope_head_dim == attn.cache_elements_per_token == 26
    assert model.kv_cache_elements_per_token() == 3 * 26
    # the cache is sufficient: keys and values rebuilt from it equal those the attention used
    c_kv, k_pe = cache
    k_nope, v = attn.expand(c_kv)
    k = torch.cat((k_nope, k_pe[:, None].expand(-1, cfg.n_heads, -1, -1)), dim=-1)
    _, k_ref, v_ref = attn.qkv(x, cos, sin)
    torch.testing.assert_close(k, k_ref)
    torch.testing.assert_close(v, v_ref)
    assert attn.scale == pytest.approx((cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5)
    for name, elements in (("mha", 2 * 4 * 8), ("gqa", 2 * 2 * 8), ("mqa", 2 * 1 * 8)):
        gqa = GPT(_cfg(name)).blocks[0].attn
        k_c, v_c = gqa.kv_cache(x, cos, sin)
        assert k_c[0, :, 0].numel() + v_c[0, :, 0].numel() == gqa.cache_elements_per_token == elements


def test_match_params_brings_every_layout_within_one_mlp_unit():
    ref = _cfg("mha")
    target = count_params(ref)
    for name in ("gqa", "mqa", "mla"):
        matched = match_params(_cfg(name), target)
        assert abs(count_params(matched) - target) <= matched.d_model * matched.n_layers  # half a d_ff unit
        assert matched.d_ff != ref.ffn_dim


def test_swiglu_width_and_parameter_matching():
    gelu, swiglu = _cfg("mha"), _cfg("mha", mlp="swiglu")
    assert swiglu.ffn_dim == 96 and GPTConfig(d_model=384, mlp="swiglu").ffn_dim == 1024  # 8/3 d, up to 16
    assert isinstance(GPT(swiglu).blocks[0].mlp, SwiGLU)
    matched = match_params(swiglu, count_params(gelu))
    assert abs(count_params(matched) - count_params(gelu)) <= 1.5 * swiglu.d_model * swiglu.n_layers


def test_smooth_scales_are_powers_of_two_that_bring_each_channel_max_into_half_to_one():
    h = torch.tensor([[3.0, -0.01, 0.0, 4.0], [1.0, 0.005, 0.0, -0.5]])
    s = smooth_scales(h)
    assert s.tolist() == [0.25, 64.0, 1.0, 0.25]  # 2^-ceil(log2 max|h_i|); an all-zero channel keeps 1
    scaled = (h * s).abs().amax(dim=0)
    assert ((scaled > 0.5) & (scaled <= 1) | (scaled == 0)).all()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_smooth_swiglu_is_the_same_function_bit_for_bit_outside_fp8(autocast):
    torch.manual_seed(0)
    plain = GPT(_cfg("mha", mlp="swiglu"))
    smooth = GPT(_cfg("mha", mlp="swiglu", smooth_swiglu=True))
    smooth.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 256, (2, 32))
    out = {}
    for name, model in (("plain", plain), ("smooth", smooth)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = lm_loss(model(idx), idx)[0]
        loss.backward()
        out[name] = (loss.detach(), [p.grad.clone() for p in model.parameters()])
    assert torch.equal(out["plain"][0], out["smooth"][0])
    assert all(torch.equal(a, b) for a, b in zip(out["plain"][1], out["smooth"][1]))


def test_an_fp8_cast_sees_the_smoothed_swiglu_output():
    from attnbench.train.precision import Fp8StatsRecorder

    torch.manual_seed(0)
    seen = {}
    for smooth in (False, True):
        model = GPT(_cfg("mha", mlp="swiglu", smooth_swiglu=smooth))
        torch.nn.init.normal_(model.blocks[0].mlp.fc.weight, std=2.0)  # a large linear branch
        rec = Fp8StatsRecorder(model, ("tensorwise",))
        with rec.recording():
            model(torch.randint(0, 256, (2, 32))).float().mean().backward()
        layer = {r["layer"]: r for r in rec.layer_rows(0) if r["kind"] == "act"}
        seen[smooth] = layer["blocks.0.mlp.proj"]["amax"]
    assert seen[False] > 1 and 0.5 < seen[True] <= 1  # the down projection's input: its channel maxima at most 1


def test_model_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="model.mlp='relu' is not allowed; allowed: gelu, swiglu"):
        GPTConfig(mlp="relu")
    with pytest.raises(ConfigError, match="model.smooth_swiglu=true needs model.mlp: swiglu"):
        GPTConfig(smooth_swiglu=True)
    with pytest.raises(ConfigError, match="model.layout='mha2'.*allowed: mha, gqa, mqa, mla"):
        GPTConfig(layout="mha2")
    with pytest.raises(ConfigError, match="model.n_kv_heads=3.*allowed: 1, 2, 4"):
        GPTConfig(layout="gqa", n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="unknown key 'heads'"):
        GPTConfig.from_dict({"heads": 4})
    with pytest.raises(ConfigError, match="rope.method"):
        GPTConfig.from_dict({"rope": {"method": "bogus"}})


def _trainable_backends(case) -> list[str]:
    names = []
    for name, backend in all_backends().items():
        if backend.compute_dtype or not safe_available(backend)[0]:
            continue  # fp8-computing backends are not held to fp32 agreement
        try:
            check_backend(name, case, "cpu", torch.float32)
        except BackendUnsupported:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("name", ["mha", "gqa", "mla"])
def test_backends_give_the_same_loss_and_gradients_on_a_tiny_batch(name):
    torch.manual_seed(0)
    base = GPT(_cfg(name, backend="sdpa-math"))
    idx = torch.randint(0, 256, (2, 16))
    case = base.blocks[0].attn.case(2, 16, "fp32")
    names = _trainable_backends(case)
    assert {"sdpa-math", "eager"} <= set(names)
    results = {}
    for backend in names:
        model = GPT(dataclasses.replace(base.cfg, backend=backend))
        model.load_state_dict(base.state_dict())
        loss = lm_loss(model(idx), idx)[0]
        loss.backward()
        results[backend] = (loss.item(), model.wte.weight.grad.clone())
    ref_loss, ref_grad = results["sdpa-math"]
    for backend, (loss, grad) in results.items():
        assert loss == pytest.approx(ref_loss, rel=1e-5), backend
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6, msg=backend)


def test_flex_cannot_train_on_cpu_and_says_so():
    case = GPT(_cfg("mha")).blocks[0].attn.case(1, 16, "fp32")
    if torch.cuda.is_available():
        pytest.skip("flex trains on CUDA")
    with pytest.raises(BackendUnsupported, match="flex cannot train .*backward on CPU"):
        check_backend("flex", case, "cpu", torch.float32)


def test_fastest_backend_times_only_backends_that_pass():
    case = GPT(_cfg("mla")).blocks[0].attn.case(1, 16, "fp32")
    name, times = fastest_backend(case, "cpu", torch.float32, ["sdpa-math", "eager", "sdpa-flash"], reps=2)
    assert name in times and "sdpa-flash" not in times  # CPU flash wants equal q/k/v head dims (naive MLA has not)
    assert times[name] == min(times.values())
