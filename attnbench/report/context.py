"""Paper-shaped tables from the capability rows (one row per model variant x evaluation).

* :func:`perplexity_table` with ``window="sliding"`` follows PI's Table 1 (Chen et
  al. 2023): one row per (extension method, extended window, fine-tune steps),
  one column per evaluation length, sliding-window perplexity; with
  ``window="truncated"`` it follows YaRN's Table 1 (Peng et al. 2023): the same
  rows, perplexity of one truncated window per document.
* :func:`passkey_table`: passkey retrieval accuracy in the same shape (PI Table 4 / YaRN Table 5 style).

A cell is empty where the variant was not evaluated at that length.
"""
from __future__ import annotations

import pandas as pd

from attnbench.report.text import md_frame

ROW_KEYS = ["method", "factor", "window", "finetune_steps"]  # factor = extended window / pretraining length
LABELS = {"none": "none (extrapolation)", "linear": "PI (linear)", "ntk": "NTK-aware", "dynamic_ntk": "dynamic NTK",
          "yarn": "YaRN", "llama3": "Llama 3"}


def _pivot(df: pd.DataFrame, value: str) -> pd.DataFrame:
    if df.empty or value not in df:  # e.g. no passkey evaluation: a model too small for it
        return pd.DataFrame(columns=["method", "s", "extended to", "finetune_steps"])
    rows = df.copy()
    rows["window"] = (rows["train_len"] * rows["factor"]).round().astype(int)
    table = rows.pivot_table(index=ROW_KEYS, columns="eval_len", values=value, aggfunc="first")
    table.columns = [f"{c}" for c in table.columns]
    order = {m: i for i, m in enumerate(LABELS)}
    table = table.reset_index()
    table = table.sort_values(["finetune_steps", "method", "factor"], key=lambda s: s.map(order) if s.name == "method" else s)
    table["method"] = table["method"].map(lambda m: LABELS.get(m, m))
    return table.rename(columns={"factor": "s", "window": "extended to"}).reset_index(drop=True)


def perplexity_table(df: pd.DataFrame, window: str = "sliding") -> pd.DataFrame:
    """Perplexity by evaluation length; ``window`` is ``sliding`` (PI Table 1) or ``truncated`` (YaRN Table 1)."""
    if window not in ("sliding", "truncated"):
        raise ValueError(f"window={window!r} is not allowed; allowed: sliding, truncated")
    return _pivot(df[df["eval"] == window], "ppl")


def passkey_table(df: pd.DataFrame) -> pd.DataFrame:
    """Passkey retrieval accuracy (share of documents) by evaluation length."""
    return _pivot(df[df["eval"] == "passkey"], "accuracy")


def to_markdown(table: pd.DataFrame, floatfmt: str = ".2f") -> str:
    return md_frame(table).to_markdown(index=False, floatfmt=floatfmt)


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (mode, backend), one column per KV length; a cell is ``ms | GiB peak | bound`` or the status."""
    def cell(row) -> str:
        if row["status"] != "ok":
            return str(row["status"])
        parts = [f"{row['ms_median']:.3g} ms"]
        if pd.notna(row.get("peak_mem_bytes")):
            parts.append(f"{row['peak_mem_bytes'] / 2**30:.3g} GiB")
        if isinstance(row.get("bound"), str) and row["bound"] not in ("", "unknown"):
            parts.append(str(row["bound"]))
        return " | ".join(parts)

    rows = df.assign(cell=df.apply(cell, axis=1))
    table = rows.pivot_table(index=["mode", "backend"], columns="seq_kv", values="cell", aggfunc="first")
    table.columns = [str(int(c)) for c in table.columns]
    return table.reset_index().fillna("")


def rope_overhead_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and length: building the cos/sin tables and rotating q and k (ms)."""
    table = df.pivot_table(index="method", columns="seq", values=["tables_ms", "rotate_ms"], aggfunc="first")
    table.columns = [f"{what} @{int(seq)}" for what, seq in table.columns]
    order = {m: i for i, m in enumerate(LABELS)}
    table = table.reset_index().sort_values("method", key=lambda s: s.map(order))
    return table.reset_index(drop=True)
