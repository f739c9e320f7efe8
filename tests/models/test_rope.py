"""RoPE scalings against their published formulas on hand-computed values, and against
Hugging Face transformers' ``modeling_rope_utils`` when transformers is importable."""
from __future__ import annotations

import inspect
import math

import pytest
import torch

from attnbench.models.rope import (RopeConfig, RopeConfigError, apply_rope, rope_cos_sin,
                                   rope_frequencies, yarn_correction_range)


def _freqs(rotary_dim=4, seq_len=None, **kw):
    inv, att = rope_frequencies(RopeConfig(**kw), rotary_dim, seq_len)
    return inv.double().tolist(), att


# ---- hand-computed values: D=4, b=100 gives theta = [1, 100^(-1/2)] = [1, 0.1] -------------------------------

def test_none_is_roformer_theta():
    inv, att = _freqs(method="none", base=100.0)
    assert inv == pytest.approx([1.0, 0.1], rel=1e-7) and att == 1.0


def test_linear_divides_by_factor():  # PI: m -> m/s
    inv, att = _freqs(method="linear", base=100.0, factor=4.0)
    assert inv == pytest.approx([0.25, 0.025], rel=1e-7) and att == 1.0


def test_ntk_changes_base():  # b' = 100 * 4^(4/2) = 1600 -> [1, 1/40]
    inv, att = _freqs(method="ntk", base=100.0, factor=4.0)
    assert inv == pytest.approx([1.0, 1 / 40], rel=1e-7) and att == 1.0


def test_dynamic_ntk_follows_length():
    # factor 1: s_dyn = max(1, S/L); S=64, L=16 -> s=4 -> b'=1600
    assert _freqs(method="dynamic_ntk", base=100.0, original_max_len=16, seq_len=64)[0] == pytest.approx([1, 1 / 40])
    # at or below L, and with no length given, the base is unchanged
    for seq_len in (None, 8, 16):
        assert _freqs(method="dynamic_ntk", base=100.0, original_max_len=16, seq_len=seq_len)[0] == pytest.approx([1, .1])
    # factor 2, S=32, L=16: alpha = 2*32/16 - 1 = 3 -> b' = 100 * 3^2 = 900 -> [1, 1/30]
    inv, _ = _freqs(method="dynamic_ntk", base=100.0, factor=2.0, original_max_len=16, seq_len=32)
    assert inv == pytest.approx([1.0, 1 / 30], rel=1e-7)


def test_yarn_ramp_and_temperature():
    # D=8, b=1e4: theta = [1, .1, .01, .001]; d(n) = 8 ln(L/(2 pi n)) / (2 ln 1e4) = log10(L / (2 pi n))
    # L=2048: d(32) = log10(10.19) = 1.008 -> floor 1; d(1) = log10(325.9) = 2.513 -> ceil 3
    cfg = RopeConfig(method="yarn", factor=4.0, original_max_len=2048)
    assert yarn_correction_range(cfg, 8) == (1, 3)
    inv, att = rope_frequencies(cfg, 8)
    ramp = [0.0, 0.0, 0.5, 1.0]  # clamp((i - 1) / 2, 0, 1)
    want = [(1 - r) * t + r * t / 4 for r, t in zip(ramp, [1, .1, .01, .001])]  # [1, .1, .00625, .00025]
    assert inv.double().tolist() == pytest.approx(want, rel=1e-6)
    assert att == pytest.approx(0.1 * math.log(4) + 1)  # 1.1386
    assert rope_frequencies(RopeConfig(method="yarn", factor=4.0, attention_factor=1.0), 8)[1] == 1.0
    assert rope_frequencies(RopeConfig(method="yarn", factor=1.0), 8)[1] == 1.0


def test_llama3_bands():
    # D=8, b=1e4, L=2048, s=8: wavelengths 2 pi [1, 10, 100, 1000]; keep below 2048/4=512, divide above 2048/1
    inv, att = _freqs(rotary_dim=8, method="llama3", factor=8.0, original_max_len=2048)
    g = (2048 / (2 * math.pi * 100) - 1) / (4 - 1)  # the one pair in the band (wavelength 628)
    want = [1.0, 0.1, (1 - g) * 0.01 / 8 + g * 0.01, 0.001 / 8]
    assert inv == pytest.approx(want, rel=1e-6) and att == 1.0


def test_cos_sin_tables_carry_attention_factor():
    cos, sin = rope_cos_sin(torch.tensor([1.0, 0.1]), torch.arange(3), 1.5, torch.float64)
    assert cos.shape == sin.shape == (3, 4)
    assert cos[2].tolist() == pytest.approx([1.5 * math.cos(2), 1.5 * math.cos(.2)] * 2, rel=1e-7)
    assert sin[1].tolist() == pytest.approx([1.5 * math.sin(1), 1.5 * math.sin(.1)] * 2, rel=1e-7)


