"""Paper-shaped tables from the capability rows (one row per model variant x evaluation).

* :func:`perplexity_table` with ``window="sliding"`` follows PI's Table 1 (Chen et
  al. 2023): one row per (extension method, extended window, fine-tune steps),
  one column per evaluation length, sliding-window perplexity; with
  ``window="truncated"`` it follows YaRN's Table 1 (Peng et al. 2023): the same
  rows, perplexity of one truncated window per document.
* :func:`passkey_table`: passkey retrieval accuracy in the same shape (PI Table 4 / YaRN Table 5 style).

A cell is empty where the variant was not evaluated at that length. :func:`build` wraps them, with the
cost and RoPE-overhead tables and the perplexity-against-length figure, as the context stage's outputs.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.report.artifacts import Figure, StageOutputs, Table, fmt, note_table  # noqa: E402
from attnbench.report.figures import placeholder  # noqa: E402

TABLE_NAMES = ("perplexity_sliding", "perplexity_truncated", "passkey", "cost", "rope_overhead")
FIGURE_NAMES = ("perplexity",)


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


def _device(df: pd.DataFrame) -> str:
    if "device_name" not in df or df["device_name"].dropna().empty:
        return "unknown device"
    return str(df["device_name"].dropna().iloc[0])


def _capability_note(capability: pd.DataFrame) -> str:
    if capability.empty:
        return ""
    first = capability.iloc[0]
    return (f" Tiny GPT ({int(first['params'])} parameters) pretrained at L = {int(first['train_len'])} for "
            f"{int(first['pretrain_steps'])} steps on {first['data']}; {_device(capability)}.")


def _frame_table(name: str, caption: str, frame: pd.DataFrame, keys: list[str]) -> Table:
    if frame.empty:
        return note_table(name, caption, "no rows in this sweep")
    values = frame.set_index([k for k in keys if k in frame])
    return Table(name, caption, values, values.map(fmt))


def perplexity_figure(capability: pd.DataFrame) -> plt.Figure:
    """Perplexity against evaluation length per method, without and with the short fine-tune (PI Figure 1 style)."""
    rows = capability[(capability["status"] == "ok") & capability["eval"].isin(["sliding", "truncated"])] \
        if len(capability) else capability
    if rows.empty:
        return placeholder("Perplexity against evaluation length", "no capability rows")
    rows = rows.assign(method=rows["method"].map(lambda m: LABELS.get(m, m)),
                       fine_tune=rows["finetune_steps"].map(lambda n: f"fine-tuned {int(n)} steps" if n else "no fine-tune"),
                       window=rows["eval"] + " window")
    grid = sns.relplot(data=rows, kind="line", x="eval_len", y="ppl", hue="method", style="fine_tune", col="window",
                       markers=True, height=3.4, aspect=1.2, facet_kws={"sharey": False}, errorbar=None)
    grid.set(xscale="log", yscale="log")
    for ax in grid.axes.flat:
        lengths = sorted(rows["eval_len"].unique())
        ax.set_xticks(lengths, labels=[str(n) for n in lengths])
        ax.minorticks_off()
        ax.axvline(rows["train_len"].iloc[0], color="black", lw=0.8, ls="--")
    grid.set_axis_labels("evaluation length (tokens)", "perplexity")
    grid.figure.suptitle("Perplexity against evaluation length (dashed: the pretraining length)", y=1.03)
    return grid.figure


def build(capability: pd.DataFrame, cost: pd.DataFrame, rope: pd.DataFrame) -> StageOutputs:
    """Every table and figure of the context stage, from the merged capability, cost and RoPE-overhead rows."""
    ok = capability[capability["status"] == "ok"] if len(capability) else capability
    note = _capability_note(capability)
    keys = ["method", "s", "extended to", "finetune_steps"]
    strides = sorted({int(v) for v in ok.loc[ok["eval"] == "sliding", "stride"].dropna()}) if len(ok) else []
    stride = f" (stride {'/'.join(map(str, strides))})" if strides else ""
    tables = [
        _frame_table("perplexity_sliding", f"Sliding-window perplexity{stride} by evaluation length, per RoPE "
                     "scaling, extension factor s and fine-tune steps (PI Table 1 layout)." + note,
                     perplexity_table(ok, "sliding") if len(ok) else ok, keys),
        _frame_table("perplexity_truncated", "Perplexity of one truncated window per held-out document by evaluation "
                     "length (YaRN Table 1 layout)." + note, perplexity_table(ok, "truncated") if len(ok) else ok, keys),
        _frame_table("passkey", "Passkey retrieval accuracy (share of documents whose every digit is the argmax) by "
                     "evaluation length (PI Table 4 / YaRN Table 5 layout); chance is 1e-5." + note,
                     passkey_table(ok) if len(ok) and (ok["eval"] == "passkey").any() else ok.iloc[:0], keys),
        _frame_table("cost", "Attention cost at the extended lengths per mode and backend: median time, peak memory "
                     f"and roofline bound, or the status (oom where it stops fitting). Device: {_device(cost)}.",
                     cost_table(cost) if len(cost) else cost, ["mode", "backend"]),
        _frame_table("rope_overhead", "RoPE overhead per method and length: building the cos/sin tables and rotating "
                     "q and k, in ms.", rope_overhead_table(rope) if len(rope) else rope, ["method"]),
    ]
    figures = [Figure("perplexity", "Perplexity against evaluation length per RoPE scaling, without and with the "
                      "short fine-tune at the target window; sliding and truncated windows." + note,
                      perplexity_figure(capability))]
    return StageOutputs(tables, figures)
