"""The triton stage: our Triton kernels' compiler report, and their compilation ahead of the timed jobs.

* :mod:`attnbench.compiler.precompile`: every autotuning config of every kernel variant the sweep's
  triton cases need, compiled in parallel processes into Triton's on-disk cache, before the
  microbench jobs that time them (which would otherwise compile each config serially).
* :mod:`attnbench.compiler.report`: per (case, triton backend): the configs the autotuner kept, the
  registers, spills, shared memory and SASS instruction mix of each kernel that ran
  (:func:`attnbench.kernels.triton.sass.compiler_report`), and the output's difference from cuDNN's.
"""
