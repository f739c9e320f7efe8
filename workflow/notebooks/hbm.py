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
# How many DRAM bytes each call really moved (Nsight Compute), against what its algorithm should
# move (the byte model) and the least any kernel must (each input read once, each output written
# once); where that puts it on this host's roofline; and the KV-cache bytes per token of each head
# layout (DeepSeek-V2 Table 1), checked on decode kernels. Without a GPU or ncu every row says why.

# %%
from attnbench.report.display import Stage

Stage("hbm").show_group()
