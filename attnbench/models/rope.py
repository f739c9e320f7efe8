"""Rotary position embeddings (RoPE) and the context-extension scalings built on it.

Every method is expressed the same way, as ``(inv_freq, attention_factor)``:
``inv_freq`` (rotary_dim // 2,) are the per-pair angular frequencies, and
``attention_factor`` multiplies both cos and sin (so q and k each carry it, and the
softmax logits carry its square). Positions are never rescaled anywhere else, so
a method changes exactly these two things and nothing in the model.

Notation: D = rotary dim, b = base, L = ``original_max_len`` (the pretraining
length), s = ``factor``; pair i has theta_i = b^(-2i/D) and wavelength 2 pi / theta_i.

- none: theta_i = b^(-2i/D) (Su et al. 2021, RoFormer, eq. 34).
- linear: Position Interpolation, m -> m / s, i.e. theta_i / s (Chen et al. 2023, eq. 4).
- ntk: NTK-aware base change b' = b * s^(D/(D-2)) (bloc97, 2023; YaRN paper section 3.1, eq. 14-16).
- dynamic_ntk: the NTK base change recomputed per forward from the current length
  S: b' = b * (s * S / L - (s - 1))^(D/(D-2)) with S clamped to >= L; with s = 1 this
  is s_dyn = max(1, S / L) (emozilla 2023; YaRN paper section 3.3; the same expression as
  Hugging Face ``_compute_dynamic_ntk_parameters``).
- yarn: "NTK-by-parts" ramp plus attention temperature (Peng et al. 2023, section 3.2-3.4):
  the pair index where the number of rotations over L equals n is
  d(n) = D ln(L / (2 pi n)) / (2 ln b) (eq. 17 inverted); with lo = floor(d(beta_fast)),
  hi = ceil(d(beta_slow)) and ramp_i = clamp((i - lo) / (hi - lo), 0, 1),
  theta'_i = (1 - ramp_i) theta_i + ramp_i theta_i / s; attention_factor
  sqrt(1/t) = 0.1 ln s + 1 (eq. 22), applied to q and k (1 when s = 1).
- llama3: Llama 3.1's frequency-band rule (Meta, Llama 3.1 reference code
  ``apply_scaling``): with wavelengths lambda_i, lambda_i < L / high_freq_factor kept,
  lambda_i > L / low_freq_factor divided by s, between them
  (1 - g) theta_i / s + g theta_i with g = (L / lambda_i - low_freq_factor) /
  (high_freq_factor - low_freq_factor); no temperature.

Cross-checked against Hugging Face ``transformers/modeling_rope_utils.py``
(tests/test_rope.py, when transformers is importable).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from attnbench.errors import reject_unknown_keys

METHODS = ("none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3")


class RopeConfigError(ValueError):
    """A RoPE setting that cannot be used; the message is one line naming the ``rope.*`` key."""


@dataclass(frozen=True)
class RopeConfig:
    method: str = "none"            # one of METHODS
    base: float = 10000.0           # b in theta_i = b^(-2i/D)
    factor: float = 1.0             # s = target length / original_max_len (>= 1)
    original_max_len: int = 2048    # L, the length the model was pretrained at
    # yarn: ramp bounds in rotations over L (paper: alpha=1, beta=32); attention_factor None -> 0.1 ln s + 1
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    # llama3: band edges as L / wavelength (Llama 3.1 uses 1 and 4)
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self):
        if self.method not in METHODS:
            raise RopeConfigError(f"rope.method={self.method!r} is not allowed; allowed: {', '.join(METHODS)}")
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor) and self.factor >= 1.0):
            raise RopeConfigError(f"rope.factor={self.factor!r} must be a number >= 1 (target length / original_max_len)")
        if self.method == "none" and self.factor != 1.0:
            raise RopeConfigError(f"rope.factor={self.factor!r} has no effect with rope.method='none'; use 1 or pick "
                                  f"a scaling method: {', '.join(METHODS[1:])}")
        if not (isinstance(self.base, (int, float)) and self.base > 1.0):
            raise RopeConfigError(f"rope.base={self.base!r} must be a number > 1")
        if isinstance(self.original_max_len, bool) or not isinstance(self.original_max_len, int) \
                or self.original_max_len < 1:
            raise RopeConfigError(f"rope.original_max_len={self.original_max_len!r} must be an integer >= 1")
        if not (0 < self.beta_slow < self.beta_fast):
            raise RopeConfigError(f"rope.beta_fast={self.beta_fast!r} must exceed rope.beta_slow={self.beta_slow!r} > 0")
        if not (0 < self.low_freq_factor < self.high_freq_factor):
            raise RopeConfigError(f"rope.high_freq_factor={self.high_freq_factor!r} must exceed "
                                  f"rope.low_freq_factor={self.low_freq_factor!r} > 0")
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise RopeConfigError(f"rope.attention_factor={self.attention_factor!r} must be > 0 or null")

    @classmethod
    def from_dict(cls, values: dict) -> "RopeConfig":
        """Build from a config mapping; an unknown key is an error naming it and the allowed keys."""
        reject_unknown_keys(values, [f.name for f in fields(cls)], "rope", RopeConfigError)
        return cls(**values)

    def check_model_len(self, model_max_len: int) -> None:
        """Reject an original length beyond what the model was built (and trained) for."""
        if self.original_max_len > model_max_len:
            raise RopeConfigError(f"rope.original_max_len={self.original_max_len} is larger than the model's "
                                  f"length {model_max_len}; it must be <= {model_max_len}")


def _base_inv_freq(base: float, rotary_dim: int) -> Tensor:
    """theta_i = base^(-2i/D), i = 0..D/2-1, computed in float64."""
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def yarn_correction_range(cfg: RopeConfig, rotary_dim: int) -> tuple[float, float]:
    """Pair indices (lo, hi) bounding YaRN's ramp: d(n) = D ln(L / (2 pi n)) / (2 ln b), floor/ceil, clipped."""
    def dim_at(rotations: float) -> float:
        return rotary_dim * math.log(cfg.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(cfg.base))

    lo = math.floor(dim_at(cfg.beta_fast))
    hi = math.ceil(dim_at(cfg.beta_slow))
    return max(lo, 0), min(hi, rotary_dim - 1)


