"""Training precisions (fp32, bf16 autocast, fp16 with loss scaling, FP8 through torchao) and FP8 scale statistics.

Precisions (``train.precision``):

* ``fp32``: no autocast.
* ``bf16``: ``torch.autocast`` to bfloat16, fp32 master weights.
* ``fp16``: autocast to float16 with dynamic loss scaling (``torch.amp.GradScaler``;
  Micikevicius et al. 2018); steps with inf/NaN gradients are skipped by the scaler.
* ``fp8-tensorwise``, ``fp8-rowwise``: torchao ``convert_to_float8_training`` with
  ``Float8LinearConfig.from_recipe_name("tensorwise" | "rowwise")`` on every Linear
  but the tied output head, inside bf16 autocast. Where the device has no FP8 matmul
  (CUDA capability < 8.9, or CPU) torchao's ``emulate=True`` runs the same numerics
  in high precision: the run is flagged ``emulated`` and claims no speed.
* ``mxfp8``: torchao's MXFP8 training (blocks of 32 sharing an E8M0 scale, OCP MX
  v1.0), emulated below CUDA capability 10.0 (Blackwell), flagged as such.

torchao is optional (``pip install 'attnbench[fp8]'``): without it the FP8
precisions raise :class:`PrecisionUnavailable` with the reason, and the run becomes
an ``unavailable`` row.

FP8 scale statistics (:func:`fp8_tensor_stats`) are computed here, on the tensors a
Linear layer would cast (input, weight, gradient of the output), for any run and
any recipe: what each recipe would see, whether or not it trains in FP8.

* tensorwise (torchao ``amax_to_scale``): s = fmax / amax per tensor; e4m3 for input
  and weight, e5m2 for the output gradient (torchao's tensorwise recipe).
* rowwise: s = 2^floor(log2(fmax / amax_row)) per row of the last dim, e4m3 for all
  three (torchao's rowwise recipe rounds scales down to powers of two).
* mxfp8 (RCEIL, NVIDIA cuBLAS block scaling; torchao's default for training):
  per block of 32 along the last dim, X = 2^ceil(log2(amax_block / fmax)), s = 1/X.
* mxfp8-floor (OCP MX v1.0 §6.3): X = 2^(floor(log2(amax_block)) - emax), emax = 8 for
  e4m3; values up to 2^9 - 1 ulp can land above fmax = 448 and saturate, which is why
  RCEIL exists.

Per tensor: amax, mean log2 of the scale over scale groups, overflow share
(|x s| beyond fmax + half an ulp: it would saturate) and underflow share (nonzero x whose x s rounds to
zero in the FP8 format). e4m3 max 448, e5m2 max 57344 (Micikevicius et al. 2022).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

PRECISIONS = ("fp32", "bf16", "fp16", "fp8-tensorwise", "fp8-rowwise", "mxfp8")
STATS_RECIPES = ("tensorwise", "rowwise", "mxfp8", "mxfp8-floor")
TENSOR_KINDS = ("act", "weight", "grad")
MX_BLOCK = 32
E4M3_EMAX = 8  # exponent of the largest power of two in e4m3 (2^8 = 256 <= 448)


@dataclass(frozen=True)
class Fp8Format:
    dtype: torch.dtype

    @property
    def max(self) -> float:
        return float(torch.finfo(self.dtype).max)

    @property
    def overflow_above(self) -> float:
        """Magnitudes above fmax + half an ulp at fmax do not round to fmax: they overflow (saturate or NaN).

        e4m3: 448 + 16 (ulp 32); e5m2: 57344 + 4096 (ulp 8192). A scaled amax that lands a
        float32 rounding error above fmax is not an overflow.
        """
        top_ulp = 2.0 ** math.floor(math.log2(self.max)) * float(torch.finfo(self.dtype).eps)
        return self.max + top_ulp / 2


FORMATS = {"e4m3": Fp8Format(torch.float8_e4m3fn), "e5m2": Fp8Format(torch.float8_e5m2)}
RECIPE_FORMATS = {  # (act, weight, grad) formats per recipe
    "tensorwise": ("e4m3", "e4m3", "e5m2"),
    "rowwise": ("e4m3", "e4m3", "e4m3"),
    "mxfp8": ("e4m3", "e4m3", "e4m3"),
    "mxfp8-floor": ("e4m3", "e4m3", "e4m3"),
}


class PrecisionUnavailable(RuntimeError):
    """This precision cannot run here; the message is the reason."""


@dataclass(frozen=True)
class Precision:
    name: str
    autocast_dtype: torch.dtype | None
    loss_scaling: bool
    fp8_recipe: str | None  # tensorwise | rowwise | mxfp8

    @property
    def matmul_dtype(self) -> str:
        """The ceiling MFU is measured against: fp8 for FP8 recipes, else the autocast dtype."""
        if self.fp8_recipe:
            return "fp8"
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.autocast_dtype]

    def autocast(self, device: str):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device, dtype=self.autocast_dtype)


def get_precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ValueError(f"train.precision={name!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
    if name == "fp32":
        return Precision(name, None, False, None)
    if name == "fp16":
        return Precision(name, torch.float16, True, None)
    recipe = {"bf16": None, "fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise", "mxfp8": "mxfp8"}[name]
    return Precision(name, torch.bfloat16, False, recipe)


def fp8_linear_filter(module: nn.Module, fqn: str) -> bool:
    """Linears FP8 converts: all but the tied output head, with both dims multiples of 16 (``_scaled_mm``)."""
    return (isinstance(module, nn.Linear) and not fqn.endswith("lm_head")
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def _capability(device: str) -> tuple[int, int]:
    return torch.cuda.get_device_capability() if device == "cuda" and torch.cuda.is_available() else (0, 0)


def apply_precision(model: nn.Module, precision: Precision, device: str) -> tuple[bool, str]:
    """Convert ``model`` in place for ``precision``; return (emulated, note). Raises PrecisionUnavailable."""
    if precision.fp8_recipe is None:
        return False, ""
    try:
        import torchao
    except ImportError as err:
        raise PrecisionUnavailable(f"{precision.name} needs torchao, which is not installed here "
                                   f"(pip install 'attnbench[fp8]'; {err})") from None
    version = getattr(torchao, "__version__", "?")
    if not any(fp8_linear_filter(m, n) for n, m in model.named_modules()):
        raise PrecisionUnavailable(f"{precision.name}: no Linear layer has both dims a multiple of 16")
    try:
        if precision.fp8_recipe in ("tensorwise", "rowwise"):
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            emulated = _capability(device) < (8, 9)
            config = Float8LinearConfig.from_recipe_name(precision.fp8_recipe)
            if emulated:
                config = dataclasses.replace(config, emulate=True)
            convert_to_float8_training(model, config=config, module_filter_fn=fp8_linear_filter)
        else:
            emulated = _capability(device) < (10, 0)
            _convert_mxfp8(model, emulated)
    except PrecisionUnavailable:
        raise
    except Exception as err:  # an API this torchao lacks, or a device it refuses
        raise PrecisionUnavailable(f"{precision.name}: torchao {version} failed to convert the model: "
                                   f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    _smoke_test(model, precision, device, version)
    note = f"torchao {version}" + (", emulated: numerics only, no speed claimed" if emulated else "")
    return emulated, note


def _smoke_test(model: nn.Module, precision: Precision, device: str, version: str) -> None:
    """One forward and backward of the converted model (32 tokens: an MX block) before any step counts."""
    idx = torch.zeros(1, 32, dtype=torch.long, device=device)
    try:
        with precision.autocast(device):
            out = model(idx)
        out.float().mean().backward()
    except Exception as err:
        raise PrecisionUnavailable(f"{precision.name}: torchao {version} cannot train this model here: "
                                   f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}") from None
    finally:
        model.zero_grad(set_to_none=True)


def _convert_mxfp8(model: nn.Module, emulated: bool) -> None:
    """torchao >= 0.15 (``MXFP8TrainingOpConfig``), else the older ``MXLinearConfig`` recipes."""
    from torchao.quantization import quantize_

    try:
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

        recipe = MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulated else MXFP8TrainingRecipe.MXFP8_RCEIL
        config = MXFP8TrainingOpConfig.from_recipe(recipe)
    except ImportError:
        from torchao.prototype.mx_formats import MXLinearConfig

        config = MXLinearConfig.from_recipe_name("mxfp8_emulated" if emulated else "mxfp8_cublas")
    quantize_(model, config, filter_fn=fp8_linear_filter)


# ---------------------------------------------------------------- FP8 scale statistics


@dataclass
class Fp8Stats:
    """Counts that add across tensors; shares are derived."""

    amax: float = 0.0
    log2_scale_sum: float = 0.0
    groups: int = 0
    elements: int = 0
    nonzero: int = 0
    overflow: int = 0
    underflow: int = 0

    def add(self, other: "Fp8Stats") -> None:
        self.amax = max(self.amax, other.amax)
        for f in ("log2_scale_sum", "groups", "elements", "nonzero", "overflow", "underflow"):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def summary(self) -> dict[str, float]:
        return {"amax": self.amax,
                "scale_log2": self.log2_scale_sum / self.groups if self.groups else math.nan,
                "overflow": self.overflow / self.elements if self.elements else math.nan,
                "underflow": self.underflow / self.nonzero if self.nonzero else math.nan}


def _groups(x: torch.Tensor, recipe: str) -> torch.Tensor:
    """x as (groups, group size) for the recipe's scaling granularity; MX pads the last dim with zeros to 32."""
    x = x.detach().float().reshape(-1, x.shape[-1]) if x.dim() > 1 else x.detach().float().reshape(1, -1)
    if recipe == "tensorwise":
        return x.reshape(1, -1)
    if recipe == "rowwise":
        return x
    pad = (-x.shape[-1]) % MX_BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(-1, MX_BLOCK)


