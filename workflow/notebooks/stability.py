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
# Whether a number measured here would come out the same in another process: the stability stage
# times named microbench groups again in fresh processes (each its own CUDA context, allocator,
# plans and clock history) and sets their medians side by side.

# %%
from attnbench.report.display import Stage

Stage("stability").show_group()
