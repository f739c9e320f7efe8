# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# Which attention backend is fastest for each problem shape, and whether memory bandwidth
# or compute limits it, from the sweep's joined rows (`results/<sweep>/microbench.parquet`) and the
# stage's tables and figures (`results/<sweep>/microbench/tables/index.json`).

# %%
import pandas as pd
from IPython.display import Markdown, display

from attnbench.bench import stats
from attnbench.report import escape, tables
from attnbench.report.display import Stage, results_dir
from attnbench.report.stages import report_settings
from attnbench.workflow import paths

df = pd.read_parquet(paths.within(results_dir(), paths.MERGED))
stage = Stage("microbench")
table, show_figure = stage.show_table, stage.show_figure
MIN_MARGIN = report_settings(results_dir())["min_margin"]
pairs = stats.pairs(df, MIN_MARGIN)
ok = df[df["status"] == "ok"]


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def drift_note(row) -> str:
    """The mark every number from a drift-flagged job carries where it is quoted."""
    if stats.flag(row.get("drift_flag")):
        return f" (drift-flagged job: its reference case moved {100 * row['job_drift']:+.1f}% during the job)"
    return ""


def timed(row, column: str, unit: str) -> str:
    """A rate with its 95% interval, e.g. `653 [648, 660] TFLOP/s`."""
    low, high = tables.rate_interval(pd.DataFrame([row]), column)
    return f"{tables.interval_text(row[column], low.iloc[0], high.iloc[0])} {unit}"


# %% [markdown]
# ### At a glance

# %%
sweep = df["sweep"].mode().iloc[0]
counts = df.groupby("status").size()
not_run = df[df["status"].isin(["unavailable", "unsupported"])].drop_duplicates("backend")
rounds = ok["n_rounds"].dropna()
lines = [
    f"**Sweep** {escape.code(sweep)} on **{escape.markdown(tables.device_text(df))}**: {len(df)} rows "
    f"({', '.join(f'{n} {s}' for s, n in counts.items())}) over {df['case_id'].nunique()} cases and "
    f"{df['backend'].nunique()} backends ({', '.join(escape.code(b) for b in dict.fromkeys(df['backend']))}).",
    f"**Roofline**: {escape.markdown(tables.ceilings_text(df))}.",
    f"**Noise**: each (case, backend) was timed in {int(rounds.median()) if len(rounds) else 'no'} rounds, the "
    "backends of a case in rotating order within a round; numbers carry the 95% interval of their median "
    "(two-level bootstrap over rounds and samples, docs/statistics.md), and a backend is called faster only where "
    f"the paired interval of the two backends' time ratio excludes 1 and the ratio exceeds 1 + {MIN_MARGIN:.0%} "
    "(`report.min_margin`); otherwise the two are a *tie within noise*.",
]
drifted = df[df["drift_flag"].fillna(False).astype(bool)]
if len(drifted):
    lines.append(f"**Drift**: {drifted['group'].nunique()} of {df['group'].nunique()} jobs drifted by more than 3% "
                 f"between their first and last timing ({', '.join(sorted(drifted['group'].dropna().unique()))}); "
                 f"their numbers are marked {tables.DRIFT_MARK} in the tables and named wherever quoted.")
shared = ok[ok["device_shared"].fillna(False).astype(bool)]
if len(shared):
    lines.append(f"**Shared device**: {len(shared)} of {len(ok)} measured rows were timed while another process "
                 "used the device (`device_shared`: another process on the GPU, or more than 10% of the CPUs' time "
                 "taken by others); their intervals include that noise.")
unlocked = ok[ok["timing_lock"].notna() & ~ok["timing_lock"].fillna(True).astype(bool)]
if len(unlocked):
    lines.append(f"**Without the timing lock**: {len(unlocked)} measured rows come from jobs that did not hold "
                 "their device's timing lock (run outside `attnbench lease`), so other timing jobs may have run "
                 "beside them.")
ridge = (ok["peak_flops"] / ok["peak_bytes_per_s"]).median() if len(ok) else float("nan")
if ridge == ridge:
    lines.append(f"The ridge point is about **{ridge:.3g} FLOP/byte**: a kernel whose intensity "
                 "(FLOPs per byte it must move) is below it can at best run at memory speed; above it, "
                 "at matmul speed.")
