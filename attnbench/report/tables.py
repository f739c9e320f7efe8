"""The microbench stage's paper-style tables from the joined results (written by :mod:`attnbench.report.artifacts`).

Each table is a :class:`Table`: a numeric frame (for CSV and for anyone who
recomputes), a display frame (numbers at three significant digits; a cell with
no measurement shows the row's status instead, so an unavailable backend is a
visible row, never a missing one) and a caption that states the FLOP
convention (:mod:`attnbench.bench.conventions`) and the device.

Numbers from timing carry their 95% interval, ``value [low, high]`` (a rate's interval is its
time's, inverted: :mod:`attnbench.bench.stats`), and a dagger (†) when the row's job drifted
(``drift_flag``). A backend is named faster than another only when their ratio's interval excludes
1 and the ratio exceeds ``1 + report.min_margin`` (:func:`claim`); otherwise the table says
"tie within noise".

Tables
  tflops        TFLOP/s per backend x context length (prefill modes, the reference shape)
  frac_peak     % of the measured roofline at each case's intensity, same cells
  err_ratio     the numerics gate's ratio (error over eager's in the same dtype), median and worst per
                backend x dtype, beside the error over the best fused backend's
  decode_gbps   decode bandwidth (bytes_model / time) per layout x backend x KV length
  winners       the fastest backend of every case, its margin with its interval, the claim, its roofline side
  pairs         for every case, the fastest backend against each backend timed beside it (paired ratios)
  status        rows per backend and status, with a reason for each kind of failure
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from attnbench.bench import stats
from attnbench.bench.numerics import FP8_REL_ERR_BOUND
from attnbench.bench.results import MEASURED, STATUSES
from attnbench.config import load_schema
from attnbench.report.artifacts import Table, fmt, note_table

PREFILL = ("fwd", "fwd_bwd")
# Case fields that can tell two rows of one table cell apart (seq is the column).
CASE_DIMS = ("mode", "layout", "batch", "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "causal", "dtype",
             "page_size")
FLOP_CONVENTION = ("FLOPs = 2·B·Hq·Sq·avg_kv·(D_qk + D_v), causal avg_kv = Skv − Sq/2 + 1/2 (bottom-right "
                   "aligned, the diagonal counted exactly: half a key per row more than flash-attention's "
                   "benchmarks count), fwd_bwd = 3.5 × fwd; query heads count, KV heads do not")
NOISE_CONVENTION = ("[low, high]: 95% interval of the median over rounds (two-level bootstrap); † the row's job "
                    "drifted by more than 3% (drift_flag)")
DRIFT_MARK = "†"
TIE = "tie within noise"
DEFAULT_MIN_MARGIN = load_schema("report")["properties"]["min_margin"]["default"]  # report.min_margin's default
TABLE_NAMES = ("tflops", "frac_peak", "err_ratio", "decode_gbps", "winners", "pairs", "status")


def interval_text(value, low, high, drift=False) -> str:
    """``653 [648, 660]``, with † for a drift-flagged job; the bare value where there is no interval."""
    text = fmt(value)
    if text and isinstance(low, (int, float)) and isinstance(high, (int, float)) and math.isfinite(low) \
            and math.isfinite(high):
        text += f" [{fmt(low)}, {fmt(high)}]"
    return text + (DRIFT_MARK if text and drift else "")


def rate_interval(df: pd.DataFrame, rate: str) -> tuple[pd.Series, pd.Series]:
    """(low, high) of a rate inversely proportional to time (TFLOP/s, GB/s, share of roofline) from ms_ci_*."""
    ms = pd.to_numeric(df["ms_median"], errors="coerce")
    value = pd.to_numeric(df[rate], errors="coerce")
    return value * ms / df["ms_ci_high"], value * ms / df["ms_ci_low"]


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


def ragged(df: pd.DataFrame) -> pd.Series:
    """Rows of ragged batches: fewer real tokens than the batch padded to its longest sequence."""
    def short(tokens: str, seq: str) -> pd.Series:
        if tokens not in df:
            return pd.Series(False, index=df.index)
        return (pd.to_numeric(df[tokens], errors="coerce") < df["batch"] * df[seq]).fillna(False).astype(bool)
    return short("tokens_q", "seq_q") | short("tokens_kv", "seq_kv")


def grid_cases(df: pd.DataFrame) -> pd.Series:
    """Rows of equal-length batches without a variant (frames from before those columns count as such)."""
    variant = df["variant"].fillna("none") if "variant" in df else pd.Series("none", index=df.index)
    return ~ragged(df) & (variant == "none")


def reference_slice(df: pd.DataFrame, modes: tuple[str, ...], by_layout: bool) -> tuple[pd.DataFrame, str]:
    """Rows of ``modes`` at one reference shape; returns them and a caption fragment describing the shape.

    The shape: the largest head dim, then the most common batch (or batch x
    length, see :func:`_batch_slice`) and query heads. Prefill tables hold one
    layout (MHA where present) so each cell is one case; ``by_layout`` keeps
    every layout as a row key instead (decode), MLA exempt from the head-dim
    choice since its dims come from the latent rank. Only grid cases count: ragged batches and
    attention variants have their own tables (:mod:`attnbench.report.workloads`).
    """
    sub = df[df["mode"].isin(modes) & grid_cases(df)]
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

    Only combinations present in the rows appear (no empty cartesian rows); a row that failed the
    numerics gate keeps its number, marked in the display. Displayed numbers carry their interval
    (:func:`rate_interval`) and the drift mark.
    """
    low, high = rate_interval(sub, value)
    sub = sub.assign(_v=pd.to_numeric(sub[value], errors="coerce") * scale, _lo=low * scale, _hi=high * scale,
                     _fail=sub["status"] == "numerics_fail", _drift=sub["drift_flag"].fillna(False).astype(bool))
    sub.loc[~sub["status"].isin(MEASURED), ["_v", "_lo", "_hi"]] = float("nan")
    backends = list(dict.fromkeys(sub["backend"]))
    cells = sub.sort_values("_v", ascending=False).groupby(keys + [column], observed=True, sort=True).agg(
        v=("_v", "first"), lo=("_lo", "first"), hi=("_hi", "first"), status=("status", "first"),
        fail=("_fail", "any"), drift=("_drift", "any"))
    numbers = cells["v"].astype(object).where(cells["v"].notna(), cells["status"])
    values = numbers.unstack(column).fillna("")
    text = pd.Series([interval_text(v, lo, hi, d) for v, lo, hi, d in zip(cells["v"], cells["lo"], cells["hi"],
                                                                          cells["drift"])], index=cells.index)
    display = text.where(cells["v"].notna(), cells["status"])
    display = display.where(~cells["fail"], display + " (numerics_fail)").unstack(column).fillna("")
    order = sorted(values.index, key=lambda k: (tuple(str(x) for x in k[:-1]), backends.index(k[-1])))
    values, display = values.loc[order], display.loc[order]
    values.columns = display.columns = [f"{label}={c}" for c in values.columns]
    return values, display


