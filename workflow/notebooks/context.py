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
# Extending a RoPE model past its pretraining length: which scaling (none, PI, NTK-aware, dynamic
# NTK, YaRN, Llama 3) keeps perplexity and retrieval working at longer windows, with and without a
# short fine-tune, and what attention costs at those lengths on each backend.

# %%
from attnbench.report.display import Stage

Stage("context").show_group()
