"""Paper-style tables from the joined results: Markdown, LaTeX (booktabs) and CSV.

Each table is a :class:`Table`: a numeric frame (for CSV and for anyone who
recomputes), a display frame (numbers at three significant digits; a cell with
no measurement shows the row's status instead, so an unavailable backend is a
visible row, never a missing one) and a caption that states the FLOP
convention (:mod:`attnbench.bench.conventions`) and the device.

Tables
  tflops        TFLOP/s per backend x context length (prefill modes, the reference shape)
  frac_peak     % of the measured roofline at each case's intensity, same cells
  err_ratio     error against fp64 relative to sdpa-math's, per backend x dtype (median and worst)
  decode_gbps   decode bandwidth (bytes_model / time) per layout x backend x KV length
  winners       the fastest backend of every case, its margin, and its roofline side
  status        rows per backend and status, with a reason for each kind of failure
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.bench.results import STATUSES
from attnbench.report.text import md_frame, md_text

PREFILL = ("fwd", "fwd_bwd")
MEASURED = ("ok", "numerics_fail")  # rows that carry a time
# Case fields that can tell two rows of one table cell apart (seq is the column).
CASE_DIMS = ("mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "causal", "dtype",
             "page_size")
FLOP_CONVENTION = ("FLOPs = 2·B·Hq·Sq·avg_kv·(D_qk + D_v), causal avg_kv = (max(0, Skv − Sq) + Skv)/2 "
                   "(bottom-right aligned), fwd_bwd = 3.5 × fwd; query heads count, KV heads do not "
                   "(flash-attention benchmark convention)")
TABLE_NAMES = ("tflops", "frac_peak", "err_ratio", "decode_gbps", "winners", "status")
FORMATS = ("md", "tex", "csv")


@dataclass
class Table:
    name: str
    caption: str
    values: pd.DataFrame  # numeric cells (status words where there is no number); index = row keys
    display: pd.DataFrame  # formatted cells, same shape

    def write(self, folder: str | Path) -> list[Path]:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / f"{self.name}.{ext}" for ext in FORMATS]
        paths[0].write_text(to_markdown(self))
        paths[1].write_text(to_latex(self))
        self.values.reset_index().to_csv(paths[2], index=False)
        return paths


def fmt(value) -> str:
    """Three significant digits, whole numbers from 1000 up (4210, not 4.21e+03); words and empty cells pass through."""
    if isinstance(value, str):
        return value
    if value is None or pd.isna(value):
        return ""
    if 1000 <= abs(value) < 1e7:
        return f"{value:.0f}"
    return f"{value:.3g}"


def device_text(df: pd.DataFrame) -> str:
    """'NVIDIA H200 (driver 580.x, torch 2.11+cu130)': the most common device of the measured rows."""
    rows = df[df["status"].isin(MEASURED)]
    rows = rows if len(rows) else df
    if rows.empty or rows["device_name"].isna().all():
        return "unknown device"
    name = rows["device_name"].mode().iloc[0]
    same = rows[rows["device_name"] == name].iloc[0]
    extras = [f"driver {same['driver']}" if isinstance(same["driver"], str) and same["driver"] else "",
              f"torch {same['torch_version']}" if isinstance(same["torch_version"], str) else ""]
    extras = ", ".join(e for e in extras if e)
    return f"{name} ({extras})" if extras else str(name)


def ceilings_text(df: pd.DataFrame) -> str:
    rows = df.dropna(subset=["peak_bytes_per_s"])
    if rows.empty:
        return "no measured ceilings"
    bw = rows["peak_bytes_per_s"].iloc[0]
    peaks = rows.groupby("dtype", observed=True)["peak_flops"].first().dropna()
    flops = ", ".join(f"{d} {p / 1e12:.3g} TFLOP/s" for d, p in peaks.items())
    return f"measured ceilings: copy {fmt(bw / 1e9)} GB/s; matmul {flops}"


def _most_common(series: pd.Series):
    counts = series.value_counts()
    top = counts[counts == counts.max()].index
    return max(top)


def reference_slice(df: pd.DataFrame, modes: tuple[str, ...], by_layout: bool) -> tuple[pd.DataFrame, str]:
    """Rows of ``modes`` at one reference shape; returns them and a caption fragment describing the shape.

    The shape: the largest head dim, then the most common batch (or batch x
    length, see :func:`_batch_slice`) and query heads. Prefill tables hold one
    layout (MHA where present) so each cell is one case; ``by_layout`` keeps
    every layout as a row key instead (decode), MLA exempt from the head-dim
    choice since its dims come from the latent rank.
    """
    sub = df[df["mode"].isin(modes)]
    if sub.empty:
        return sub, ""
    parts = []
    if not by_layout:
        layout = "mha" if (sub["layout"] == "mha").any() else _most_common(sub["layout"])
        sub = sub[sub["layout"] == layout]
        parts.append(layout.upper())
    not_mla = sub["layout"] != "mla"
    if not_mla.any():
        head_dim = sub.loc[not_mla, "head_dim_qk"].max()
        sub = sub[~not_mla | (sub["head_dim_qk"] == head_dim)]
    sub, batch_part = _batch_slice(sub)
    parts.append(batch_part)
    heads = _most_common(sub["heads_q"])
    sub = sub[sub["heads_q"] == heads]
    parts.append(f"Hq={heads}")
    dims = sorted(set(sub.loc[sub["layout"] != "mla", "head_dim_qk"]))
    if dims:
        parts.append("D=" + "/".join(map(str, dims)))
    return sub, ", ".join(parts)


def _batch_slice(sub: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """One batch size, or one batch x length product, whichever keeps more lengths.

    Sweeps in the style of the FA3 README hold batch x sequence length constant
    (B16 at 2k, B2 at 16k) so every column moves the same number of tokens; a
    fixed-batch slice of such a grid would keep one length only.
    """
    batch = _most_common(sub["batch"])
    by_batch = sub[sub["batch"] == batch]
    tokens = sub["batch"] * sub["seq_kv"]
    total = _most_common(tokens)
    by_tokens = sub[tokens == total]
    if by_tokens["seq_kv"].nunique() > by_batch["seq_kv"].nunique():
        return by_tokens, f"B·S={total}"
    return by_batch, f"B={batch}"


def _key_dims(sub: pd.DataFrame, always: tuple[str, ...]) -> list[str]:
    varying = [d for d in CASE_DIMS if d in always or sub[d].nunique(dropna=False) > 1]
    if "batch" in varying and "batch" not in always and (sub["batch"] * sub["seq_kv"]).nunique() == 1:
        varying.remove("batch")  # a constant batch x length slice: the length column fixes the batch
    return varying + ["backend"]


def _cell_pivot(sub: pd.DataFrame, value: str, keys: list[str], column: str, label: str, scale: float = 1.0
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pivot to (keys) x column; a cell without a measured value shows its row's status.

    Only combinations present in the rows appear (no empty cartesian rows); a
    row that failed the numerics gate keeps its number, marked in the display.
    """
    sub = sub.assign(_v=pd.to_numeric(sub[value], errors="coerce") * scale,
                     _fail=sub["status"] == "numerics_fail")
    sub.loc[~sub["status"].isin(MEASURED), "_v"] = float("nan")
    backends = list(dict.fromkeys(sub["backend"]))
    cells = sub.groupby(keys + [column], observed=True, sort=True).agg(
        v=("_v", "max"), status=("status", "first"), fail=("_fail", "any"))
    numbers = cells["v"].astype(object).where(cells["v"].notna(), cells["status"])
    values = numbers.unstack(column).fillna("")
    display = cells["v"].map(fmt).where(cells["v"].notna(), cells["status"])
    display = display.where(~cells["fail"], display + " (numerics_fail)").unstack(column).fillna("")
    order = sorted(values.index, key=lambda k: (tuple(str(x) for x in k[:-1]), backends.index(k[-1])))
    values, display = values.loc[order], display.loc[order]
    values.columns = display.columns = [f"{label}={c}" for c in values.columns]
    return values, display


