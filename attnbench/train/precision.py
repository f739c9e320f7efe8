"""Training precisions (fp32, bf16 autocast, fp16 with loss scaling, FP8 through torchao, MXFP8) and FP8 scale statistics.

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
* ``mxfp8``: MXFP8 training (blocks of 32 sharing an E8M0 scale, OCP MX v1.0; RCEIL
  scales; e4m3 for input, weight and output gradient) on every Linear but the tied
  head, inside bf16 autocast. On CUDA capability >= 10.0 (Blackwell) with a torchao
  whose ``MXFP8TrainingOpConfig`` (``MXFP8_RCEIL``) converts and trains a copy of the
  model, torchao's kernels run it. Everywhere else (CPU, Hopper and older, no torchao,
  or torchao refusing, as 0.18 does on torch 2.11 and on CPU) attnbench emulates the
  recipe (:class:`MXFP8EmulatedLinear`: each of the three GEMMs on operands quantised
  and dequantised along its reduction dim, computed in bf16), flagged ``emulated``
  with torchao's reason in the note; no speed is claimed.

torchao is optional (``pip install 'attnbench[fp8]'``): without it ``fp8-tensorwise``
and ``fp8-rowwise`` raise :class:`PrecisionUnavailable` with the reason, and the run
becomes an ``unavailable`` row; ``mxfp8`` runs emulated.

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
import copy
import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from attnbench.failures import first_line

PRECISIONS = ("fp32", "bf16", "fp16", "fp8-tensorwise", "fp8-rowwise", "mxfp8")
STATS_RECIPES = ("tensorwise", "rowwise", "mxfp8", "mxfp8-floor")
TENSOR_KINDS = ("act", "weight", "grad")
MX_BLOCK = 32
E4M3_EMAX = 8  # exponent of the largest power of two in e4m3 (2^8 = 256 <= 448)
E8M0_EMAX = 127  # E8M0 scales are 2^-127 .. 2^127 (255 is NaN)


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

    def round(self, y: torch.Tensor) -> torch.Tensor:
        """y (float32) on this format's grid: saturate to +-max, then the cast's round to nearest even."""
        return y.clamp(-self.max, self.max).to(self.dtype).float()


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
    if not any(fp8_linear_filter(m, n) for n, m in model.named_modules()):
        raise PrecisionUnavailable(f"{precision.name}: no Linear layer has both dims a multiple of 16")
    if precision.fp8_recipe == "mxfp8":
        return _apply_mxfp8(model, precision, device)
    try:
        import torchao
    except ImportError as err:
        raise PrecisionUnavailable(f"{precision.name} needs torchao, which is not installed here "
                                   f"(pip install 'attnbench[fp8]'; {err})") from None
    version = getattr(torchao, "__version__", "?")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        emulated = _capability(device) < (8, 9)
        config = Float8LinearConfig.from_recipe_name(precision.fp8_recipe)
        if emulated:
            config = dataclasses.replace(config, emulate=True)
        convert_to_float8_training(model, config=config, module_filter_fn=fp8_linear_filter)
    except Exception as err:  # an API this torchao lacks, or a device it refuses
        raise PrecisionUnavailable(f"{precision.name}: torchao {version} failed to convert the model: "
                                   f"{first_line(err)}") from None
    _smoke_test(model, precision, device, f"torchao {version}")
    note = f"torchao {version}" + (", emulated: numerics only, no speed claimed" if emulated else "")
    return emulated, note


def _smoke_test(model: nn.Module, precision: Precision, device: str, who: str) -> None:
    """One forward and backward of the converted model (32 tokens: an MX block) before any step counts."""
    idx = torch.zeros(1, 32, dtype=torch.long, device=device)
    try:
        with precision.autocast(device):
            out = model(idx)
        out.float().mean().backward()
    except Exception as err:
        raise PrecisionUnavailable(f"{precision.name}: {who} cannot train this model here: {first_line(err)}") from None
    finally:
        model.zero_grad(set_to_none=True)


def _apply_mxfp8(model: nn.Module, precision: Precision, device: str) -> tuple[bool, str]:
    """torchao's MXFP8 kernels on CUDA capability >= 10.0 where they convert and train; else attnbench's emulation.

    torchao is tried on a copy of the model, so a refusal (an import, an assert, a failed
    smoke test) leaves ``model`` untouched for the emulation; its reason goes into the note.
    """
    reason = _torchao_mxfp8_refusal(model, precision, device)
    if reason is None:
        import torchao

        _convert_mxfp8(model)
        return False, f"torchao {getattr(torchao, '__version__', '?')} MXFP8 (RCEIL)"
    _convert_mxfp8_emulated(model)
    _smoke_test(model, precision, device, "attnbench's MXFP8 emulation")
    return True, (f"attnbench MXFP8 emulation (e4m3, RCEIL, blocks of 32, bf16 GEMMs): numerics only, "
                  f"no speed claimed; not torchao because {reason}")


def _torchao_mxfp8_refusal(model: nn.Module, precision: Precision, device: str) -> str | None:
    """Why torchao's MXFP8 training cannot run ``model`` here, or None if it converts and trains a copy."""
    if _capability(device) < (10, 0):
        here = "CUDA {}.{}".format(*_capability(device)) if device == "cuda" else device
        return f"its MXFP8 GEMMs need CUDA capability >= 10.0 (here: {here})"
    try:
        import torchao
    except ImportError:
        return "torchao is not installed"
    version = getattr(torchao, "__version__", "?")
    trial = copy.deepcopy(model)
    try:
        _convert_mxfp8(trial)
    except Exception as err:  # an API this torchao lacks, or a torch it refuses
        return f"torchao {version} failed to convert the model: {first_line(err)}"
    try:
        _smoke_test(trial, precision, device, f"torchao {version}")
    except PrecisionUnavailable as err:
        return str(err)
    return None