def yarn_attention_factor(cfg: RopeConfig) -> float:
    """sqrt(1/t) = 0.1 ln s + 1 (YaRN eq. 22), or the configured override."""
    if cfg.attention_factor is not None:
        return float(cfg.attention_factor)
    return 0.1 * math.log(cfg.factor) + 1.0 if cfg.factor > 1 else 1.0


def rope_frequencies(cfg: RopeConfig, rotary_dim: int, seq_len: int | None = None) -> tuple[Tensor, float]:
    """(inv_freq float32 (rotary_dim // 2,), attention_factor) for ``cfg``; ``seq_len`` drives dynamic_ntk only."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise RopeConfigError(f"rotary_dim={rotary_dim!r} must be an even integer >= 2")
    if seq_len is not None and seq_len < 1:
        raise RopeConfigError(f"seq_len={seq_len!r} must be >= 1")
    theta = _base_inv_freq(cfg.base, rotary_dim)
    s, big_l, d = cfg.factor, cfg.original_max_len, rotary_dim
    attention = 1.0
    if cfg.method == "none":
        inv = theta
    elif cfg.method == "linear":
        inv = theta / s
    elif cfg.method == "ntk":
        inv = _base_inv_freq(cfg.base * s ** (d / (d - 2)), d)
    elif cfg.method == "dynamic_ntk":
        length = max(seq_len or big_l, big_l)
        inv = _base_inv_freq(cfg.base * (s * length / big_l - (s - 1)) ** (d / (d - 2)), d)
    elif cfg.method == "yarn":
        lo, hi = yarn_correction_range(cfg, d)
        width = hi - lo if hi != lo else 0.001  # avoid 0/0 when the ramp collapses (as the reference code does)
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / width).clamp(0, 1)
        inv = (1 - ramp) * theta + ramp * theta / s
        attention = yarn_attention_factor(cfg)
    else:  # llama3
        wavelen = 2 * math.pi / theta
        smooth = (big_l / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
        blended = (1 - smooth) * theta / s + smooth * theta
        inv = torch.where(wavelen < big_l / cfg.high_freq_factor, theta,
                          torch.where(wavelen > big_l / cfg.low_freq_factor, theta / s, blended))
    return inv.to(torch.float32), attention


def rope_cos_sin(inv_freq: Tensor, positions: Tensor, attention_factor: float,
                 dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin (S, rotary_dim) for integer ``positions`` (S,), both times ``attention_factor``.

    Angles m * theta_i are formed in float64 so positions up to 128k keep their phase,
    then duplicated over the two halves (rotate-half layout, as HF Llama).
    """
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(device=positions.device, dtype=torch.float64)[None, :]
    angles = torch.cat((angles, angles), dim=-1)  # (S, D)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, S, D) by (S, rotary_dim) tables; a head dim beyond rotary_dim passes through (partial RoPE)."""
    rotary_dim = cos.shape[-1]
    if x.shape[-1] == rotary_dim:
        return x * cos + _rotate_half(x) * sin
    if x.shape[-1] < rotary_dim:
        raise ValueError(f"apply_rope: head dim {x.shape[-1]} is smaller than rotary dim {rotary_dim}")
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)