def _caption(what: str, shape: str, df: pd.DataFrame, extra: str = "") -> str:
    parts = [what + (f"; {shape}" if shape else ""), FLOP_CONVENTION]
    if extra:
        parts.append(extra)
    parts.append(f"Device: {device_text(df)}")
    return ". ".join(parts) + "."


def _empty(name: str, caption: str, note: str) -> Table:
    frame = pd.DataFrame({"note": [note]}).set_index("note")
    return Table(name, caption, frame, frame)


def tflops_table(df: pd.DataFrame) -> Table:
    sub, shape = reference_slice(df, PREFILL, by_layout=False)
    caption = _caption("Attention throughput in TFLOP/s (median time) per backend and context length "
                       "S = Sq = Skv", shape, df)
    if sub.empty:
        return _empty("tflops", caption, "no fwd/fwd_bwd rows in this sweep")
    values, display = _cell_pivot(sub, "tflops", _key_dims(sub, ("mode",)), "seq_kv", "S")
    return Table("tflops", caption, values, display)


def frac_peak_table(df: pd.DataFrame) -> Table:
    sub, shape = reference_slice(df, PREFILL, by_layout=False)
    caption = _caption("Percent of the measured roofline, min(peak FLOP/s, intensity x copy bandwidth), at each "
                       "case's intensity (flops / bytes_model)", shape, df, ceilings_text(df))
    if sub.empty:
        return _empty("frac_peak", caption, "no fwd/fwd_bwd rows in this sweep")
    values, display = _cell_pivot(sub, "frac_of_peak", _key_dims(sub, ("mode",)), "seq_kv", "S", scale=100)
    return Table("frac_peak", caption, values, display)