def _convert_mxfp8(model: nn.Module) -> None:
    """torchao >= 0.15 (``MXFP8TrainingOpConfig``, RCEIL), else the older ``MXLinearConfig`` cuBLAS recipe."""
    from torchao.quantization import quantize_

    try:
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

        config = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL)
    except ImportError:
        from torchao.prototype.mx_formats import MXLinearConfig

        config = MXLinearConfig.from_recipe_name("mxfp8_cublas")
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

    @classmethod
    def from_counts(cls, counts: list[float]) -> "Fp8Stats":
        """From a row of :func:`fp8_tensor_counts` (moved to the host)."""
        amax, log2_scale_sum, *rest = counts
        return cls(amax, log2_scale_sum, *map(int, rest))

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


def mx_rceil_scale(amax: torch.Tensor, fmax: float) -> torch.Tensor:
    """RCEIL multiplier s = 1/X, X = 2^ceil(log2(amax / fmax)), the exponent clamped to E8M0's [-127, 127].

    torchao ``_to_mx_rceil`` (prototype/mx_formats/mx_tensor.py), after cuBLAS block scaling.
    An all-zero block gets X = 2^-127 (torchao: the same exponent). amax is float32.
    """
    return torch.exp2(-torch.ceil(torch.log2(amax / fmax)).clamp(-E8M0_EMAX, E8M0_EMAX))


def _scales(amax: torch.Tensor, recipe: str, fmt: Fp8Format) -> torch.Tensor:
    """Per-group multiplier s (x is cast as x * s); see the module docstring for each rule."""
    safe = amax.clamp(min=1e-12)
    if recipe == "tensorwise":
        return fmt.max / safe
    if recipe == "rowwise":
        return torch.exp2(torch.floor(torch.log2(fmt.max / safe)))
    if recipe == "mxfp8":
        return mx_rceil_scale(amax, fmt.max)
    return torch.exp2(-(torch.floor(torch.log2(safe)) - E4M3_EMAX))  # mxfp8-floor


