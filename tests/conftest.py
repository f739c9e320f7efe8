"""Session-wide test setup: the ``gpu`` marker, and Triton's interpreter on CPU-only hosts.

Without CUDA the Triton kernels (tests/test_triton.py) run on CPU tensors in Triton's
interpreter. Triton decides when a ``@triton.jit`` function is decorated (its own ``tl.zeros``,
``tl.sum``, ... at ``import triton``) whether it is interpreted, so ``TRITON_INTERPRET=1`` must be
in the environment before the process first imports Triton; a fixture or ``monkeypatch.setenv``
comes too late. pytest loads this file before it collects any test module, so it is set here,
for the whole session: every run on a CPU-only host sees the same value whichever test files it
selects (the ``triton`` backends are available in every test, and subprocesses inherit it). A
value already in the environment is kept; tests/test_triton.py checks that interpretation took
effect. ``import torch`` does not import Triton.

The timing locks (``attnbench lease``, ``$ATTNBENCH_LOCK_DIR``) of the whole session, Snakemake runs
included, live in a folder of their own: a test never waits for, or blocks, a real sweep on the same
host, and no lease set by a caller's environment leaks into the tests.

Every test starts from the same random state (``ATTNBENCH_TEST_SEED``, default 0), so a tolerance
that a rare draw would break fails the same way on every run, not once in a while in CI; running
the suite under a few other seeds is how such a tolerance is found.
"""
import os
import random
import tempfile

import numpy as np

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ["ATTNBENCH_LOCK_DIR"] = tempfile.mkdtemp(prefix="attnbench-test-locks-")
os.environ.pop("ATTNBENCH_LEASE", None)


@pytest.fixture(autouse=True)
def _seeded_random_state():
    seed = int(os.environ.get("ATTNBENCH_TEST_SEED", "0"))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