def decode_table(df: pd.DataFrame) -> Table:
    sub, shape = reference_slice(df, ("decode",), by_layout=True)
    caption = _caption("Decode bandwidth in GB/s (bytes_model / median time: the KV cache, q and o, plus the "
                       "score passes of eager and math; KV bytes per token follow DeepSeek-V2 Table 1) per "
                       "layout, backend and KV length", shape, df, ceilings_text(df))
    if sub.empty:
        return _empty("decode_gbps", caption, "no decode rows in this sweep")
    values, display = _cell_pivot(sub, "gbps", _key_dims(sub, ("layout",)), "seq_kv", "Skv")
    return Table("decode_gbps", caption, values, display)


def err_ratio_table(df: pd.DataFrame) -> Table:
    caption = _caption("Output error against an fp64 reference relative to sdpa-math's in the same dtype "
                       "(err_ratio_vs_math; 1 = as accurate as PyTorch math), median and worst over the "
                       "sweep's cases; the pass/fail gate is flash-attention's rule, at most 2x plain "
                       "PyTorch (eager) in the same dtype", "", df)
    sub = df[df["status"].isin(MEASURED)].dropna(subset=["err_ratio_vs_math"])
    if sub.empty:
        return _empty("err_ratio", caption, "no rows with numerics in this sweep")
    stats = sub.groupby(["backend", "dtype"], observed=True)["err_ratio_vs_math"].agg(["median", "max", "size"])
    backends = list(dict.fromkeys(df["backend"]))
    values = stats.unstack("dtype")
    values.columns = [f"{dtype} {stat}" for stat, dtype in values.columns]
    values = values.reindex(sorted(values.columns, key=lambda c: (c.split()[0], c.split()[1])), axis=1)
    values = values.reindex([b for b in backends if b in values.index])
    values.index.name = "backend"
    display = pd.DataFrame(index=values.index)
    for dtype in dict.fromkeys(c.split()[0] for c in values.columns):
        med, worst, n = values[f"{dtype} median"], values[f"{dtype} max"], values[f"{dtype} size"]
        display[dtype] = [f"{fmt(m)} (max {fmt(w)}, n={int(k)})" if pd.notna(m) else ""
                          for m, w, k in zip(med, worst, n)]
    return Table("err_ratio", caption, values, display)


