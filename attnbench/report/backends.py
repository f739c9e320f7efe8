"""Backend tables in the style of the FlashAttention-3 README: backends down, sequence lengths across.

The FA3 README times every length with the same number of tokens (batch x sequence length held
constant: B16 at 2k, B2 at 16k), so every column moves the same bytes and a column's rise or fall
is the kernel's, not the batch's. These tables take the rows of a sweep's grids built that way
(``grids:`` lists, ``config/sweeps/h200-backends.yaml``); a sweep without such a grid gets a
table that says so.

Tables (group ``backends`` of the microbench stage)
  fa3_fwd       forward TFLOP/s per backend x length, one block per (causal, dtype, layout, heads, head dim)
  fa3_fwd_bwd   forward + backward, the same blocks
  fa3_decode    decode: bytes moved / median time as a fraction of the measured copy bandwidth, per
                backend (and KV page size) x KV length, one block per (layout, heads, head dim, dtype);
                a backend's fp8 KV cache counts at one byte per element (its bytes_model)

A cell without a measurement shows the row's status (``unavailable``: fa2/fa3 without wheels). The
Markdown shows one small table per block, under a line naming it; the CSV holds every block.
"""
from __future__ import annotations

import pandas as pd

from attnbench.report.artifacts import Table, note_table
from attnbench.report.tables import FLOP_CONVENTION, _cell_pivot, ceilings_text, device_text

GROUP = "backends"
TABLE_NAMES = ("fa3_fwd", "fa3_fwd_bwd", "fa3_decode")
# The case fields that make one block of a table (the length is the column, the backend the row).
PREFILL_BLOCK = ("causal", "dtype", "layout", "heads_q", "heads_kv", "head_dim_qk")
DECODE_BLOCK = ("layout", "heads_q", "heads_kv", "head_dim_qk", "dtype")
BLOCK_LABELS = {"causal": "causal", "dtype": "dtype", "layout": "layout", "heads_q": "Hq", "heads_kv": "Hkv",
                "head_dim_qk": "D", "tokens": "B·S"}


def length_label(n: int) -> str:
    """512, 1k, 16k: lengths as the FA3 README writes them."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def constant_tokens(df: pd.DataFrame, block: tuple[str, ...]) -> pd.DataFrame:
    """The rows of each block that hold batch x length constant over two lengths or more (column ``tokens``).

    A block may mix totals (a fixed-batch grid beside a constant-tokens one); the total that spans
    the most lengths is kept, the larger total on a tie.
    """
    df = df.assign(tokens=df["batch"] * df["seq_kv"])
    kept = []
    for _, rows in df.groupby(list(block), observed=True, sort=False, dropna=False):
        spans = rows.groupby("tokens")["seq_kv"].nunique()
        spans = spans[spans >= 2]
        if len(spans):
            best = spans[spans == spans.max()].index.max()
            kept.append(rows[rows["tokens"] == best])
    return pd.concat(kept) if kept else df.iloc[:0]


def _lengths_across(values: pd.DataFrame, display: pd.DataFrame) -> None:
    """``S=4096`` columns (already in length order) -> ``4k``."""
    values.columns = display.columns = [length_label(int(c.split("=", 1)[1])) for c in values.columns]


def prefill_table(df: pd.DataFrame, mode: str) -> Table:
    name = f"fa3_{mode}"
    caption = (f"{mode} TFLOP/s (median time) per backend and sequence length S = Sq = Skv at constant batch x "
               f"length (B·S), in the FA3 README's layout: one block per causal, dtype, layout, heads and head "
               f"dim. {FLOP_CONVENTION}. Device: {device_text(df)}.")
    sub = constant_tokens(df[df["mode"] == mode], PREFILL_BLOCK)
    if sub.empty:
        return note_table(name, caption, f"no {mode} grid at constant batch x length in this sweep", GROUP)
    values, display = _cell_pivot(sub, "tflops", [*PREFILL_BLOCK, "tokens", "backend"], "seq_kv", "S")
    _lengths_across(values, display)
    return _named(Table(name, caption, values, display, group=GROUP))


def decode_table(df: pd.DataFrame) -> Table:
    caption = ("Decode: bytes moved (bytes_model: the KV cache, q and o; an fp8 cache at one byte per element) "
               "over median time, as a fraction of the measured copy bandwidth, per backend (and KV page size) "
               "and KV length at constant batch x KV length; KV bytes per token follow DeepSeek-V2 Table 1. "
               f"{ceilings_text(df)}. Device: {device_text(df)}.")
    sub = constant_tokens(df[df["mode"] == "decode"], DECODE_BLOCK)
    if sub.empty:
        return note_table("fa3_decode", caption, "no decode grid at constant batch x KV length in this sweep", GROUP)
    sub = sub.assign(copy_fraction=sub["gbps"] * 1e9 / sub["peak_bytes_per_s"],
                     backend=[b + (f" (page {int(p)})" if p else "") for b, p in zip(sub["backend"], sub["page_size"])])
    values, display = _cell_pivot(sub, "copy_fraction", [*DECODE_BLOCK, "tokens", "backend"], "seq_kv", "Skv")
    _lengths_across(values, display)
    return _named(Table("fa3_decode", caption, values, display, group=GROUP))


def _named(table: Table) -> Table:
    """Row keys named as the README writes them (Hq, D, B·S); each block one small table in Markdown."""
    names = [BLOCK_LABELS.get(n, n) for n in table.values.index.names]
    table.values.index.names = table.display.index.names = names
    table.blocks = tuple(n for n in names if n != "backend")
    return table


def build_tables(df: pd.DataFrame) -> list[Table]:
    return [prefill_table(df, "fwd"), prefill_table(df, "fwd_bwd"), decode_table(df)]
