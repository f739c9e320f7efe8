"""A tiny GPT for stability experiments: pre-norm blocks, RoPE, byte-level vocabulary.

Built bottom-up like nanoGPT's ``model.py`` (Karpathy): MLP, SwiGLU -> Block -> GPTConfig ->
GPT. Differences from GPT-2 (Radford et al. 2019): rotary positions instead of a
learned table (Su et al. 2021, :mod:`attnbench.models.rope`), no biases, tied
input/output embeddings, and an attention layer whose head layout
(mha/gqa/mqa/mla, :mod:`attnbench.models.attention`) and kernel backend (any
registered name) come from the config. The MLP is GPT-2's GELU MLP or a SwiGLU MLP
(``mlp: swiglu``), optionally with Smooth-SwiGLU (``smooth_swiglu``). Optional
qk-layernorm lives in the attention layer; the z-loss is part of the training loss
(``attnbench.train.loop``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from attnbench.case import LAYOUTS
from attnbench.bench.conventions import forward_flops
from attnbench.errors import ConfigError
from attnbench.errors import reject_unknown_keys
from attnbench.models.attention import GroupedQueryAttention, MultiHeadLatentAttention
from attnbench.models.rope import RopeConfig, RopeConfigError, rope_cos_sin, rope_frequencies


MLPS = ("gelu", "swiglu")


class MLP(nn.Module):
    """GPT-2's MLP: proj(gelu(fc(x)))."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(nn.functional.gelu(self.fc(x), approximate="tanh"))


def smooth_scales(h: Tensor) -> Tensor:
    """Per-channel Smooth-SwiGLU scales s (F,) of h (..., F): powers of two with max |h_i| s_i in (1/2, 1].

    s_i = 2^-ceil(log2 max|h_i|) over every token of the batch, detached (the scale carries no
    gradient). Powers of two make the scaling exact in binary floating point, so s^-1 (s h) = h bit for
    bit outside an FP8 cast: this rounding of the channel max is this project's choice; Fishman et al.
    2024 scale each channel by its max. An all-zero channel keeps s = 1.
    """
    amax = h.detach().abs().flatten(0, -2).amax(dim=0).float()  # (F,)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax)), torch.zeros_like(amax))
    return torch.exp2(-exponent)