def _scales(amax: torch.Tensor, recipe: str, fmt: Fp8Format) -> torch.Tensor:
    """Per-group multiplier s (x is cast as x * s); see the module docstring for each rule."""
    safe = amax.clamp(min=1e-12)
    if recipe == "tensorwise":
        return fmt.max / safe
    if recipe == "rowwise":
        return torch.exp2(torch.floor(torch.log2(fmt.max / safe)))
    if recipe == "mxfp8":
        return torch.exp2(-torch.ceil(torch.log2(safe / fmt.max)))
    return torch.exp2(-(torch.floor(torch.log2(safe)) - E4M3_EMAX))  # mxfp8-floor


def fp8_tensor_stats(x: torch.Tensor, recipe: str, fmt: str) -> Fp8Stats:
    """amax, scales, overflow and underflow counts of casting ``x`` to ``fmt`` under ``recipe``."""
    if recipe not in STATS_RECIPES:
        raise ValueError(f"fp8 stats recipe={recipe!r} is not allowed; allowed: {', '.join(STATS_RECIPES)}")
    f = FORMATS[fmt]
    g = _groups(x, recipe)
    amax = g.abs().amax(dim=1)  # (groups,)
    live = amax > 0
    scale = _scales(amax, recipe, f)
    y = g * scale[:, None]
    nonzero = g != 0
    over = y.abs() > f.overflow_above
    rounded = y.clamp(-f.max, f.max).to(f.dtype).float()
    under = nonzero & (rounded == 0)
    return Fp8Stats(amax=float(amax.max()) if amax.numel() else 0.0,
                    log2_scale_sum=float(torch.log2(scale[live]).sum()), groups=int(live.sum()),
                    elements=x.numel(), nonzero=int(nonzero.sum()), overflow=int(over.sum()), underflow=int(under.sum()))