over = ok[ok["frac_of_peak"] > 1.05]
if len(over):
    lines.append(f"{len(over)} rows reach more than 100% of the roofline (up to {pct(over['frac_of_peak'].max())}): "
                 "the ceilings are single measurements at the start of the sweep (one matmul size, one copy "
                 "size), so a kernel that beats them shows where they understate the machine's peak.")
unavailable = df[df["status"] == "unavailable"].drop_duplicates("backend")
for row in unavailable.itertuples():
    lines.append(f"- {escape.code(row.backend)} could not run here: {escape.markdown(row.reason)}")
display(Markdown("\n\n".join(lines)))

# %% [markdown]
# ### Who wins where, and why

# %%
def not_measured(frame: pd.DataFrame, modes) -> str:
    """Backends of the sweep with rows in these modes but none ``ok``: a winner is only a winner among the rest.

    ``unavailable`` backends are left out: "At a glance" lists them with their reason once.
    """
    rows = frame[frame["mode"].isin(modes) & (frame["status"] != "unavailable")]
    rows = rows[~rows["backend"].isin(rows.loc[rows["status"] == "ok", "backend"])]
    if rows.empty:
        return ""
    first = rows.drop_duplicates("backend")
    return " Not measured: " + ", ".join(f"{escape.code(r.backend)} ({r.status}: {escape.markdown(str(r.reason)[:80])})"
                                         for r in first.itertuples()) + "."


def claim_text(c: tables.Claim, column: str, unit: str) -> str:
    """`best` at its rate with interval and its margin over the next backend, or the tie and why."""
    best = c.best
    text = f"{escape.code(best['backend'])} at {timed(best, column, unit)}"
    if c.runner_up is None:
        return text + drift_note(best)
    ratio = tables.interval_text(c.ratio.ratio, c.ratio.low, c.ratio.high)
    if c.decided:
        return f"{text}, {ratio}x the next ({escape.code(c.runner_up['backend'])}, {c.ratio.method})" + drift_note(best)
    return (f"**{tables.TIE}**: {escape.code(best['backend'])} ({timed(best, column, unit)}) cannot be told from "
            + ", ".join(escape.code(b) for b in c.tied) + f"; the next, {escape.code(c.runner_up['backend'])}, takes "
            f"{ratio} times "
            f"as long ({c.ratio.method})" + drift_note(best))


def winners_text(frame: pd.DataFrame) -> list[str]:
    """One sentence per regime: who is fastest at the longest context (or the tie), its roofline side and share."""
    out = []
    prefill, shape = tables.reference_slice(frame[frame["status"] == "ok"], tables.PREFILL, by_layout=False)
    if len(prefill):
        for (mode, dtype, causal), g in prefill.groupby(["mode", "dtype", "causal"], observed=True):
            longest = g["seq_kv"].max()  # the longest context measured in this regime
            c = tables.claim(g[g["seq_kv"] == longest], pairs, MIN_MARGIN)
            best = c.best
            out.append(f"- **{mode}{' causal' if causal else ''} {dtype}, S={longest}** ({shape}): "
                       f"{claim_text(c, 'tflops', 'TFLOP/s')}; the fastest is {escape.markdown(best['bound'])}-bound, "
                       f"{pct(best['frac_of_peak'])} of the roofline at its intensity "
                       f"({best['intensity']:.3g} FLOP/B)." + not_measured(frame, [mode]))
    decode, shape = tables.reference_slice(frame[frame["status"] == "ok"], ("decode",), by_layout=True)
    if len(decode):
        for (layout, dtype), g in decode.groupby(["layout", "dtype"], observed=True):
            longest = g["seq_kv"].max()
            c = tables.claim(g[g["seq_kv"] == longest], pairs, MIN_MARGIN)
            best = c.best
            share = best["gbps"] * 1e9 / best["peak_bytes_per_s"]
            out.append(f"- **decode {layout} {dtype}, KV={longest}** ({shape}): {claim_text(c, 'gbps', 'GB/s')}; "
                       f"the fastest reaches {pct(share)} of the measured copy bandwidth, "
                       f"{escape.markdown(best['bound'])}-bound (intensity {best['intensity']:.3g} FLOP/B)."
                       + not_measured(frame, ["decode"]))
    return out


