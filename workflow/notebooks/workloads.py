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
# Batches formed from real request lengths (the Azure LLM inference trace 2023: Patel et al.,
# "Splitwise", ISCA 2024, CC BY 4.0) or from seeded length distributions, run on each backend's own
# ragged path; chunked prefill against cached prefixes; decode over fragmented paged KV caches; and the
# attention variants each backend runs natively (`docs/workloads.md`). FLOPs and bytes count the real
# tokens only and each variant's unmasked pairs.
#
# `sdpa-padded` runs each batch padded to its longest sequence with a dense mask, the path a serving
# stack without a varlen kernel takes; its FLOPs and bytes are counted over the real tokens like every
# other row's, so its lower throughput is the price of the padding. In the coverage table a cell is the
# backend's median TFLOP/s over the variant's cases and, in brackets, its worst error over eager's in
# the same dtype (the gate allows 2x); a backend that cannot express the variant shows its row status
# (`unsupported`, with the reason in the results).

# %%
from attnbench.report.display import Stage

Stage("microbench").show_group("workloads")
