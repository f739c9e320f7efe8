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
# The FlashAttention-3 README's layout: backends down, sequence lengths across, every column at the
# same number of tokens (batch x length held constant), so a column's rise or fall is the kernel's.
# Decode reads as a fraction of the copy bandwidth measured on this host.

# %%
from attnbench.report.display import Stage, say

stage = Stage("microbench")
if all(entry["empty"] for entry in stage.tables("backends")):
    say("No grid of this sweep holds batch x length constant over two lengths or more "
        "(config/sweeps/h200-backends.yaml has such grids), so there are no tables in this layout.")
else:
    for entry in stage.tables("backends"):
        if not entry["empty"]:
            stage.show_table(entry["name"])
