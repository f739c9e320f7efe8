"""FlashInfer (``flashinfer-python``): single and batch (ragged) prefill, paged-KV batch decode, MLA decode.

Layouts (all conversions happen in :meth:`build`, outside the timed call):

* prefill, batch 1: ``single_prefill_with_kv_cache`` on NHD tensors q (Sq, Hq, D), k/v (Skv, Hkv, D);
* prefill, batch > 1: ``BatchPrefillWithRaggedKVCacheWrapper`` on the batch flattened to ragged NHD
  (B*S, H, D) with ``indptr = [0, S, 2S, ...]``; ``plan()`` runs in :meth:`build`;
* decode (one query token per request): ``BatchDecodeWithPagedKVCacheWrapper`` over a paged NHD
  cache, k/v pages (num_pages, page_size, Hkv, D), a CSR page table (``indptr``, ``indices``,
  ``last_page_len``) built in :meth:`build`; the timed call is only ``wrapper.run(q, (k, v))``.
  ``Case.page_size`` 0 (contiguous) runs with :data:`DEFAULT_PAGE_SIZE` = 16, the page size of
  vLLM's and FlashInfer's own benchmarks; the row keeps ``page_size = 0``.

Tensor cores in decode: on when the GQA group (Hq / Hkv) exceeds 4, the threshold SGLang's
``should_use_tensor_core`` and vLLM use for fp16/bf16 KV (the CUDA-core decode kernel keeps up
below it). SGLang also turns them on for every fp8 KV cache; here the group rule alone decides,
so ``flashinfer`` and ``flashinfer-fp8kv`` rows of one case run the same kernel family.

FP8 KV (``flashinfer-fp8kv``): q stays in the case dtype, K and V are e4m3 with one per-tensor
float ``k_scale``/``v_scale`` each (``x ~= x8 * scale``, scale = amax / 448). FlashInfer folds
``k_scale`` into the softmax scale and multiplies the output by ``v_scale`` after the kernel
(``BatchDecodeWithPagedKVCacheWrapper.run`` in 0.7.4: ``sm_scale *= k_scale`` ... ``out *= v_scale``),
so that multiply is part of the timed call, as it is for FlashInfer's users.

MLA absorbed decode (``flashinfer-mla``): ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` over a paged
latent cache. The harness's MLA case (``attnbench.case``) is already absorbed: q (B, H, 1, d_c + d_h^R),
one latent "head" k (B, 1, Skv, d_c + d_h^R) whose first d_c dims are also the value. :meth:`build` splits
them into the wrapper's four tensors, q_nope (B, H, d_c), q_pe (B, H, d_h^R), ckv pages
(num_pages, page_size, d_c) and kpe pages (num_pages, page_size, d_h^R), and plans with ``qo_indptr =
[0, 1, ..., B]``, the CSR page table and ``kv_len_arr`` (the KV length per request, in place of
``last_page_len``). ``v`` is not read: the kernel takes the value from the ckv pages. ``sm_scale`` is the
case's scale, the one the harness's fp64 reference uses (``Case.scale`` = 1/sqrt(d_c + d_h^R)); FlashInfer's
own tests pass 1/sqrt(128 + 64), DeepSeek-V2's head dim before absorption, which the case does not carry.
The kernel takes any float scale, so the choice changes the numbers compared, not the work. The wrapper
picks its kernel with ``backend="auto"``: ``fa3`` (``mla::hopper::BatchMLAPageAttentionHopperKernel``) on
sm_90 with CUDA >= 12.3, else ``fa2`` (``mla::BatchMLAPagedAttentionKernel``); either is one cooperative
launch that also merges the split-KV partial outputs (``flashinfer/mla.py``, ``include/flashinfer/attention/
mla_hopper.cuh``, ``mla.cuh``).

JIT: FlashInfer compiles each kernel variant on first use (``plan()`` for the wrappers, the first
call for single prefill); :meth:`build` triggers both, so the harness's ``setup_s`` (build plus
first call) holds the compile time and the timed calls hold none. Arguments are passed by
keyword: 0.7.x added ``scale_q``/``scale_k``/``scale_v``/``o_dtype`` positionally after ``v`` in
``single_prefill_with_kv_cache`` and deprecated positional ``plan()`` options.
"""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.case import Case, Tensors
from attnbench.kernels.flash_attn import quantize_e4m3
from attnbench.kernels.registry import Backend, register

DEFAULT_PAGE_SIZE = 16
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace (split-k partials)
TENSOR_CORE_GROUP = 4  # decode uses tensor cores when Hq / Hkv > 4 (SGLang, vLLM)
HEAD_DIMS = (64, 128, 256)
# FlashInfer's MLA kernels as built and tested (tests/attention/test_deepseek_mla.py): latent d_c 512 and RoPE
# dim d_h^R 64 (DeepSeek-V2/V3), with DeepSeek's 128 query heads split over 1-8 GPUs
MLA_DIMS = (512, 64)
MLA_HEADS = (16, 32, 64, 128)


