"""Dao-AILab flash-attention: FA2 (``flash_attn``), FA3 (``flash_attn_interface``, the Hopper
build) and FA4 (``flash_attn.cute``, the CuTe DSL package ``flash-attn-4``).

Every generation takes BSHD tensors: q (B, Sq, Hq, D), k and v (B, Skv, Hkv, D), with GQA/MQA
through ``Hq % Hkv == 0`` and a causal mask aligned bottom-right when Sq != Skv (FA2 >= 2.1; FA3;
FA4's ``seqlen_k - seqlen_q`` row offset in ``flash_attn/cute/mask.py``), the harness's
convention. :meth:`_FlashAttn.build` converts the harness's BHSD tensors to contiguous BSHD
once, outside the timed call, and leaves the output in BSHD (converting it back is not the
kernel's work); :meth:`_FlashAttn.attention` converts on every call, for models and numerics.

Keyword arguments only: flash-attn-4 4.0.0b36 inserted ``qv`` and ``gather_kv_indices`` before
``softmax_scale`` in ``flash_attn_func``, so a positional call would pass the scale as ``qv``.
FA3 and FA4 return ``(out, lse)``; FA2 returns ``out``.

FP8 (``fa3-fp8``): e4m3 inputs with FA3's descale convention, one float32 descale per
(batch, K/V head): the kernel computes softmax((q8 k8^T) * q_descale * k_descale * scale)
(v8 * v_descale), so ``descale = amax / 448`` and ``x8 = x / descale`` (see
:func:`quantize_e4m3`). flash-attn-4 takes the same descales, but only on SM100 (Blackwell);
4.0.0b36 asserts "FP8 is only supported on SM100", so fa4 has no fp8 backend here.

Real workloads on fa4 (the other generations here run dense cases only):

* ragged batches, chunked prefill against a cached prefix and the ``document`` variant run
  ``flash_attn_varlen_func`` on the varlen view (:mod:`attnbench.kernels.varlen`): token rows end to
  end with int32 ``cu_seqlens_q``/``cu_seqlens_k`` and their maxima, causal bottom-right per sequence;
* paged decode (``page_size > 0``) runs ``flash_attn_varlen_func`` with ``page_table`` (B, max pages),
  K/V pages (num_pages, page_size, Hkv, D) and ``seqused_k`` (the KV length of each request), the page
  table drawn from a shuffled free list (:meth:`attnbench.workloads.pages.PageTable.fragmented`);
* variants: ``sliding_window`` as ``window_size=(window, 0)`` with ``causal=True``, ``softcap`` as
  ``softcap``; fa4 has no ALiBi, and its ``mask_mod`` takes CuTe DSL functions, which this adapter does
  not write, so ``alibi`` and ``prefix_lm`` are unsupported rows.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util

import torch

from attnbench.case import Case, Tensors
from attnbench.kernels.registry import Backend, dense_only, register
from attnbench.kernels.varlen import to_case_layout, varlen_view
from attnbench.workloads.pages import PageTable, case_page_seed, token_rows

E4M3_MAX = 448.0  # largest finite float8_e4m3fn (OCP FP8 spec); REFERENCES.md


def to_bshd(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> contiguous (B, S, H, D), the layout every flash-attention generation takes."""
    return x.transpose(1, 2).contiguous()