class SwiGLU(nn.Module):
    """SwiGLU MLP (Shazeer 2020): proj(fc(x) * silu(gate(x))), optionally Smooth-SwiGLU.

    Names after Fishman et al. 2024 (eq. 1): ``fc`` is w1 (the linear branch), ``gate`` w2 (the Swish
    branch), ``proj`` w3. Smooth-SwiGLU (Fishman et al. 2024, §4.4 and Fig. 4: the fix for the
    outlier amplification that aligned w1 and w2 cause late in FP8 training) scales each channel
    of h = fc(x) silu(gate(x)) by s_i (:func:`smooth_scales`) before the down projection quantises
    it, and folds s^-1 into that projection's weight: y = (w3 diag(1/s)) (s h), so the function is
    unchanged and only what an FP8 cast of h sees is. The projection is called through
    ``torch.func.functional_call`` with the weight w3 / s, so whichever Linear the precision put
    there (``nn.Linear``, torchao's ``Float8Linear``, the MXFP8 emulation) casts s h and w3 diag(1/s).
    """

    def __init__(self, d_model: int, d_ff: int, smooth: bool):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=False)
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d_model, bias=False)
        self.smooth = smooth

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc(x) * nn.functional.silu(self.gate(x))  # (B, S, F)
        if not self.smooth:
            return self.proj(h)
        s = smooth_scales(h)  # (F,)
        weight = self.proj.weight / s.to(self.proj.weight.dtype)  # (D, F): w3 diag(1/s)
        return functional_call(self.proj, {"weight": weight}, (h * s.to(h.dtype),))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: "GPTConfig"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = build_attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim, cfg.smooth_swiglu) if cfg.mlp == "swiglu" else \
            MLP(cfg.d_model, cfg.ffn_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256          # byte-level tokens: no tokenizer, no download
    max_seq_len: int = 128         # RoPE tables are precomputed up to here; longer inputs compute their own
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    layout: str = "mha"            # mha | gqa | mqa | mla
    n_kv_heads: int | None = None  # gqa only (a divisor of n_heads); mha uses n_heads, mqa 1
    head_dim: int | None = None    # None: d_model // n_heads (mha/gqa/mqa)
    d_ff: int | None = None        # None: 4 * d_model (GPT-2), or for swiglu 8/3 * d_model rounded up to 16 (the
    #                                same weights: SwiGLU has three matrices); parameter matching changes it
    mlp: str = "gelu"              # gelu (GPT-2) | swiglu (Shazeer 2020)
    smooth_swiglu: bool = False    # swiglu only: per-channel scaling before FP8 casts (Fishman et al. 2024)
    backend: str = "sdpa-math"     # any registered backend with an autograd-capable attention()
    qk_norm: bool = False          # LayerNorm on each head's q and k (Wortsman et al. 2023)
    rope: RopeConfig = field(default_factory=RopeConfig)
    # MLA (DeepSeek-V2 §2.1); its n_heads query heads each get d_nope + d_rope dims
    kv_lora_rank: int = 32         # d_c, the latent that decode caches
    q_lora_rank: int = 0           # 0: full-rank query projection
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8      # d_h^R, the decoupled RoPE key shared across heads
    v_head_dim: int = 16
    init_std: float = 0.02         # GPT-2's; residual projections get init_std / sqrt(2 n_layers)

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ConfigError(f"model.layout={self.layout!r} is not allowed; allowed: {', '.join(LAYOUTS)}")
        for key in ("vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{key}={value!r} is not allowed; allowed: a positive integer")
        if self.layout != "mla" and self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} does not divide model.d_model={self.d_model}; "
                              "allowed: a divisor, or set model.head_dim")
        if self.mlp not in MLPS:
            raise ConfigError(f"model.mlp={self.mlp!r} is not allowed; allowed: {', '.join(MLPS)}")
        if self.smooth_swiglu and self.mlp != "swiglu":
            raise ConfigError(f"model.smooth_swiglu=true needs model.mlp: swiglu (here: {self.mlp})")
        if self.n_kv_heads is not None and self.layout != "gqa":
            raise ConfigError(f"model.n_kv_heads={self.n_kv_heads} is only allowed with layout gqa; "
                              f"layout {self.layout} fixes it (mha: n_heads, mqa: 1, mla: a latent)")
        if self.layout == "gqa":
            divisors = [d for d in range(1, self.n_heads + 1) if self.n_heads % d == 0]
            if self.n_kv_heads not in divisors:
                raise ConfigError(f"model.n_kv_heads={self.n_kv_heads!r} is not allowed for layout gqa with "
                                  f"n_heads={self.n_heads}; allowed: {', '.join(map(str, divisors))}")
        if self.layout == "mla":
            if self.qk_rope_head_dim < 2 or self.qk_rope_head_dim % 2:
                raise ConfigError(f"model.qk_rope_head_dim={self.qk_rope_head_dim} is not allowed; allowed: an even integer >= 2")
            for key in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
                if getattr(self, key) < 1:
                    raise ConfigError(f"model.{key}={getattr(self, key)} is not allowed; allowed: a positive integer")
        elif self.dim_per_head % 2:
            raise ConfigError(f"head dim {self.dim_per_head} must be even for RoPE; change model.d_model, n_heads or head_dim")

    @classmethod
    def from_dict(cls, values: dict) -> "GPTConfig":
        """Build from a config mapping (``rope`` may be a mapping); unknown keys are errors naming the allowed ones."""
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "model", ConfigError)
        values = dict(values)
        if isinstance(values.get("rope"), dict):
            try:
                values["rope"] = RopeConfig.from_dict(values["rope"])
            except RopeConfigError as err:
                raise ConfigError(f"model.{err}") from None
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return {"mha": self.n_heads, "mqa": 1, "gqa": self.n_kv_heads, "mla": self.n_heads}[self.layout]

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        return 4 * self.d_model if self.mlp == "gelu" else 16 * math.ceil(8 * self.d_model / 3 / 16)

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim if self.layout == "mla" else self.dim_per_head


