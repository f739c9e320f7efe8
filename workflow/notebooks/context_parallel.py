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
# How attention scales when its sequence is sharded over N ranks: ring attention over the project's
# block kernels and PyTorch's `context_parallel`, with contiguous, zig-zag or striped sharding
# (docs/context-parallel.md). TFLOP/s per GPU and the scaling efficiency against one GPU, where a call's
# time goes (computation, communication, what the overlap leaves exposed, per-rank imbalance), memory
# per rank, and the errors sharding adds. On a CPU host the ranks are gloo processes and every time is
# wall-clock.

# %%
from attnbench.report.display import Stage

Stage("context_parallel").show_group()  # every figure, then every table, each with its caption
