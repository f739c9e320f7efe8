"""Context-parallel attention: one sequence sharded over N ranks (``torch.distributed``), docs/context-parallel.md.

Modules, one job each, bottom-up:

  sharding    which global positions each rank holds: contiguous, zigzag, striped
  documents   packed variable-length batches (document lengths, cu_seqlens); the hook for trace lengths
  blocks      which (query rows, key rows, mask) blocks a rank computes at each ring step
  kernels     per-block attention that returns the log-sum-exp (math, sdpa-flash, sdpa-cudnn, fa4, triton)
  merge       the online-softmax merge of block results by their log-sum-exp
  comm        the ring's point-to-point exchange and its timers (CUDA events, or wall clock on CPU)
  ring        ring attention as a torch.autograd.Function: ring forward and ring backward
  torch_cp    PyTorch's own torch.distributed.tensor.experimental.context_parallel (all-gather, all-to-all)
  backends    the stage's backend names (ring-<kernel>, torch-cp-<rotation>) and what each supports
  timing      a distributed timer: fixed repetitions, the slowest rank per repetition
  numerics    the fp64 reference on the gathered sequence, per document
  columns     the stage's extra results columns (CP_COLUMNS) and the typed frame
  plan        the config section -> jobs (one per world size)
  worker      the per-rank program torchrun starts
  launch      ``attnbench context-parallel``: torchrun with a time limit; rows for whatever it leaves out
  commands    the stage's subcommands
"""