def _caption(what: str, shape: str, df: pd.DataFrame, extra: str = "", timed: bool = True) -> str:
    parts = [what + (f"; {shape}" if shape else ""), FLOP_CONVENTION] + ([NOISE_CONVENTION] if timed else [])
    if extra:
        parts.append(extra)
    parts.append(f"Device: {device_text(df)}")
    return ". ".join(parts) + "."


def _empty(name: str, caption: str, note: str) -> Table:
    return note_table(name, caption, note)


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
    """The gate's ratio (error over eager's in the same dtype) and the ratio to the best fused backend's."""
    limits = pd.to_numeric(df["max_err_ratio"], errors="coerce").dropna()
    limit = fmt(limits.max()) if len(limits) else "max_err_ratio"
    caption = _caption(f"Numerical error against an fp64 reference. vs eager: the gate, worst error (output and "
                       f"gradients) over plain PyTorch's (eager) in the same dtype, at most {limit}x "
                       "(flash-attention's test rule; err_ratio_vs_eager): median (max) over the sweep's cases. "
                       "vs best fused: over the most accurate fused backend of the same case and dtype "
                       "(err_ratio_vs_best_fused), median. fp8 backends are gated on their error against fp64, "
                       f"at most {FP8_REL_ERR_BOUND:g} (twice e4m3's unit roundoff), instead", "", df, timed=False)
    sub = df[df["status"].isin(MEASURED)].dropna(subset=["err_ratio_vs_eager"])
    if sub.empty:
        return _empty("err_ratio", caption, "no rows with numerics in this sweep")
    stats_ = sub.groupby(["backend", "dtype"], observed=True).agg(
        vs_eager_median=("err_ratio_vs_eager", "median"), vs_eager_max=("err_ratio_vs_eager", "max"),
        vs_best_fused_median=("err_ratio_vs_best_fused", "median"), rel_err_max=("rel_err", "max"),
        size=("err_ratio_vs_eager", "size"), fp8=("compute_dtype", lambda c: bool((c == "fp8").any())))
    backends = list(dict.fromkeys(df["backend"]))
    values = stats_.drop(columns="fp8").unstack("dtype")
    values.columns = [f"{dtype} {stat}" for stat, dtype in values.columns]
    order = ["vs_eager_median", "vs_eager_max", "vs_best_fused_median", "rel_err_max", "size"]
    values = values.reindex(sorted(values.columns, key=lambda c: (c.split()[0], order.index(c.split()[1]))), axis=1)
    values = values.reindex([b for b in backends if b in values.index])
    values.index.name = "backend"
    fp8 = stats_["fp8"].groupby(level="backend").any()
    display = pd.DataFrame(index=values.index)
    for dtype in dict.fromkeys(c.split()[0] for c in values.columns):
        cells = []
        for backend in values.index:
            get = lambda stat: values.loc[backend, f"{dtype} {stat}"]  # noqa: E731
            if pd.isna(get("vs_eager_median")):
                cells.append("")
            elif fp8.get(backend, False):
                cells.append(f"rel_err max {fmt(get('rel_err_max'))} (fp8 bound {FP8_REL_ERR_BOUND:g}), "
                             f"{fmt(get('vs_eager_median'))}x eager, n={int(get('size'))}")
            else:
                cells.append(f"{fmt(get('vs_eager_median'))} (max {fmt(get('vs_eager_max'))}); "
                             f"vs best fused {fmt(get('vs_best_fused_median'))}; n={int(get('size'))}")
        display[dtype] = cells
    return Table("err_ratio", caption, values, display)