def fp8_tensor_counts(x: torch.Tensor, recipe: str, fmt: str) -> torch.Tensor:
    """:class:`Fp8Stats`'s fields for casting ``x`` to ``fmt`` under ``recipe``, as a float64 vector on x's device.

    Nothing here waits for the device (no ``.item()``, no boolean indexing, no tensor made from host
    data), so a recording of
    every layer, recipe and tensor moves its counts to the host in one transfer
    (:meth:`Fp8StatsRecorder.summaries`); float64 holds the counts exactly up to 2^53.
    """
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
    under = nonzero & (f.round(y) == 0)
    log2_scale = torch.where(live, torch.log2(scale), 0.0)
    return torch.stack([amax.max() if amax.numel() else amax.new_zeros(()), log2_scale.double().sum(),
                        live.sum(), g.new_full((), x.numel(), dtype=torch.float64),  # a fill, not a host copy
                        nonzero.sum(), over.sum(), under.sum()]).double()


def fp8_tensor_stats(x: torch.Tensor, recipe: str, fmt: str) -> Fp8Stats:
    """amax, scales, overflow and underflow counts of casting ``x`` to ``fmt`` under ``recipe`` (one device sync)."""
    return Fp8Stats.from_counts(fp8_tensor_counts(x, recipe, fmt).tolist())