def winners_table(df: pd.DataFrame) -> Table:
    """Per case: fastest backend, runner-up, speedup, and the winner's bound and fraction of roofline."""
    caption = _caption("Fastest backend per case (highest TFLOP/s among rows that passed numerics), its margin "
                       "over the runner-up, and which roofline ceiling bounds it (memory: intensity below the "
                       "ridge point; compute: above; latency: under 20% of both ceilings)", "", df,
                       ceilings_text(df))
    ok = df[df["status"] == "ok"].dropna(subset=["tflops"])
    if ok.empty:
        return _empty("winners", caption, "no ok rows in this sweep")
    rows = []
    for case_id, group in ok.groupby("case_id", sort=False):
        group = group.sort_values("tflops", ascending=False)
        best = group.iloc[0]
        second = group.iloc[1] if len(group) > 1 else None
        rows.append({**{d: best[d] for d in CASE_DIMS}, "seq_q": best["seq_q"], "seq_kv": best["seq_kv"],
                     "winner": best["backend"], "tflops": best["tflops"], "gbps": best["gbps"],
                     "runner_up": second["backend"] if second is not None else "",
                     "speedup": best["tflops"] / second["tflops"] if second is not None else float("nan"),
                     "bound": best["bound"], "intensity": best["intensity"],
                     "frac_of_peak_pct": best["frac_of_peak"] * 100, "backends_ok": len(group)})
    values = pd.DataFrame(rows)
    keys = [d for d in CASE_DIMS if d == "mode" or values[d].nunique() > 1] + ["seq_q", "seq_kv"]
    values = values.sort_values(keys).set_index(keys)
    values = values[["winner", "tflops", "gbps", "runner_up", "speedup", "bound", "intensity", "frac_of_peak_pct",
                     "backends_ok"]]
    return Table("winners", caption, values, values.map(fmt))


def status_table(df: pd.DataFrame) -> Table:
    caption = _caption("Rows per backend and status (every configured backend has a row per case, measured or "
                       "not), with the first reason given for each status that is not ok", "", df)
    counts = df.groupby(["backend", "status"], observed=True).size().unstack("status", fill_value=0)
    counts = counts.reindex(columns=[s for s in STATUSES if s in counts.columns])
    counts = counts.reindex(list(dict.fromkeys(df["backend"])))
    failed = df[df["status"] != "ok"].drop_duplicates(["backend", "status"])
    reasons = {b: "; ".join(f"{s}: {str(r)[:120]}" for s, r in zip(g["status"], g["reason"].fillna("")))
               for b, g in failed.groupby("backend", observed=True)}
    values = counts.assign(reasons=[reasons.get(b, "") for b in counts.index])
    values.index.name = "backend"
    return Table("status", caption, values, values.map(lambda v: v if isinstance(v, str) else str(int(v))))


BUILDERS = {"tflops": tflops_table, "frac_peak": frac_peak_table, "err_ratio": err_ratio_table,
            "decode_gbps": decode_table, "winners": winners_table, "status": status_table}


def build_tables(df: pd.DataFrame) -> list[Table]:
    return [BUILDERS[name](df) for name in TABLE_NAMES]


def to_markdown(table: Table) -> str:
    """The caption and the display frame as Markdown, every string escaped (:mod:`attnbench.report.text`)."""
    body = md_frame(table.display.reset_index()).to_markdown(index=False)
    return f"Table ({table.name}): {md_text(table.caption)}\n\n{body}\n"


_LATEX_SPECIAL = {"·": r"$\cdot$", "×": r"$\times$", "−": "-", "\\": r"\textbackslash{}", "&": r"\&",
                  "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(table: Table) -> str:
    """A booktabs table (``\\toprule``/``\\midrule``/``\\bottomrule``; needs ``\\usepackage{booktabs}``)."""
    frame = table.display.reset_index()
    frame.columns = [latex_escape(c) for c in frame.columns]
    frame = frame.map(latex_escape)
    styler = frame.style.hide(axis="index")
    return styler.to_latex(caption=latex_escape(table.caption), label=f"tab:{table.name}", hrules=True,
                           position_float="centering", column_format="l" * frame.shape[1])


def write_tables(df: pd.DataFrame, folder: str | Path) -> dict[str, dict]:
    """Write every table in every format plus ``index.json`` (name -> caption and files)."""
    folder = Path(folder)
    index = {}
    for table in build_tables(df):
        paths = table.write(folder)
        index[table.name] = {"caption": table.caption, "files": [p.name for p in paths]}
    (folder / "index.json").write_text(json.dumps(index, indent=2))
    return index