def why_text(frame: pd.DataFrame) -> list[str]:
    """Where each family sits against the ridge point: the reason behind the winners."""
    out = []
    okf = frame[frame["status"] == "ok"]
    if okf.empty or ridge != ridge:
        return out
    # Unfused backends (eager, math) write the score matrix: their modelled bytes far exceed the minimum.
    unfused = okf["bytes_model"] > 1.5 * okf["bytes_min"]
    prefill = okf["mode"].isin(tables.PREFILL)
    for label, rows in (("Prefill (fwd, fwd_bwd) with fused kernels", okf[~unfused & prefill]),
                        ("Decode with fused kernels", okf[~unfused & (okf["mode"] == "decode")]),
                        ("Prefill with kernels that write the S x S score matrix to memory ("
                         + ", ".join(escape.code(b) for b in dict.fromkeys(okf.loc[unfused & prefill, "backend"])) + ")",
                         okf[unfused & prefill])):
        if rows.empty:
            continue
        lo, hi = rows["intensity"].min(), rows["intensity"].max()
        bounds = rows["bound"].value_counts()
        side = "above" if rows["intensity"].median() > ridge else "below"
        out.append(f"- {label}: intensity {lo:.3g}-{hi:.3g} FLOP/B, median {side} the ridge ({ridge:.3g}); "
                   f"rows labelled " + ", ".join(f"{escape.markdown(b)} {n}" for b, n in bounds.items()) + ".")
    out.append("- A **compute-bound** case is won by the kernel that keeps the matrix units busiest (its share of "
               "the matmul peak); a **memory-bound** one by the kernel that moves the fewest bytes at the highest "
               "bandwidth (fused kernels never write the scores; GQA/MQA/MLA shrink the KV cache); a "
               "**latency-bound** one (under 20% of both ceilings) by the one with the least launch and "
               "synchronisation overhead.")
    return out


display(Markdown("\n".join(winners_text(df) + [""] + why_text(df))))

# %%
show_figure("roofline")

# %% [markdown]
# ### Throughput against context length

# %%
show_figure("throughput_vs_context")
table("tflops")
table("frac_peak")

# %% [markdown]
# ### Decode: bandwidth per head layout

# %%
show_figure("decode_bandwidth")
table("decode_gbps")

# %% [markdown]
# ### Numerical error against fp64

# %%
show_figure("error_ratio")
table("err_ratio")

# %% [markdown]
# ### Every case's winner

# %%
wins = pd.read_csv(stage.path(stage.entry("tables", "winners"), "csv"))
if "winner" in wins:
    summary = wins.groupby(["mode", "bound", "winner"]).size().rename("cases").reset_index()
    summary = summary.map(lambda v: escape.markdown_cell(v) if isinstance(v, str) else v)
    display(Markdown(f"Cases won per backend and roofline side ({tables.TIE}: the fastest could not be told from "
                     "the next):\n\n" + summary.to_markdown(index=False)))
table("winners")

# %% [markdown]
# ### Paired comparisons within a job

# %%
if len(pairs):
    decided = (pairs["faster"].fillna("") != "").mean()
    widths = (pairs["ratio_ci_high"] / pairs["ratio_ci_low"] - 1) * 100
    display(Markdown(f"{len(pairs)} pairs of backends timed side by side in one job; {pct(decided)} decided "
                     f"(interval excludes 1 and the ratio exceeds 1 + {MIN_MARGIN:.0%}), the rest ties within "
                     f"noise. Interval width (high / low - 1): median {widths.median():.2g}%, "
                     f"widest {widths.max():.2g}%."))
table("pairs")

# %% [markdown]
# ### Rows per backend and status

# %%
table("status")

# %% [markdown]
# ### Provenance of the rows

# %%
fields = ["device_name", "driver", "torch_version", "cuda_version", "cudnn_version", "triton_version",
          "python_version", "git_sha", "host"]
prov = df[fields].astype("string").fillna("").drop_duplicates().map(escape.markdown_cell)
display(Markdown(prov.to_markdown(index=False)))
display(Markdown(f"Measured {df['timestamp'].min()} to {df['timestamp'].max()} (UTC)."))