def to_ragged(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> contiguous (B*S, H, D): FlashInfer's ragged NHD layout."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d).contiguous()


def from_ragged(x: torch.Tensor, batch: int) -> torch.Tensor:
    """(B*S, H, D) -> (B, H, S, D), a view."""
    return x.unflatten(0, (batch, -1)).transpose(1, 2)


def indptr(batch: int, seq: int, device="cpu") -> torch.Tensor:
    """CSR offsets of ``batch`` equal segments of ``seq`` rows: [0, seq, 2*seq, ...], int32."""
    return torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class PageTable:
    """FlashInfer's CSR page table: request b owns pages ``indices[indptr[b]:indptr[b+1]]``.

    The last page of each request holds ``last_page_len`` tokens (1..page_size); the rest of it
    is padding the kernel never reads.
    """

    indptr: torch.Tensor  # (B + 1,) int32
    indices: torch.Tensor  # (total pages,) int32
    last_page_len: torch.Tensor  # (B,) int32
    page_size: int

    @staticmethod
    def contiguous(batch: int, seq_kv: int, page_size: int, device="cpu") -> "PageTable":
        """Every request ``seq_kv`` tokens long, its pages numbered consecutively."""
        if page_size < 1 or seq_kv < 1:
            raise ValueError(f"page_size={page_size} and seq_kv={seq_kv} are not allowed; allowed: positive integers")
        pages = -(-seq_kv // page_size)
        last = seq_kv - (pages - 1) * page_size
        return PageTable(indptr(batch, pages, device), torch.arange(batch * pages, dtype=torch.int32, device=device),
                         torch.full((batch,), last, dtype=torch.int32, device=device), page_size)

    @property
    def batch(self) -> int:
        return self.last_page_len.numel()

    @property
    def pages_per_request(self) -> int:
        return int(self.indptr[1] - self.indptr[0])

    @property
    def num_pages(self) -> int:
        return int(self.indices.max()) + 1


def to_paged(x: torch.Tensor, table: PageTable) -> torch.Tensor:
    """(B, H, S, D) -> pages (num_pages, page_size, H, D) placed where ``table`` says; padding is zero.

    Assumes every request has ``table.pages_per_request`` pages (what :meth:`PageTable.contiguous` builds).
    """
    b, h, s, d = x.shape
    per, size = table.pages_per_request, table.page_size
    padded = torch.zeros(b, per * size, h, d, dtype=x.dtype, device=x.device)
    padded[:, :s] = x.transpose(1, 2)
    pages = torch.zeros(table.num_pages, size, h, d, dtype=x.dtype, device=x.device)
    pages[table.indices.long().to(x.device)] = padded.reshape(b * per, size, h, d)
    return pages


def from_paged(pages: torch.Tensor, table: PageTable, seq_kv: int) -> torch.Tensor:
    """The inverse of :func:`to_paged`: (B, H, seq_kv, D) gathered through the page table."""
    per, size = table.pages_per_request, table.page_size
    rows = pages[table.indices.long().to(pages.device)].reshape(table.batch, per * size, *pages.shape[2:])
    return rows[:, :seq_kv].transpose(1, 2)


def to_mla_pages(k: torch.Tensor, rank: int, table: PageTable) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA latent cache (B, 1, S, d_c + d_h^R) -> contiguous ckv (num_pages, page_size, d_c) and
    kpe (num_pages, page_size, d_h^R) pages placed where ``table`` says; padding is zero."""
    pages = to_paged(k, table)[:, :, 0]  # (num_pages, page_size, d_c + d_h^R): the one latent head
    return pages[..., :rank].contiguous(), pages[..., rank:].contiguous()


def use_tensor_cores(heads_q: int, heads_kv: int) -> bool:
    return heads_q // heads_kv > TENSOR_CORE_GROUP


def _installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


@functools.cache
def _flashinfer():
    """The imported module, or the import error text."""
    try:
        return importlib.import_module("flashinfer"), ""
    except Exception as err:  # a broken install (CUDA mismatch, missing .so) is unavailable, not a crash
        return None, f"{type(err).__name__}: {err}"


def _workspace(device) -> torch.Tensor:
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # zero before first use (FlashInfer docs)


class _FlashInfer(Backend):
    family = "fused"
    install_hint = "pip install flashinfer-python"
    # every FlashInfer kernel lives in namespace flashinfer:: (SinglePrefillWithKVCacheKernel,
    # BatchPrefillWithRaggedKVCacheKernel, Hopper PrefillWithKVCacheKernel, BatchDecodeWithPagedKVCacheKernel)
    kernel_pattern = r"flashinfer|PrefillWith|DecodeWith"
    quantize_kv = False

    def version(self) -> str:
        try:
            return importlib.metadata.version("flashinfer-python")
        except importlib.metadata.PackageNotFoundError:
            return ""

    def available(self) -> tuple[bool, str]:
        if not _installed():
            return False, f"flashinfer is not installed; install: {self.install_hint}"
        if not torch.cuda.is_available():
            return False, f"{self.name} needs CUDA (torch {torch.__version__} sees no CUDA device)"
        if torch.cuda.get_device_capability() < (8, 0):
            return False, f"{self.name} here needs compute capability >= 8.0"
        module, error = _flashinfer()
        if module is None:
            return False, f"flashinfer failed to import ({error[:200]}); install: {self.install_hint}"
        return True, ""

    def _common_supports(self, case: Case) -> tuple[bool, str]:
        if case.dtype not in ("fp16", "bf16"):
            return False, f"{self.name} takes fp16 or bf16 (case dtype {case.dtype})"
        if case.layout == "mla":
            return False, f"{self.name} does not map MLA; flashinfer-mla does (BatchMLAPagedAttentionWrapper)"
        if case.head_dim_qk != case.head_dim_v or case.head_dim_qk not in HEAD_DIMS:
            return False, f"{self.name} here runs head_dim in {HEAD_DIMS} with head_dim_qk == head_dim_v"
        if case.has_backward:
            return False, "FlashInfer is inference-only: it has no backward"
        if case.mode == "decode" and case.seq_q != 1:
            return False, "the paged decode wrapper takes one query token per request (seq_q=1)"
        return True, ""

    def _decode(self, q, k, v, *, scale: float, page_size: int) -> tuple[Callable, Callable]:
        """Paged decode runner over BHSD q (B, Hq, 1, D), k/v (B, Hkv, Skv, D): (timed call, output -> BHSD)."""
        fi = _flashinfer()[0]
        b, hq, _, d = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        table = PageTable.contiguous(b, skv, page_size, device=q.device)
        k_pages, v_pages = to_paged(k, table), to_paged(v, table)
        k_scale = v_scale = None
        if self.quantize_kv:  # after paging: only elementwise ops touch fp8 (zero padding leaves amax alone)
            (k_pages, k_scale), (v_pages, v_scale) = (quantize_e4m3(t, dims=(0, 1, 2, 3)) for t in (k_pages, v_pages))
            k_scale, v_scale = float(k_scale), float(v_scale)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), kv_layout="NHD",
                                                        use_tensor_cores=use_tensor_cores(hq, hkv))
        wrapper.plan(table.indptr, table.indices, table.last_page_len, hq, hkv, d, page_size,
                     q_data_type=q.dtype, kv_data_type=k_pages.dtype, sm_scale=scale)
        q_nhd = q[:, :, 0].contiguous()  # (B, Hq, D)
        run = functools.partial(wrapper.run, q_nhd, (k_pages, v_pages), k_scale=k_scale, v_scale=v_scale)
        return run, lambda out: out.unsqueeze(2)

    def _prefill(self, q, k, v, *, causal: bool, scale: float) -> tuple[Callable, Callable]:
        fi = _flashinfer()[0]
        b, hq, sq, d = q.shape
        hkv, skv = k.shape[1], k.shape[2]
        qr, kr, vr = to_ragged(q), to_ragged(k), to_ragged(v)
        if b == 1:
            run = functools.partial(fi.single_prefill_with_kv_cache, qr, kr, vr, causal=causal, sm_scale=scale,
                                    kv_layout="NHD")
        else:
            wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(q.device), kv_layout="NHD")
            wrapper.plan(indptr(b, sq, q.device), indptr(b, skv, q.device), hq, hkv, d, head_dim_vo=v.shape[-1],
                         causal=causal, sm_scale=scale, q_data_type=q.dtype, kv_data_type=k.dtype)
            run = functools.partial(wrapper.run, qr, kr, vr)
        return run, lambda out: from_ragged(out, b)

    def _runner(self, q, k, v, *, causal: bool, scale: float, page_size: int | None):
        if q.shape[2] == 1:  # one query token per request: the paged decode path
            return self._decode(q, k, v, scale=scale, page_size=page_size or DEFAULT_PAGE_SIZE)
        return self._prefill(q, k, v, causal=causal, scale=scale)

    def attention(self, q, k, v, *, causal: bool, scale: float, page_size: int | None = None):
        """BHSD in and out; the same path :meth:`build` times (decode pages with ``page_size``, default 16)."""
        run, to_bhsd = self._runner(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale,
                                    page_size=page_size)
        return to_bhsd(run()).to(q.dtype)

    def build(self, case: Case, tensors: Tensors):
        run, _ = self._runner(tensors.q.detach(), tensors.k.detach(), tensors.v.detach(), causal=case.causal,
                              scale=case.scale, page_size=case.page_size)
        run()  # JIT-compiles single prefill here (wrappers compiled in plan()), so setup_s holds it
        return run


@register
class FlashInfer(_FlashInfer):
    name = "flashinfer"

    def supports(self, case: Case) -> tuple[bool, str]:
        return self._common_supports(case)


@register
class FlashInferFP8KV(_FlashInfer):
    """Paged decode with an e4m3 KV cache and per-tensor scales; q and output in the case dtype."""

    name = "flashinfer-fp8kv"
    compute_dtype = "fp8"
    fp8_inputs = ("k", "v")  # the paged cache; q is read in the case dtype
    quantize_kv = True

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.mode != "decode":
            return False, f"{self.name} is the fp8-KV decode path (case mode {case.mode})"
        return self._common_supports(case)


def _mla_wrapper_class():
    """``flashinfer.mla.BatchMLAPagedAttentionWrapper``, or None and why not."""
    try:
        return importlib.import_module("flashinfer.mla").BatchMLAPagedAttentionWrapper, ""
    except Exception as err:  # an older or broken install: unavailable, not a crash
        return None, f"{type(err).__name__}: {err}"


@register
class FlashInferMLA(_FlashInfer):
    """Absorbed MLA decode on a paged latent cache (ckv + kpe pages); q and output in the case dtype."""

    name = "flashinfer-mla"
    # mla::hopper::BatchMLAPageAttentionHopperKernel (fa3, sm_90) or mla::BatchMLAPagedAttentionKernel (fa2)
    kernel_pattern = r"BatchMLAPaged?Attention"

    def available(self) -> tuple[bool, str]:
        ok, reason = super().available()
        if not ok:
            return ok, reason
        wrapper, error = _mla_wrapper_class()
        if wrapper is None:
            return False, (f"flashinfer.mla.BatchMLAPagedAttentionWrapper is missing ({error[:200]}); "
                           f"install: {self.install_hint}")
        return True, ""

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.mode != "decode" or case.layout != "mla":
            return False, f"{self.name} is MLA absorbed decode (case mode {case.mode}, layout {case.layout})"
        if case.seq_q != 1:
            return False, f"{self.name} here takes one query token per request (seq_q=1)"
        if case.dtype not in ("fp16", "bf16"):
            return False, f"{self.name} takes fp16 or bf16 (case dtype {case.dtype})"
        dims = (case.head_dim_v, case.head_dim_qk - case.head_dim_v)
        if dims != MLA_DIMS:
            return False, (f"FlashInfer's MLA kernels take d_c {MLA_DIMS[0]} + d_h^R {MLA_DIMS[1]} "
                           f"(case {dims[0]} + {dims[1]})")
        if case.heads_q not in MLA_HEADS:
            return False, f"{self.name} here runs heads_q in {MLA_HEADS} (case {case.heads_q})"
        return True, ""

    def _runner(self, q, k, v, *, causal: bool, scale: float, page_size: int | None):
        """Paged MLA runner over BHSD q (B, H, 1, d_c + d_h^R), latent k (B, 1, Skv, d_c + d_h^R) and v, its
        first d_c dims: (timed call, output -> BHSD)."""
        b, h, _, _ = q.shape
        rank, skv = v.shape[-1], k.shape[2]
        if not torch.equal(v, k[..., :rank]):
            raise ValueError(f"{self.name} reads the value from the latent: v must equal k[..., :{rank}]")
        page_size = page_size or DEFAULT_PAGE_SIZE
        table = PageTable.contiguous(b, skv, page_size, device=q.device)
        ckv, kpe = to_mla_pages(k, rank, table)
        q_nope, q_pe = q[:, :, 0, :rank].contiguous(), q[:, :, 0, rank:].contiguous()  # (B, H, d_c), (B, H, d_h^R)
        wrapper = _mla_wrapper_class()[0](_workspace(q.device), backend="auto")
        kv_len = torch.full((b,), skv, dtype=torch.int32, device=q.device)
        wrapper.plan(indptr(b, 1, q.device), table.indptr, table.indices, kv_len, num_heads=h, head_dim_ckv=rank,
                     head_dim_kpe=kpe.shape[-1], page_size=page_size, causal=causal, sm_scale=scale,
                     q_data_type=q.dtype, kv_data_type=ckv.dtype)
        run = functools.partial(wrapper.run, q_nope, q_pe, ckv, kpe)
        return run, lambda out: out.unsqueeze(2)  # (B, H, d_c) -> (B, H, 1, d_c)