def test_apply_rope_rotates_pairs_and_depends_on_offset_only():
    inv, att = rope_frequencies(RopeConfig(method="yarn", factor=2.0, original_max_len=64), 8)
    cos, sin = rope_cos_sin(inv, torch.arange(40), 1.0, torch.float64)
    # a unit vector on pair 0 (components 0 and D/2) at position m becomes (cos m, sin m)
    x = torch.zeros(1, 1, 40, 8, dtype=torch.float64)
    x[..., 0] = 1
    y = apply_rope(x, cos, sin)
    assert y[0, 0, 5, 0].item() == pytest.approx(math.cos(5)) and y[0, 0, 5, 4].item() == pytest.approx(math.sin(5))
    # <R_m q, R_n k> depends on m - n only
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    qs = apply_rope(q.expand(1, 1, 40, 8), cos, sin)[0, 0]
    ks = apply_rope(k.expand(1, 1, 40, 8), cos, sin)[0, 0]
    assert (qs[10] @ ks[7]).item() == pytest.approx((qs[33] @ ks[30]).item(), rel=1e-9)
    # partial rotary: dims past rotary_dim pass through unchanged
    x = torch.randn(2, 3, 40, 12, generator=g, dtype=torch.float64)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[..., 8:], x[..., 8:]) and torch.allclose(out[..., :8], apply_rope(x[..., :8], cos, sin))


def test_long_positions_keep_phase():
    inv = torch.tensor([1.0])
    cos, _ = rope_cos_sin(inv, torch.tensor([131071]), 1.0, torch.float32)
    assert cos[0, 0].item() == pytest.approx(math.cos(131071), abs=1e-6)


# ---- bad input: one line naming the key --------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, key", [
    ({"method": "rope2"}, "rope.method"), ({"method": "linear", "factor": 0.5}, "rope.factor"),
    ({"method": "none", "factor": 2.0}, "rope.factor"), ({"base": 0.5}, "rope.base"),
    ({"original_max_len": 0}, "rope.original_max_len"), ({"beta_fast": 1.0, "beta_slow": 2.0}, "rope.beta_fast"),
    ({"low_freq_factor": 4.0, "high_freq_factor": 1.0}, "rope.high_freq_factor"),
])
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(RopeConfigError) as err:
        RopeConfig(**kwargs)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_unknown_method_lists_allowed():
    with pytest.raises(RopeConfigError, match="allowed: none, linear, ntk, dynamic_ntk, yarn, llama3"):
        RopeConfig(method="pi")


def test_from_dict_and_model_length():
    assert RopeConfig.from_dict({"method": "linear", "factor": 2}).factor == 2
    with pytest.raises(RopeConfigError, match="unknown key 'scale'"):
        RopeConfig.from_dict({"scale": 2})
    with pytest.raises(RopeConfigError, match="rope.original_max_len=4096 is larger than the model's length 1024"):
        RopeConfig(method="linear", factor=2, original_max_len=4096).check_model_len(1024)
    RopeConfig(original_max_len=1024).check_model_len(1024)


def test_rotary_dim_must_be_even():
    with pytest.raises(RopeConfigError, match="rotary_dim"):
        rope_frequencies(RopeConfig(), 7)


# ---- Hugging Face transformers (skipped when not installed) ------------------------------------------------

HF_TYPE = {"none": "default", "linear": "linear", "dynamic_ntk": "dynamic", "yarn": "yarn", "llama3": "llama3"}


def _hf_config(cfg: RopeConfig, head_dim: int):
    from transformers import LlamaConfig

    params = {"rope_type": HF_TYPE[cfg.method], "factor": cfg.factor, "original_max_position_embeddings":
              cfg.original_max_len, "beta_fast": cfg.beta_fast, "beta_slow": cfg.beta_slow,
              "low_freq_factor": cfg.low_freq_factor, "high_freq_factor": cfg.high_freq_factor}
    common = {"hidden_size": head_dim * 4, "num_attention_heads": 4, "head_dim": head_dim,
              "max_position_embeddings": cfg.original_max_len}
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:  # transformers >= 5
        return LlamaConfig(rope_parameters={**params, "rope_theta": cfg.base}, **common)
    return LlamaConfig(rope_theta=cfg.base, rope_scaling=params, **common)


@pytest.mark.parametrize("method", ["linear", "dynamic_ntk", "yarn", "llama3"])
@pytest.mark.parametrize("head_dim, base, factor, orig", [(64, 10000.0, 4.0, 256), (128, 500000.0, 8.0, 8192),
                                                         (32, 10000.0, 2.5, 512)])
def test_matches_transformers(method, head_dim, base, factor, orig):
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = RopeConfig(method=method, base=base, factor=factor, original_max_len=orig)
    for seq_len in ([None, orig // 2, orig * 3] if method == "dynamic_ntk" else [None]):
        want_inv, want_att = ROPE_INIT_FUNCTIONS[HF_TYPE[method]](_hf_config(cfg, head_dim), "cpu", seq_len)
        inv, att = rope_frequencies(cfg, head_dim, seq_len)
        torch.testing.assert_close(inv, want_inv.float(), rtol=2e-6, atol=0)
        assert att == pytest.approx(want_att, rel=1e-12)


def test_apply_matches_transformers_llama():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv, att = rope_frequencies(RopeConfig(method="yarn", factor=4.0, original_max_len=128), 32)
    cos, sin = rope_cos_sin(inv, torch.arange(300), att, torch.float32)
    q, k = torch.randn(2, 3, 300, 32), torch.randn(2, 1, 300, 32)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    torch.testing.assert_close(apply_rope(q, cos, sin), want_q)
    torch.testing.assert_close(apply_rope(k, cos, sin), want_k)
