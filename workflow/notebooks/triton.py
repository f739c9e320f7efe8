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
# The project's own Triton FlashAttention (forward, backward, fp8 forward) beside the fastest other
# backend of each case, and, where the triton stage ran, the compiler's report on its kernels.

# %%
from attnbench.report.display import Stage, say

microbench, triton = Stage("microbench"), Stage("triton")
versus = [e for e in microbench.tables("triton") if not e["empty"]]
for entry in versus:
    microbench.show_table(entry["name"])
if triton:
    triton.show_group()
if not versus and not triton:
    say("No triton or triton-fp8 rows in this sweep's microbench groups, and no triton stage: nothing to compare.")