def from_bshd(x: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) -> (B, H, S, D), a view."""
    return x.transpose(1, 2)


def quantize_e4m3(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``x`` into float8_e4m3fn range over ``dims`` (reduced) and return (x8, descale).

    ``descale = amax / 448`` per remaining index (float32), ``x8 = x / descale`` rounded to e4m3,
    so ``x8 * descale ~= x``: the "descale" FA3 and FlashInfer multiply back in. An all-zero
    slice gets descale 1.
    """
    amax = x.detach().abs().float().amax(dim=dims, keepdim=True)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    x8 = (x.detach().float() / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return x8, descale.squeeze(dims)


def _installed(module: str) -> bool:
    """True when ``module`` can be found, without importing it (CUDA libraries load on import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


@functools.cache
def _import(module: str):
    """The module, or the ImportError text; probed once per process."""
    try:
        return importlib.import_module(module), ""
    except Exception as err:  # a broken install (missing .so, CUDA mismatch) is as unavailable as a missing one
        return None, f"{type(err).__name__}: {err}"


class _FlashAttn(Backend):
    """Shared by FA2/FA3/FA4: availability, BSHD conversion, build and autograd call."""

    family = "fused"
    module: str = ""  # what to import
    function: str = "flash_attn_func"
    distribution: str = ""  # pip distribution name, for version()
    min_capability: tuple[int, int] = (8, 0)
    max_capability: tuple[int, int] | None = None
    head_dims: tuple[int, ...] = (64, 96, 128, 256)
    has_backward: bool = True

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return ""

    def available(self) -> tuple[bool, str]:
        if not _installed(self.module):
            return False, f"{self.module} is not installed; install: {self.install_hint}"
        if not torch.cuda.is_available():
            return False, f"{self.name} needs CUDA (torch {torch.__version__} sees no CUDA device)"
        cap = torch.cuda.get_device_capability()
        if cap < self.min_capability or (self.max_capability and cap > self.max_capability):
            return False, f"{self.name} does not run on compute capability {cap[0]}.{cap[1]}"
        module, error = _import(self.module)
        if module is None:
            return False, f"{self.module} failed to import ({error[:200]}); install: {self.install_hint}"
        if not callable(getattr(module, self.function, None)):  # fa4 leaves a bare `flash_attn` namespace
            return False, f"{self.module} has no {self.function} (another flash-attn generation?); install: {self.install_hint}"
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        ok, reason = self._common_supports(case)
        if not ok:
            return ok, reason
        if case.page_size:
            return False, f"this {self.name} adapter takes a contiguous BSHD KV cache, not a paged one"
        return dense_only(self.name, case)

    def _common_supports(self, case: Case) -> tuple[bool, str]:
        if case.dtype not in ("fp16", "bf16"):
            return False, f"{self.name} takes fp16 or bf16 (case dtype {case.dtype})"
        if case.head_dim_qk != case.head_dim_v or case.head_dim_qk not in self.head_dims:
            return False, (f"{self.name} here runs head_dim in {self.head_dims} with head_dim_qk == head_dim_v "
                           f"(case {case.head_dim_qk}/{case.head_dim_v})")
        if case.has_backward and not self.has_backward:
            return False, f"{self.name} is forward-only"
        return True, ""

    def _func(self):
        return getattr(_import(self.module)[0], self.function)

    def _call(self, q, k, v, *, causal: bool, scale: float) -> torch.Tensor:
        """BSHD in, BSHD out."""
        out = self._func()(q, k, v, softmax_scale=scale, causal=causal)
        return out[0] if isinstance(out, tuple) else out

    def attention(self, q, k, v, *, causal: bool, scale: float):
        return from_bshd(self._call(to_bshd(q), to_bshd(k), to_bshd(v), causal=causal, scale=scale))

    def build(self, case: Case, tensors: Tensors):
        grad = case.has_backward
        q, k, v = (to_bshd(t.detach()).requires_grad_(grad) for t in (tensors.q, tensors.k, tensors.v))
        causal, scale = case.causal, case.scale
        if not grad:
            return lambda: self._call(q, k, v, causal=causal, scale=scale)
        dout = to_bshd(tensors.dout)

        def fwd_bwd():
            out = self._call(q, k, v, causal=causal, scale=scale)
            return torch.autograd.grad(out, (q, k, v), dout)

        return fwd_bwd


@register
class FA2(_FlashAttn):
    name = "fa2"
    module = "flash_attn"
    distribution = "flash-attn"
    install_hint = "pip install flash-attn --no-build-isolation"
    head_dims = (32, 64, 96, 128, 192, 256)
    # FA2's kernels; SDPA's copy of FA2 is namespaced pytorch_flash:: and must not pass as fa2
    kernel_pattern = r"^(?!.*pytorch_flash).*flash_(fwd|bwd)"

    def _call(self, q, k, v, *, causal: bool, scale: float):
        return self._func()(q, k, v, dropout_p=0.0, softmax_scale=scale, causal=causal)


@register
class FA3(_FlashAttn):
    name = "fa3"
    module = "flash_attn_interface"
    distribution = "flash_attn_3"
    install_hint = ('pip install --no-build-isolation '
                    '"git+https://github.com/Dao-AILab/flash-attention.git#subdirectory=hopper"')
    min_capability = (9, 0)
    max_capability = (9, 0)
    kernel_pattern = r"FlashAttn(Fwd|Bwd)"  # flash::FlashAttnFwdSm90<...>, FlashAttnBwdSm90


@register
class FA3FP8(FA3):
    """FA3 forward on e4m3 q, k, v with per-(batch, K/V head) descales; bf16 output."""

    name = "fa3-fp8"
    compute_dtype = "fp8"
    fp8_inputs = ("q", "k", "v")
    has_backward = False
    head_dims = (64, 128, 256)

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.dtype != "bf16":
            return False, f"{self.name} quantises bf16 inputs and returns bf16 (case dtype {case.dtype})"
        return super().supports(case)

    @staticmethod
    def quantize(q, k, v):
        """BSHD q, k, v -> e4m3 copies and (B, Hkv) descales; q's per-head amax is reduced over its group."""
        b, _, hq, _ = q.shape
        hkv = k.shape[2]
        q8, q_descale = quantize_e4m3(q.unflatten(2, (hkv, hq // hkv)), dims=(1, 3, 4))
        k8, k_descale = quantize_e4m3(k, dims=(1, 3))
        v8, v_descale = quantize_e4m3(v, dims=(1, 3))
        return q8.flatten(2, 3), k8, v8, q_descale.reshape(b, hkv), k_descale, v_descale

    def _run(self, q8, k8, v8, descales, *, causal: bool, scale: float):
        q_d, k_d, v_d = descales
        out = self._func()(q8, k8, v8, softmax_scale=scale, causal=causal, q_descale=q_d, k_descale=k_d, v_descale=v_d)
        return out[0] if isinstance(out, tuple) else out

    def _call(self, q, k, v, *, causal: bool, scale: float):
        q8, k8, v8, *descales = self.quantize(q, k, v)
        return self._run(q8, k8, v8, descales, causal=causal, scale=scale).to(q.dtype)

    def build(self, case: Case, tensors: Tensors):
        q8, k8, v8, *descales = self.quantize(*(to_bshd(t.detach()) for t in (tensors.q, tensors.k, tensors.v)))
        causal, scale = case.causal, case.scale
        return lambda: self._run(q8, k8, v8, descales, causal=causal, scale=scale)


@register
class FA4(_FlashAttn):
    name = "fa4"
    module = "flash_attn.cute"
    distribution = "flash-attn-4"
    # plain `flash-attn-4` finds only PyPI's 0.0.1 placeholder; [cu13] pulls CUTLASS DSL's CUDA 13 libraries
    install_hint = 'pip install "flash-attn-4[cu13]>=4.0.0b36" (on CUDA 12: "flash-attn-4>=4.0.0b36")'
    min_capability = (9, 0)  # SM90 (Hopper) and SM100/110 (Blackwell) kernels
    head_dims = (64, 96, 128)
    # CuTe DSL kernel names carry the Python path: kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90
    # FlashAttentionForwardSm90_... (flash-attention PR #2564 shows them)
    kernel_pattern = r"flash_attncute|FlashAttention(Forward|Backward)"

    def supports(self, case: Case) -> tuple[bool, str]:
        ok, reason = self._common_supports(case)
        if not ok:
            return ok, reason
        if case.variant == "alibi":
            return False, "fa4 has no ALiBi (flash_attn.cute takes no alibi_slopes)"
        if case.variant == "prefix_lm":
            return False, "fa4 takes arbitrary masks only as CuTe DSL mask_mod functions; this adapter writes none"
        return True, ""

    @staticmethod
    def _variant_kwargs(case: Case) -> dict:
        if case.variant == "sliding_window":
            return {"window_size": (case.window, 0)}
        if case.variant == "softcap":
            return {"softcap": case.softcap}
        return {}

    def _varlen(self):
        return getattr(_import(self.module)[0], "flash_attn_varlen_func")

    def build(self, case: Case, tensors: Tensors):
        if case.dense and not case.page_size:
            return super().build(case, tensors)
        causal = case.implied_causal if case.variant == "sliding_window" else case.causal
        kwargs = dict(softmax_scale=case.scale, causal=causal, **self._variant_kwargs(case))
        if case.page_size:
            return self._build_paged(case, tensors, kwargs)
        if not case.ragged and case.variant != "document":  # a dense variant: the batched API
            q, k, v = (to_bshd(t.detach()) for t in (tensors.q, tensors.k, tensors.v))
            func = self._func()
            return lambda: func(q, k, v, **kwargs)
        view, func = varlen_view(case, tensors), self._varlen()
        return lambda: func(view.q, view.k, view.v, cu_seqlens_q=view.cu_q, cu_seqlens_k=view.cu_kv,
                            max_seqlen_q=view.max_q, max_seqlen_k=view.max_kv, **kwargs)

    def _build_paged(self, case: Case, tensors: Tensors, kwargs: dict):
        """Decode over a fragmented paged cache: q (B, 1, Hq, D), pages, the block table and ``seqused_k``."""
        device = tensors.q.device
        table = PageTable.fragmented(case.lens_kv, case.page_size, seed=case_page_seed(case.case_id), device=device)
        k_pages, v_pages = (table.scatter(token_rows(t.detach())) for t in (tensors.k, tensors.v))
        q = token_rows(tensors.q.detach()).unsqueeze(1).contiguous()  # (B, 1, Hq, D): one token per request
        block_table = table.block_table()
        seqused_k = torch.tensor(case.lens_kv, dtype=torch.int32, device=device)
        func = self._varlen()
        return lambda: func(q, k_pages, v_pages, seqused_k=seqused_k, page_table=block_table, **kwargs)

    def output(self, case: Case, result) -> torch.Tensor:
        out = result[0] if isinstance(result, tuple) else result
        if case.page_size:  # (B, 1, Hq, Dv): one row per request
            return to_case_layout(case, out[:, 0]) if case.ragged else from_bshd(out)
        if case.ragged or case.variant == "document":
            return to_case_layout(case, out)
        return from_bshd(out)
