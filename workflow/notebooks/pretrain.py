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
# Small pretraining runs that differ in one thing: the attention backend, the seed or the precision
# (weight divergence, Golden et al. 2024); the learning rate (LR sensitivity, Wortsman et al. 2023);
# the FP8 recipe; the head layout at matched parameters.

# %%
from IPython.display import Markdown, display

from attnbench.report import escape
from attnbench.report.display import Stage

stage = Stage("pretrain")
for experiment in dict.fromkeys(e["group"] for e in stage.tables() + stage.figures()):
    display(Markdown(f"### {escape.markdown(experiment)}"))
    stage.show_group(experiment)
