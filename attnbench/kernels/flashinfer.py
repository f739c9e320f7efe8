"""FlashInfer (``flashinfer-python``): single and batch (ragged) prefill, paged-KV batch decode, MLA decode.

Layouts (all conversions happen in :meth:`build`, outside the timed call):

* prefill, batch 1: ``single_prefill_with_kv_cache`` on NHD tensors q (Sq, Hq, D), k/v (Skv, Hkv, D);
* prefill, batch > 1, ragged batches, chunked prefill and the ``document`` variant:
  ``BatchPrefillWithRaggedKVCacheWrapper`` on the varlen view (:mod:`attnbench.kernels.varlen`): token
  rows (tokens, H, D) with the segments' real ``qo_indptr``/``kv_indptr``; ``plan()`` runs in :meth:`build`;
  FlashInfer's causal mask is bottom-right aligned per request;
* decode (one query token per request): ``BatchDecodeWithPagedKVCacheWrapper`` over a paged NHD
  cache, k/v pages (num_pages, page_size, Hkv, D), a CSR page table (``indptr``, ``indices``,
  ``last_page_len``) built in :meth:`build` from a shuffled free list
  (:meth:`attnbench.workloads.pages.PageTable.fragmented`, seeded per case); the timed call is only
  ``wrapper.run(q, (k, v))``. ``Case.page_size`` 0 (contiguous) runs with :data:`DEFAULT_PAGE_SIZE` =
  16, the page size of vLLM's and FlashInfer's own benchmarks; the row keeps ``page_size = 0``;
* variants through ``plan()``: ``window_left`` (sliding window), ``logits_soft_cap`` (softcap),
  ``pos_encoding_mode="ALIBI"`` (FlashInfer's own slopes, ``get_alibi_slopes``, those of
  :func:`attnbench.workloads.variants.alibi_slopes`) and, for ``prefix_lm``, a flattened boolean
  ``custom_mask`` (packed into bits inside ``plan()``).

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
from typing import Callable

import torch

from attnbench.case import DTYPES, Case, Tensors
from attnbench.kernels.flash_attn import quantize_e4m3
from attnbench.kernels.registry import Backend, register
from attnbench.kernels.varlen import to_case_layout, varlen_view
from attnbench.workloads.pages import PageTable, case_page_seed, token_rows
from attnbench.workloads.variants import Semantics

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
    return token_rows(x).contiguous()


def from_ragged(x: torch.Tensor, batch: int) -> torch.Tensor:
    """(B*S, H, D) -> (B, H, S, D), a view."""
    return x.unflatten(0, (batch, -1)).transpose(1, 2)


def indptr(batch: int, seq: int, device="cpu") -> torch.Tensor:
    """CSR offsets of ``batch`` equal segments of ``seq`` rows: [0, seq, 2*seq, ...], int32."""
    return torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)


def case_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, page_size: int | None) -> Case:
    """The dense case of BHSD tensors (what :meth:`_FlashInfer.attention` runs through the built path)."""
    b, hq, sq, dqk = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[-1]
    layout = "mla" if hkv == 1 and dv < dqk else ("mha" if hq == hkv else ("mqa" if hkv == 1 else "gqa"))
    decode = sq == 1  # one query token per request: the paged decode path
    return Case(mode="decode" if decode else "fwd", layout=layout, batch=b, heads_q=hq, heads_kv=hkv,
                head_dim_qk=dqk, head_dim_v=dv, seq_q=sq, seq_kv=skv, causal=causal and not decode,
                dtype={t: n for n, t in DTYPES.items()}[q.dtype], page_size=(page_size or 0) if decode else 0)


def page_table(case: Case, device) -> PageTable:
    """The case's fragmented page table (page size 16 for a contiguous case): one layout for every backend."""
    return PageTable.fragmented(case.lens_kv, case.page_size or DEFAULT_PAGE_SIZE, seed=case_page_seed(case.case_id),
                                device=device)


def variant_plan(case: Case) -> dict:
    """``plan()`` keywords of a variant: FlashInfer's ``window_left``, ``logits_soft_cap``, ALiBi, custom mask."""
    if case.variant == "sliding_window":
        return {"window_left": case.window}
    if case.variant == "softcap":
        return {"logits_soft_cap": case.softcap}
    if case.variant == "alibi":
        return {"pos_encoding_mode": "ALIBI"}
    return {}