def _add_counts(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two :func:`fp8_tensor_counts` vectors of one (layer, recipe, kind) combined: the larger amax, the sums."""
    return torch.cat([torch.maximum(a[:1], b[:1]), a[1:] + b[1:]])


class Fp8StatsRecorder:
    """Forward hooks on the Linears FP8 would convert; active only inside :meth:`recording`.

    Records each layer's input and weight in the forward pass and the gradient of its
    output in the backward pass (through a hook on the output tensor), for every recipe,
    per layer (:meth:`layer_rows`) and summed over layers (:meth:`row`). The counts stay on
    the device until the first of those is asked for: one device sync per recording, not
    seven per layer, recipe and tensor (3,024 at the pretraining model's 36 Linears and 4 recipes).
    """

    def __init__(self, model: nn.Module, recipes: tuple[str, ...]):
        for r in recipes:
            if r not in STATS_RECIPES:
                raise ValueError(f"train.fp8_stats: recipe {r!r} is not allowed; allowed: {', '.join(STATS_RECIPES)}")
        self.recipes = tuple(recipes)
        self.active = False
        self.counts: dict[tuple[str, str, str], torch.Tensor] = {}  # (layer, recipe, kind) -> on the device
        self._summaries: dict[tuple[str, str, str], Fp8Stats] | None = None
        self.handles = [m.register_forward_hook(functools.partial(self._hook, n))
                        for n, m in model.named_modules() if fp8_linear_filter(m, n)]

    def _record(self, layer: str, kind: str, tensor: torch.Tensor) -> None:
        for recipe in self.recipes:
            fmt = RECIPE_FORMATS[recipe][TENSOR_KINDS.index(kind)]
            counts = fp8_tensor_counts(tensor, recipe, fmt)
            key = (layer, recipe, kind)
            self.counts[key] = _add_counts(self.counts[key], counts) if key in self.counts else counts

    def _hook(self, layer, module, args, output):
        if not self.active:
            return
        self._record(layer, "act", args[0])
        self._record(layer, "weight", module.weight)
        if output.requires_grad:
            output.register_hook(lambda grad: self._record(layer, "grad", grad))

    @contextlib.contextmanager
    def recording(self):
        self.counts, self._summaries, self.active = {}, None, True
        try:
            yield self
        finally:
            self.active = False

    def summaries(self) -> dict[tuple[str, str, str], Fp8Stats]:
        """The last recording's :class:`Fp8Stats` per (layer, recipe, kind), moved to the host in one transfer."""
        if self._summaries is None:
            keys = sorted(self.counts)
            host = torch.stack([self.counts[k] for k in keys]).tolist() if keys else []
            self._summaries = {k: Fp8Stats.from_counts(c) for k, c in zip(keys, host)}
        return self._summaries

    def row(self) -> dict[str, float]:
        """``fp8_<recipe>_<kind>_<stat>`` columns of the last recording, over every layer."""
        total: dict[tuple[str, str], Fp8Stats] = {}
        for (_, recipe, kind), s in self.summaries().items():
            total.setdefault((recipe, kind), Fp8Stats()).add(s)
        out = {}
        for (recipe, kind), s in total.items():
            for stat, value in s.summary().items():
                out[f"fp8_{recipe.replace('-', '_')}_{kind}_{stat}"] = value
        return out

    def layer_rows(self, step: int) -> list[dict]:
        """One row per (layer, recipe, kind) of the last recording: amax, scale_log2, overflow, underflow."""
        return [{"step": step, "layer": layer, "recipe": recipe, "kind": kind, **s.summary()}
                for (layer, recipe, kind), s in self.summaries().items()]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


# ---------------------------------------------------------------- MXFP8 emulation


def mx_quantize(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x quantised to MXFP8 along ``dim`` and dequantised, in x's dtype.

    Blocks of 32 consecutive elements along ``dim`` share an RCEIL scale X
    (:func:`mx_rceil_scale`); elements are x / X cast to e4m3 (saturating), times X.
    A ``dim`` not divisible by 32 has its last block padded with zeros (they change no
    amax), as the statistics' MX groups (:func:`_groups`). Computed in float32, as
    torchao ``to_mx``; the result (e4m3 value times a power of two) is exact in bfloat16.
    """
    t = x.movedim(dim, -1)
    n = t.shape[-1]
    blocks = _groups(t, "mxfp8")  # (n_blocks, 32), float32
    e4m3 = FORMATS["e4m3"]
    s = mx_rceil_scale(blocks.abs().amax(dim=1, keepdim=True), e4m3.max)
    q = (e4m3.round(blocks * s) / s).reshape(*t.shape[:-1], -1)[..., :n]
    return q.movedim(-1, dim).to(x.dtype)


class _MXFP8Matmul(torch.autograd.Function):
    """y = x w^T with each of a Linear's three GEMMs on operands MX-quantised along their reduction dim.

    As torchao ``mx_mm`` (prototype/moe_training/mxfp8_linear.py), e4m3 for input, weight and
    gradient, with M = tokens, K = in_features, N = out_features:
    forward y = q(x, K) q(w, K)^T; dgrad dx = q(dy, N) q(w, N); wgrad dw = q(dy, M)^T q(x, M).
    x (M, K) and w (N, K) arrive in the compute dtype; the GEMMs run in it.
    """

    @staticmethod
    def forward(ctx, x_MK: torch.Tensor, w_NK: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x_MK, w_NK)
        return mx_quantize(x_MK, 1) @ mx_quantize(w_NK, 1).t()

    @staticmethod
    def backward(ctx, dy_MN: torch.Tensor):
        x_MK, w_NK = ctx.saved_tensors
        dy_MN = dy_MN.to(x_MK.dtype)
        dx_MK = mx_quantize(dy_MN, 1) @ mx_quantize(w_NK, 0)
        dw_NK = mx_quantize(dy_MN, 0).t() @ mx_quantize(x_MK, 0)
        return dx_MK, dw_NK


class MXFP8EmulatedLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state-dict keys) training through :class:`_MXFP8Matmul`.

    The GEMMs run in the autocast dtype when autocast is on (bf16 for ``mxfp8``, as torchao's
    emulated recipe with ``out_dtype=bfloat16``), else in the input's dtype.
    """

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "MXFP8EmulatedLinear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        with torch.autocast(kind, enabled=False):
            y = _MXFP8Matmul.apply(x.reshape(-1, self.in_features).to(dtype), self.weight.to(dtype))
            y = y.reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias.to(dtype)


def _convert_mxfp8_emulated(model: nn.Module) -> None:
    """Swap every Linear :func:`fp8_linear_filter` selects for an :class:`MXFP8EmulatedLinear` sharing its parameters."""
    for fqn, module in list(model.named_modules()):
        if fp8_linear_filter(module, fqn) and not isinstance(module, MXFP8EmulatedLinear):
            parent, _, name = fqn.rpartition(".")
            setattr(model.get_submodule(parent), name, MXFP8EmulatedLinear.from_linear(module))
