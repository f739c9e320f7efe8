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
# # Context parallelism: attention sharded over N ranks
#
# Ring attention over the project's block kernels and PyTorch's `context_parallel`, with the sequence
# split contiguously, zig-zag or striped over N ranks (docs/context-parallel.md). This section reads the
# stage's tables (`results/<sweep>/context_parallel/tables/`) and figures; on a CPU host the ranks are
# gloo processes and every time is wall-clock.

# %%
import json
import os
from pathlib import Path

from IPython.display import Image, Markdown, display

CP_RESULTS = Path(os.environ.get("ATTNBENCH_RESULTS", "results/default")) / "context_parallel"
cp_index = json.loads((CP_RESULTS / "tables" / "index.json").read_text())


def cp_table(name: str):
    display(Markdown((CP_RESULTS / "tables" / f"{name}.md").read_text()))


# %% [markdown]
# ## Scaling: TFLOP/s per GPU and efficiency against one GPU

# %%
display(Image(filename=str(CP_RESULTS / "figures" / "cp-scaling.png")))
cp_table("cp_tflops")
cp_table("cp_efficiency")

# %% [markdown]
# ## Communication against computation, and per-rank imbalance

# %%
display(Image(filename=str(CP_RESULTS / "figures" / "cp-phases.png")))
cp_table("cp_phases")

# %% [markdown]
# ## Memory per rank, numerics, and rows that did not run

# %%
cp_table("cp_memory")
cp_table("cp_numerics")
cp_table("cp_status")