def prefix_lm_mask(case: Case, device) -> torch.Tensor:
    """The flattened boolean ``custom_mask`` of FlashInfer's ragged prefill: each segment's (q, kv) mask,
    row-major, segments in order ("mask layout" in FlashInfer's docs)."""
    sem = Semantics.of(case)
    parts = []
    for nq, nkv in case.segments():
        p, j = torch.arange(nq, device=device) + (nkv - nq), torch.arange(nkv, device=device)
        parts.append(sem.keep(p, j).flatten())
    return torch.cat(parts)


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

    def _decode(self, case: Case, t: Tensors, scale: float) -> Callable:
        """Paged decode: q rows (B, Hq, D), K/V pages placed by the case's fragmented page table."""
        fi = _flashinfer()[0]
        table = page_table(case, t.q.device)
        k_pages, v_pages = (table.scatter(token_rows(x.detach())) for x in (t.k, t.v))
        k_scale = v_scale = None
        if self.quantize_kv:  # after paging: only elementwise ops touch fp8 (zero padding leaves amax alone)
            (k_pages, k_scale), (v_pages, v_scale) = (quantize_e4m3(x, dims=(0, 1, 2, 3)) for x in (k_pages, v_pages))
            k_scale, v_scale = float(k_scale), float(v_scale)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(t.q.device), kv_layout="NHD",
                                                        use_tensor_cores=use_tensor_cores(case.heads_q, case.heads_kv))
        wrapper.plan(table.indptr, table.indices, table.last_page_len, case.heads_q, case.heads_kv, case.head_dim_qk,
                     table.page_size, q_data_type=t.q.dtype, kv_data_type=k_pages.dtype, sm_scale=scale,
                     **variant_plan(case))
        q_rows = token_rows(t.q.detach()).contiguous()  # (B, Hq, D): one token per request
        return functools.partial(wrapper.run, q_rows, (k_pages, v_pages), k_scale=k_scale, v_scale=v_scale)

    def _prefill(self, case: Case, t: Tensors, scale: float) -> Callable:
        """Single prefill for one dense sequence; otherwise the ragged wrapper with the segments' real indptr."""
        fi = _flashinfer()[0]
        if case.dense and case.batch == 1:
            qr, kr, vr = (to_ragged(x.detach()) for x in (t.q, t.k, t.v))
            return functools.partial(fi.single_prefill_with_kv_cache, qr, kr, vr, causal=case.causal, sm_scale=scale,
                                     kv_layout="NHD")
        view = varlen_view(case, t)
        extra = variant_plan(case)
        causal = case.implied_causal if case.variant in ("sliding_window", "alibi") else case.causal
        if case.variant == "prefix_lm":
            extra["custom_mask"] = prefix_lm_mask(case, t.q.device)
        wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(t.q.device), kv_layout="NHD")
        wrapper.plan(view.cu_q, view.cu_kv, case.heads_q, case.heads_kv, case.head_dim_qk, head_dim_vo=case.head_dim_v,
                     causal=causal, sm_scale=scale, q_data_type=t.q.dtype, kv_data_type=t.k.dtype, **extra)
        return functools.partial(wrapper.run, view.q, view.k, view.v)

    def _runner(self, case: Case, t: Tensors, scale: float) -> Callable:
        return self._decode(case, t, scale) if case.mode == "decode" else self._prefill(case, t, scale)

    def attention(self, q, k, v, *, causal: bool, scale: float, page_size: int | None = None):
        """BHSD in and out; the path :meth:`build` times (decode pages with ``page_size``, default 16)."""
        case = case_of(q, k, v, causal, page_size)
        run = self._runner(case, Tensors(q.detach(), k.detach(), v.detach()), scale)
        return self.output(case, run()).to(q.dtype)

    def output(self, case: Case, result) -> torch.Tensor:
        """Output rows (tokens, Hq, Dv) -> the case's layout."""
        return to_case_layout(case, result)

    def build(self, case: Case, tensors: Tensors):
        run = self._runner(case, tensors, case.scale)
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
        if case.variant != "none":
            return False, f"this {self.name} adapter runs no attention variants (case variant {case.variant})"
        return True, ""

    def _runner(self, case: Case, t: Tensors, scale: float) -> Callable:
        """Paged MLA over BHSD q (B, H, 1, d_c + d_h^R), the latent k (one head, d_c + d_h^R) and v, its first
        d_c dims; packed rows for a ragged batch. The pages follow the case's fragmented page table."""
        rank = case.head_dim_v
        if not torch.equal(t.v, t.k[..., :rank]):
            raise ValueError(f"{self.name} reads the value from the latent: v must equal k[..., :{rank}]")
        device = t.q.device
        table = page_table(case, device)
        pages = table.scatter(token_rows(t.k.detach()))[:, :, 0]  # (num_pages, page_size, d_c + d_h^R)
        ckv, kpe = pages[..., :rank].contiguous(), pages[..., rank:].contiguous()
        q_rows = token_rows(t.q.detach())  # (B, H, d_c + d_h^R)
        q_nope, q_pe = q_rows[..., :rank].contiguous(), q_rows[..., rank:].contiguous()
        wrapper = _mla_wrapper_class()[0](_workspace(device), backend="auto")
        kv_len = torch.tensor(case.lens_kv, dtype=torch.int32, device=device)
        wrapper.plan(indptr(case.batch, 1, device), table.indptr, table.indices, kv_len, num_heads=case.heads_q,
                     head_dim_ckv=rank, head_dim_kpe=kpe.shape[-1], page_size=table.page_size, causal=False,
                     sm_scale=scale, q_data_type=t.q.dtype, kv_data_type=ckv.dtype)
        return functools.partial(wrapper.run, q_nope, q_pe, ckv, kpe)