def build_attention(cfg: GPTConfig) -> nn.Module:
    if cfg.layout == "mla":
        return MultiHeadLatentAttention(cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.q_lora_rank,
                                        cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                                        cfg.backend, cfg.qk_norm)
    return GroupedQueryAttention(cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.dim_per_head, cfg.backend, cfg.qk_norm)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied (Press & Wolf 2017)
        inv_freq, self.attention_factor = rope_frequencies(cfg.rope, cfg.rotary_dim, cfg.max_seq_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        cos, sin = rope_cos_sin(inv_freq, torch.arange(cfg.max_seq_len), self.attention_factor, torch.float32)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, rotary_dim)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norm gains stay at 1
            residual = name.endswith(("attn.wo.weight", "mlp.proj.weight"))
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_layers) if residual else std)

    def rope_tables(self, seq_len: int) -> tuple[Tensor, Tensor]:
        """cos, sin (seq_len, rotary_dim): sliced from the buffers, or computed for a longer or dynamic length."""
        if seq_len <= self.cfg.max_seq_len and self.cfg.rope.method != "dynamic_ntk":
            return self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        inv_freq, factor = rope_frequencies(self.cfg.rope, self.cfg.rotary_dim, seq_len)
        return rope_cos_sin(inv_freq, torch.arange(seq_len, device=self.rope_cos.device), factor, torch.float32)

    def forward(self, idx: Tensor) -> Tensor:
        """(B, S) token ids -> (B, S, vocab) logits."""
        _, s = idx.shape
        cos, sin = self.rope_tables(s)
        x = self.wte(idx)  # (B, S, D)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.ln_f(x))

    @torch.no_grad()
    def max_attention_logits(self, idx: Tensor) -> list[float]:
        """Per layer, the largest pre-softmax logit on this batch (a probe run beside training, not in it)."""
        cos, sin = self.rope_tables(idx.shape[1])
        x, out = self.wte(idx), []
        for block in self.blocks:
            out.append(block.attn.max_logit(block.ln_1(x), cos, sin))
            x = block(x, cos, sin)
        return torch.stack(out).tolist()  # the probe's one device sync

    def num_params(self) -> int:
        """Distinct parameters (the tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every Linear, the tied output head included."""
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 N_matmul plus 3x the causal attention forward.

        PaLM Appendix B (Chowdhery et al. 2022): 6N for the weight matmuls (forward 2N,
        backward 4N) plus the attention score and value matmuls, here counted exactly
        with :func:`attnbench.bench.conventions.forward_flops` (causal, bottom-right)
        and tripled for forward + backward without recomputation (model FLOPs, not
        hardware FLOPs, as MFU requires).
        """
        attn = sum(forward_flops(block.attn.case(1, seq_len, "bf16", "fwd")) for block in self.blocks)
        return 6.0 * self.matmul_params() + 3.0 * attn / seq_len

    def kv_cache_elements_per_token(self) -> int:
        """Decode cache elements per token over all layers (DeepSeek-V2 Table 1, times n_layers)."""
        return sum(block.attn.cache_elements_per_token for block in self.blocks)


def count_params(cfg: GPTConfig) -> int:
    """Parameters of a model built from ``cfg`` (built on the meta device: no memory, no init cost).

    The backend holds no parameters, so ``backend: auto`` (resolved at training time) counts as any other.
    """
    with torch.device("meta"):
        return GPT(dataclasses.replace(cfg, backend="sdpa-math")).num_params()


def match_params(cfg: GPTConfig, target: int) -> GPTConfig:
    """``cfg`` with the MLP width changed so its parameter count comes closest to ``target``.

    Shazeer (2019) matches MQA to MHA by widening the feed-forward layer; each unit of
    d_ff adds 2 (GELU: fc, proj) or 3 (SwiGLU: fc, gate, proj) x d_model x n_layers weights (no
    biases), so one step suffices.
    """
    per_unit = cfg.mlp_matrices * cfg.d_model * cfg.n_layers
    d_ff = cfg.ffn_dim + round((target - count_params(cfg)) / per_unit)
    if d_ff < 1:
        raise ConfigError(f"cannot match {target} parameters with layout {cfg.layout}: its attention alone "
                          f"has more; shrink its dims (e.g. model.kv_lora_rank) or grow the reference")
    return dataclasses.replace(cfg, d_ff=d_ff)
