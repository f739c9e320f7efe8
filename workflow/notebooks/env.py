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
# Where the sweep ran and what this host can do at best: the roofline ceilings measured before any
# benchmark (every bound and fraction of peak below uses them), the versions, and which backends can
# run here (an unavailable one is a row with its reason, never a missing one).

# %%
import os

from IPython.display import Markdown, display

from attnbench.report import escape
from attnbench.report.display import Stage

env = Stage("env")
env.show_table("ceilings")
env.show_table("backends")
env.show_table("provenance")
display(Markdown("To render this report again, from the folder it was rendered in: "
                 + escape.code(os.environ.get("ATTNBENCH_RERUN", "attnbench render --results results/<sweep> "
                                              "--out reports/<sweep>/report.html"))))
