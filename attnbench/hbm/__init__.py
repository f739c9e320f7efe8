"""HBM traffic: bytes measured with Nsight Compute against the byte model, roofline placement, KV ledger.

* :mod:`attnbench.hbm.plan`: the ``hbm:`` config section -> groups of cases and their backends.
* :mod:`attnbench.hbm.ncu`: the ``ncu`` command lines and the parser of its raw-page CSV.
* :mod:`attnbench.hbm.profile`: the child process ncu runs: setup outside, the timed call inside
  a profiler range and an NVTX range.
* :mod:`attnbench.hbm.stage`: the ``attnbench hbm`` job: timing, profiling, rows.
* :mod:`attnbench.hbm.ledger`: KV-cache bytes per token per layout and attention bytes per training step.
* :mod:`attnbench.report.hbm`: measured/modelled ratios, roofline, ledger charts.
"""
