"""Byte ledgers: KV-cache bytes per token per layout, checked against measured decode; bytes per training step.

KV-cache elements per token per layer (DeepSeek-V2, Table 1; n_h query heads of
dim d_h, n_g KV groups, MLA latent d_c and decoupled RoPE key d_h^R)::

    MHA                 2 * n_h * d_h
    GQA                 2 * n_g * d_h
    MQA                 2 * d_h
    MLA, absorbed       d_c + d_h^R          (the latent and the shared RoPE key; the value is the latent)
    MLA, naive          n_h * (d_h + d_h^R) + n_h * d_h
                        (per-head keys with their RoPE part and per-head values, as the ``naive``
                        path of deepseek-ai/DeepSeek-V3 ``inference/model.py`` class MLA caches them)

Bytes = elements x element size (bf16 2, fp8 1). Table ``kv_cache`` gives them per
layer, per model (x layers) and per sequence at each context length. Table
``kv_measured`` sets them against the DRAM bytes an ``attnbench hbm`` decode row
read, per cached token, with the decode time per step. Table ``pretrain`` gives the
attention op's HBM bytes per training step per layout (forward + backward
:func:`attnbench.bench.conventions.bytes_model`, per layer and x layers): a number
the literature does not publish. MLA trains in its up-projected form (per-head
keys of d_h + d_h^R and values of d_h), so its training row is MHA-shaped with those dims.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.bench import conventions
from attnbench.bench.results import MEASURED
from attnbench.case import Case
from attnbench.errors import ConfigError

LEDGER_COLUMNS = [
    "table", "name", "layout", "variant", "dtype", "formula", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v",
    "elements_per_token_layer", "bytes_per_token_layer", "layers", "bytes_per_token_model", "context",
    "kv_bytes_per_seq", "vs_mha", "gqa_equivalent_groups",
    # kv_measured
    "backend", "case_id", "batch", "seq_kv", "status", "reason", "bytes_read", "measured_bytes_per_token_layer",
    "ratio_measured_formula", "decode_ms_per_step", "decode_us_per_token", "frac_of_bw", "note",
    # pretrain
    "family", "seq", "causal", "bytes_fwd_layer", "bytes_fwd_bwd_layer", "bytes_per_step", "bytes_per_token_step",
    "flops_per_step", "intensity",
]


@dataclass(frozen=True)
class LedgerShape:
    """The model the ledger is for (``hbm.ledger`` in the config)."""

    heads: int = 32
    head_dim: int = 128
    gqa_kv_heads: tuple[int, ...] = (2, 4, 8, 16)
    mla_rank: int = 512
    mla_rope_dim: int = 64
    layers: int = 32
    kv_dtypes: tuple[str, ...] = ("bf16", "fp8")
    contexts: tuple[int, ...] = (4096, 16384, 65536, 131072)
    pretrain_batch: int = 8
    pretrain_seq: int = 4096
    pretrain_causal: bool = True
    pretrain_dtype: str = "bf16"
    pretrain_families: tuple[str, ...] = ("fused", "eager")

    @staticmethod
    def from_config(section: dict) -> "LedgerShape":
        p = section["pretrain"]
        shape = LedgerShape(section["heads"], section["head_dim"], tuple(section["gqa_kv_heads"]), section["mla_rank"],
                            section["mla_rope_dim"], section["layers"], tuple(section["kv_dtypes"]),
                            tuple(section["contexts"]), p["batch"], p["seq"], p["causal"], p["dtype"],
                            tuple(p["families"]))
        for n_g in shape.gqa_kv_heads:
            if shape.heads % n_g:
                divisors = [d for d in range(1, shape.heads + 1) if shape.heads % d == 0]
                raise ConfigError(f"hbm.ledger.gqa_kv_heads: {n_g} is not allowed with heads={shape.heads}; "
                                  f"allowed: a divisor of heads ({', '.join(map(str, divisors))})")
        return shape


@dataclass(frozen=True)
class CacheLayout:
    """One way to cache K/V: its name, the head layout it belongs to, and elements per token per layer."""

    name: str
    layout: str
    variant: str
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    formula: str
    elements: int


def cache_layouts(s: LedgerShape) -> list[CacheLayout]:
    """MHA, GQA per n_g, MQA, MLA absorbed and naive, with their DeepSeek-V2 Table 1 element counts."""
    n_h, d_h, d_c, d_r = s.heads, s.head_dim, s.mla_rank, s.mla_rope_dim
    out = [CacheLayout("mha", "mha", "", n_h, d_h, d_h, "2·n_h·d_h", 2 * n_h * d_h)]
    for n_g in sorted(set(s.gqa_kv_heads) - {1, n_h}, reverse=True):
        out.append(CacheLayout(f"gqa-{n_g}", "gqa", f"n_g={n_g}", n_g, d_h, d_h, "2·n_g·d_h", 2 * n_g * d_h))
    out.append(CacheLayout("mqa", "mqa", "", 1, d_h, d_h, "2·d_h", 2 * d_h))
    out.append(CacheLayout("mla-absorbed", "mla", "absorbed", 1, d_c + d_r, d_c, "d_c + d_h^R", d_c + d_r))
    out.append(CacheLayout("mla-naive", "mla", "naive", n_h, d_h + d_r, d_h, "n_h·(d_h + d_h^R) + n_h·d_h",
                           n_h * (d_h + d_r) + n_h * d_h))
    return out


def kv_cache_table(s: LedgerShape) -> list[dict]:
    mha = 2 * s.heads * s.head_dim
    rows = []
    for c in cache_layouts(s):
        for dtype in s.kv_dtypes:
            per_layer = c.elements * conventions.ELEMENT_BYTES[dtype]
            for context in s.contexts:
                rows.append(dict(table="kv_cache", name=c.name, layout=c.layout, variant=c.variant, dtype=dtype,
                                 formula=c.formula, heads_q=s.heads, heads_kv=c.heads_kv, head_dim_qk=c.head_dim_qk,
                                 head_dim_v=c.head_dim_v, elements_per_token_layer=c.elements,
                                 bytes_per_token_layer=per_layer, layers=s.layers,
                                 bytes_per_token_model=per_layer * s.layers, context=context,
                                 kv_bytes_per_seq=per_layer * s.layers * context, vs_mha=c.elements / mha,
                                 gqa_equivalent_groups=c.elements / (2 * s.head_dim)))
    return rows


def _case_of(row: dict) -> Case:
    return Case(**{f: (int(row[f]) if f not in ("mode", "layout", "dtype", "causal") else row[f])
                   for f in ("mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v",
                             "seq_q", "seq_kv", "causal", "dtype", "page_size")})


def _text(value) -> str:
    return "" if value is None or pd.isna(value) else str(value)


def _name(case: Case) -> str:
    return {"gqa": f"gqa-{case.heads_kv}", "mla": "mla-absorbed"}.get(case.layout, case.layout)


def kv_measured_table(hbm: pd.DataFrame) -> list[dict]:
    """Decode rows of an hbm table: formula vs measured bytes per cached token, and time per step."""
    rows = []
    decode = hbm[(hbm["mode"] == "decode")] if len(hbm) else hbm
    for r in decode.to_dict("records"):
        case = _case_of(r)
        tokens = case.batch * case.seq_kv
        # an fp8 backend (e.g. flashinfer-fp8kv) caches K and V in fp8 whatever the case dtype
        kv_dtype = "fp8" if _text(r.get("compute_dtype")) == "fp8" else case.dtype
        kv_bytes = conventions.kv_cache_bytes(case, ("k", "v") if kv_dtype == "fp8" else ())
        formula = kv_bytes / tokens  # per token per layer: one layer's cache
        ok = r["status"] == "ok"
        ms = r.get("ms_median", float("nan"))
        timed = _text(r.get("time_status")) in MEASURED and pd.notna(ms)
        peak_bw = r.get("peak_bytes_per_s", float("nan"))
        note = ""
        if case.layout == "mla":
            note = (f"harness inputs keep V as a copy of the latent's first d_c={case.head_dim_v} dims; a backend "
                    f"reading K and V moves {(case.head_dim_qk + case.head_dim_v) / case.head_dim_qk:.2f}x the latent")
        rows.append(dict(
            table="kv_measured", name=_name(case), layout=case.layout,
            variant="absorbed" if case.layout == "mla" else "",
            dtype=kv_dtype, heads_q=case.heads_q, heads_kv=case.heads_kv, head_dim_qk=case.head_dim_qk,
            head_dim_v=case.head_dim_v, bytes_per_token_layer=formula,
            elements_per_token_layer=formula / conventions.ELEMENT_BYTES[kv_dtype], context=case.seq_kv,
            backend=r["backend"], case_id=r["case_id"], batch=case.batch, seq_kv=case.seq_kv, status=r["status"],
            reason=_text(r.get("reason")),
            bytes_read=r.get("bytes_read") if ok else float("nan"),
            measured_bytes_per_token_layer=r["bytes_read"] / tokens if ok else float("nan"),
            ratio_measured_formula=r["bytes_read"] / tokens / formula if ok else float("nan"),
            decode_ms_per_step=ms if timed else float("nan"),
            decode_us_per_token=ms * 1e3 / case.batch if timed else float("nan"),
            frac_of_bw=(kv_bytes / (ms / 1e3) / peak_bw
                        if timed and pd.notna(peak_bw) and peak_bw > 0 else float("nan")),
            note=note))
    return rows


def pretrain_table(s: LedgerShape) -> list[dict]:
    """Attention-op HBM bytes per training step per layout, from the byte model (forward + backward)."""
    rows = []
    layouts = [(c.name, c.layout, c.variant, c.heads_kv, s.head_dim, s.head_dim)
               for c in cache_layouts(s) if c.layout != "mla"]
    # MLA trains up-projected: n_h heads with keys of d_h + d_h^R and values of d_h (DeepSeek-V2 §2.1.3)
    layouts.append(("mla", "mha", "training (up-projected)", s.heads, s.head_dim + s.mla_rope_dim, s.head_dim))
    tokens = s.pretrain_batch * s.pretrain_seq
    for name, layout, variant, heads_kv, d_qk, d_v in layouts:
        base = dict(mode="fwd_bwd", layout=layout, batch=s.pretrain_batch, heads_q=s.heads, heads_kv=heads_kv,
                    head_dim_qk=d_qk, head_dim_v=d_v, seq_q=s.pretrain_seq, seq_kv=s.pretrain_seq,
                    causal=s.pretrain_causal, dtype=s.pretrain_dtype)
        train, forward = Case(**base), Case(**{**base, "mode": "fwd"})
        for family in s.pretrain_families:
            step_layer = conventions.bytes_model(train, family)
            flops = conventions.flops(train) * s.layers
            rows.append(dict(table="pretrain", name=name, layout=layout, variant=variant, dtype=s.pretrain_dtype,
                             heads_q=s.heads, heads_kv=heads_kv, head_dim_qk=d_qk, head_dim_v=d_v, layers=s.layers,
                             family=family, batch=s.pretrain_batch, seq=s.pretrain_seq, causal=s.pretrain_causal,
                             bytes_fwd_layer=conventions.bytes_model(forward, family), bytes_fwd_bwd_layer=step_layer,
                             bytes_per_step=step_layer * s.layers, bytes_per_token_step=step_layer * s.layers / tokens,
                             flops_per_step=flops, intensity=conventions.intensity(flops, step_layer * s.layers)))
    return rows


def build_ledger(shape: LedgerShape, hbm: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = kv_cache_table(shape) + (kv_measured_table(hbm) if hbm is not None else []) + pretrain_table(shape)
    df = pd.DataFrame(rows, columns=LEDGER_COLUMNS)
    text = ("table", "name", "layout", "variant", "dtype", "formula", "backend", "case_id", "status", "reason", "note",
            "family")
    for col in LEDGER_COLUMNS:
        if col in text:
            df[col] = df[col].astype("string")
        elif col == "causal":
            df[col] = df[col].astype("boolean")
        else:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    return df