@dataclass
class Claim:
    """Who is fastest in one case, and whether the data let the report say so (:func:`claim`)."""

    best: dict  # the row with the lowest median time
    runner_up: dict | None
    ratio: stats.Ratio  # time(runner_up) / time(best), with its interval
    tied: list[str] = field(default_factory=list)  # not told apart from the best; "<name> (no interval)": no data to

    @property
    def decided(self) -> bool:
        return self.runner_up is not None and not self.tied

    @property
    def winner(self) -> str:
        return self.best["backend"] if self.decided or self.runner_up is None else TIE

    @property
    def drift(self) -> bool:
        return stats.flag(self.best.get("drift_flag")) or (
            self.runner_up is not None and stats.flag(self.runner_up.get("drift_flag")))


def claim(rows: pd.DataFrame, pair_table: pd.DataFrame | None, min_margin: float) -> Claim:
    """The fastest of one case's measured rows, named only if every other is slower beyond noise.

    Each other backend is compared with the fastest by the paired ratio when one job timed both
    (:func:`attnbench.bench.stats.compare_rows`), else unpaired; it is told apart when the ratio's
    interval lies above 1 and the ratio exceeds ``1 + min_margin``.
    """
    ordered = rows.sort_values("ms_median").to_dict("records")
    best = ordered[0]
    tied, first = [], None
    for other in ordered[1:]:
        r = stats.compare_rows(other, best, pair_table)
        if first is None:
            first = r
        if stats.verdict(r, min_margin) != stats.SLOWER:
            tied.append(other["backend"] + ("" if r.has_interval else " (no interval)"))
    return Claim(best, ordered[1] if len(ordered) > 1 else None, first or stats.NO_RATIO, tied)


def winners_table(df: pd.DataFrame, pair_table: pd.DataFrame | None = None,
                  min_margin: float = DEFAULT_MIN_MARGIN) -> Table:
    """Per case: fastest backend, runner-up, its margin with the interval, the claim, the winner's roofline side."""
    caption = _caption(f"Fastest backend per case (lowest median time among rows that passed numerics), the "
                       f"runner-up's time over it with a 95% interval (paired over rounds when one job timed both), "
                       f"and the winner named only when every other backend is slower beyond its interval and by "
                       f"more than {min_margin:.0%} (report.min_margin), else \"{TIE}\" with the backends it "
                       "cannot be told from; which roofline ceiling bounds the fastest (memory: intensity below "
                       "the ridge point; compute: above; latency: under 20% of both ceilings)", "", df,
                       ceilings_text(df))
    ok = df[df["status"] == "ok"].dropna(subset=["tflops"])
    if ok.empty:
        return _empty("winners", caption, "no ok rows in this sweep")
    if pair_table is None:
        pair_table = stats.pairs(df, min_margin)
    rows = []
    for case_id, group in ok.groupby("case_id", sort=False):
        c = claim(group, pair_table, min_margin)
        best, second = c.best, c.runner_up
        t_lo, t_hi = rate_interval(pd.DataFrame([best]), "tflops")
        rows.append({**{d: best[d] for d in CASE_DIMS}, "seq_q": best["seq_q"], "seq_kv": best["seq_kv"],
                     "case_id": case_id, "winner": c.winner, "fastest": best["backend"], "tflops": best["tflops"],
                     "tflops_ci_low": t_lo.iloc[0], "tflops_ci_high": t_hi.iloc[0], "gbps": best["gbps"],
                     "runner_up": second["backend"] if second is not None else "",
                     "speedup": c.ratio.ratio, "speedup_ci_low": c.ratio.low, "speedup_ci_high": c.ratio.high,
                     "tied": ", ".join(c.tied), "bound": best["bound"], "intensity": best["intensity"],
                     "frac_of_peak_pct": best["frac_of_peak"] * 100, "backends_ok": len(group), "drift": c.drift})
    values = pd.DataFrame(rows)
    keys = [d for d in CASE_DIMS if d == "mode" or values[d].nunique() > 1] + ["seq_q", "seq_kv"]
    values = values.sort_values(keys).set_index(keys)
    values = values[["winner", "fastest", "tflops", "tflops_ci_low", "tflops_ci_high", "gbps", "runner_up", "speedup",
                     "speedup_ci_low", "speedup_ci_high", "tied", "bound", "intensity", "frac_of_peak_pct",
                     "backends_ok", "drift", "case_id"]]
    display = values.assign(
        tflops=[interval_text(v, lo, hi, d) for v, lo, hi, d in zip(values["tflops"], values["tflops_ci_low"],
                                                                     values["tflops_ci_high"], values["drift"])],
        speedup=[interval_text(v, lo, hi) for v, lo, hi in zip(values["speedup"], values["speedup_ci_low"],
                                                               values["speedup_ci_high"])])
    display = display.drop(columns=["tflops_ci_low", "tflops_ci_high", "speedup_ci_low", "speedup_ci_high", "drift",
                                    "case_id"])
    return Table("winners", caption, values, display.map(fmt))


