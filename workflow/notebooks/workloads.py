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
# # Real workloads: traces, ragged batches, attention variants
#
# Batches formed from real request lengths (the Azure LLM inference trace 2023: Patel et al.,
# "Splitwise", ISCA 2024, CC BY 4.0) or from seeded length distributions, run on each backend's own
# ragged path; chunked prefill against cached prefixes; decode over fragmented paged KV caches; and the
# attention variants each backend runs natively (`docs/workloads.md`). FLOPs and bytes count the real
# tokens only and each variant's unmasked pairs. This section reads the sweep's joined results
# (`results/<sweep>/microbench.parquet`); by hand:
# `ATTNBENCH_RESULTS=results/<sweep> jupytext --to ipynb --execute workflow/notebooks/workloads.py`.

# %%
import io
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, Markdown, display

from attnbench.report import figures, workloads

RESULTS = Path(os.environ.get("ATTNBENCH_RESULTS", "results/default"))
df = pd.read_parquet(RESULTS / "microbench.parquet")
built = {t.name: t for t in workloads.build_tables(df)}


def show(fig):
    """Embed a figure as PNG (the HTML stays self-contained) and free it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=figures.DPI, bbox_inches="tight")
    plt.close(fig)
    display(Image(buf.getvalue()))


def table(name: str):
    t = built[name]
    display(Markdown(f"*{t.caption}*\n\n" + t.display.reset_index().to_markdown(index=False)))


# %% [markdown]
# ## What the workloads were

# %%
rows = workloads.workload_rows(df).drop_duplicates("case_id")
if rows.empty:
    display(Markdown("This sweep has no ragged-batch groups (a grid's `workload` key makes them)."))
else:
    summary = rows.groupby(["workload", "kind"], observed=True).agg(
        batches=("case_id", "size"), sequences_median=("batch", "median"), tokens_q=("tokens_q", "sum"),
        tokens_kv=("tokens_kv", "sum"), longest_kv=("seq_kv", "max"), median_kv=("seq_kv_median", "median"))
    display(Markdown("Batches per workload and kind (tokens are real tokens, summed over the batches):\n\n"
                     + summary.reset_index().to_markdown(index=False)))

# %% [markdown]
# ## Throughput over the real tokens, and latency over batches

# %%
table("workload_throughput")
show(workloads.latency_figure(df))

# %% [markdown]
# ## What padding costs
#
# `sdpa-padded` runs each batch padded to its longest sequence with a dense mask, the path a serving
# stack without a varlen kernel takes; its FLOPs and bytes are counted over the real tokens like every
# other row's, so its lower throughput is the price of the padding.

# %%
table("padding_waste")

# %% [markdown]
# ## Semantic coverage: attention variants per backend
#
# A cell is the backend's median TFLOP/s over the variant's cases and, in brackets, its worst error
# over eager's in the same dtype (the gate allows 2x); a backend that cannot express the variant shows
# its row status (`unsupported`, with the reason in the results).

# %%
table("variant_coverage")
reasons = df[(df["variant"].fillna("none") != "none") & (df["status"] == "unsupported")]
reasons = reasons.drop_duplicates(["backend", "variant"])
if len(reasons):
    display(Markdown("\n".join(f"- `{r.backend}` / `{r.variant}`: {str(r.reason)[:160]}" for r in reasons.itertuples())))

# %% [markdown]
# ## Numerics apart from timing
#
# Each row carries `numerics_status` beside its timing `status`: a case that was timed keeps its time
# even where its check could not run (`oom` or `error` in `numerics_status`, with `numerics_reason`).

# %%
counts = df.groupby(["status", "numerics_status"], dropna=False).size().rename("rows").reset_index()
display(Markdown(counts.to_markdown(index=False)))