class Fp8StatsRecorder:
    """Forward hooks on the Linears FP8 would convert; active only inside :meth:`recording`.

    Records each layer's input and weight in the forward pass and the gradient of its
    output in the backward pass (through a hook on the output tensor), for every recipe.
    """

    def __init__(self, model: nn.Module, recipes: tuple[str, ...]):
        for r in recipes:
            if r not in STATS_RECIPES:
                raise ValueError(f"train.fp8_stats: recipe {r!r} is not allowed; allowed: {', '.join(STATS_RECIPES)}")
        self.recipes = tuple(recipes)
        self.active = False
        self.stats: dict[tuple[str, str], Fp8Stats] = {}
        self.handles = [m.register_forward_hook(self._hook) for n, m in model.named_modules() if fp8_linear_filter(m, n)]

    def _record(self, kind: str, tensor: torch.Tensor) -> None:
        for recipe in self.recipes:
            fmt = RECIPE_FORMATS[recipe][TENSOR_KINDS.index(kind)]
            self.stats.setdefault((recipe, kind), Fp8Stats()).add(fp8_tensor_stats(tensor, recipe, fmt))

    def _hook(self, module, args, output):
        if not self.active:
            return
        self._record("act", args[0])
        self._record("weight", module.weight)
        if output.requires_grad:
            output.register_hook(lambda grad: self._record("grad", grad))

    @contextlib.contextmanager
    def recording(self):
        self.stats, self.active = {}, True
        try:
            yield self
        finally:
            self.active = False

    def row(self) -> dict[str, float]:
        """``fp8_<recipe>_<kind>_<stat>`` columns of the last recording."""
        out = {}
        for (recipe, kind), s in self.stats.items():
            for stat, value in s.summary().items():
                out[f"fp8_{recipe.replace('-', '_')}_{kind}_{stat}"] = value
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