def pairs_table(df: pd.DataFrame, pair_table: pd.DataFrame | None = None,
                min_margin: float = DEFAULT_MIN_MARGIN) -> Table:
    """Each case's fastest backend against every backend its job timed beside it, from the pairs table."""
    caption = _caption("Paired time ratios within one job: per case, each backend's time over the fastest's "
                       "(the geometric mean over rounds of their per-round ratios, with the Student-t 95% interval "
                       "over rounds: Jain 1991, §13.4.1, on log ratios), and the verdict: faster only when the "
                       f"interval excludes 1 and the ratio exceeds 1 + {min_margin:.0%} (report.min_margin). Every "
                       "pair of every case: attnbench.bench.stats.pairs", "", df)
    if pair_table is None:
        pair_table = stats.pairs(df, min_margin)
    ok = df[df["status"] == "ok"].dropna(subset=["ms_median"])
    rows = []
    for _, group in ok.groupby(["job_id", "case_id"], sort=False):
        best = group.sort_values("ms_median").iloc[0]
        for other in group.to_dict("records"):
            if other["backend"] == best["backend"]:
                continue
            r = stats.lookup_pair(pair_table, best["job_id"], best["case_id"], other["backend"], best["backend"])
            if r is None:
                continue
            faster, words = stats.pair_verdict(r, other["backend"], best["backend"], min_margin)
            rows.append({**{d: best[d] for d in CASE_DIMS}, "seq_q": best["seq_q"], "seq_kv": best["seq_kv"],
                         "fastest": best["backend"], "other": other["backend"], "n_rounds": r.n, "ratio": r.ratio,
                         "ratio_ci_low": r.low, "ratio_ci_high": r.high, "verdict": words,
                         "drift": stats.flag(best.get("drift_flag")) or stats.flag(other.get("drift_flag"))})
    if not rows:
        return _empty("pairs", caption, "no pairs: no case had two backends measured in one job")
    values = pd.DataFrame(rows)
    keys = [d for d in CASE_DIMS if d == "mode" or values[d].nunique() > 1] + ["seq_q", "seq_kv", "fastest", "other"]
    values = values.sort_values(keys).set_index(keys)[["n_rounds", "ratio", "ratio_ci_low", "ratio_ci_high",
                                                       "verdict", "drift"]]
    display = values.assign(ratio=[interval_text(v, lo, hi, d) for v, lo, hi, d in zip(
        values["ratio"], values["ratio_ci_low"], values["ratio_ci_high"], values["drift"])])
    display = display.drop(columns=["ratio_ci_low", "ratio_ci_high", "drift"])
    return Table("pairs", caption, values, display.map(fmt))


def status_table(df: pd.DataFrame) -> Table:
    caption = _caption("Rows per backend and status (every configured backend has a row per case, measured or "
                       "not), with the first reason given for each status that is not ok", "", df, timed=False)
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
            "decode_gbps": decode_table, "winners": winners_table, "pairs": pairs_table, "status": status_table}
CLAIMS = ("winners", "pairs")  # the builders that take the pairs table and the margin


def build_tables(df: pd.DataFrame, pair_table: pd.DataFrame | None = None,
                 min_margin: float = DEFAULT_MIN_MARGIN) -> list[Table]:
    if pair_table is None:
        pair_table = stats.pairs(df, min_margin)
    return [BUILDERS[name](df, pair_table, min_margin) if name in CLAIMS else BUILDERS[name](df)
            for name in TABLE_NAMES]
