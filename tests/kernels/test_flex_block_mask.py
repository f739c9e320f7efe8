"""FlexAttention's block masks at long sequences: compiled mask creation gives the eager masks and never
materialises the dense (query, key) mask (the H200 context sweep's 128 GiB ``oom`` at 128k)."""
import subprocess
import sys

import torch

from attnbench.kernels import flex

MEASURE = """
import resource, sys
from attnbench.kernels import flex
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mask = flex._causal_block_mask({seq}, {seq}, "cpu")
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown * 1024, mask.kv_num_blocks.shape[-1])
"""


def test_compiled_block_masks_are_the_eager_ones(monkeypatch):
    segment = torch.repeat_interleave(torch.tensor([0, 1]), torch.tensor([200, 312]))

    def document(b, h, q_idx, kv_idx):  # two documents of 200 and 312 tokens, causal inside each
        return (segment[q_idx] == segment[kv_idx]) & (q_idx >= kv_idx)

    causal = flex._causal_block_mask.__wrapped__
    eager = [causal(256, 640, "cpu"), flex.block_mask(document, 512, 512, "cpu")]
    monkeypatch.setattr(flex, "DENSE_MASK_ELEMENTS", 0)
    compiled = [causal(256, 640, "cpu"), flex.block_mask(document, 512, 512, "cpu")]
    for e, c in zip(eager, compiled):
        assert torch.equal(e.to_dense(), c.to_dense())
        assert torch.equal(e.kv_num_blocks, c.kv_num_blocks) and torch.equal(e.full_kv_num_blocks, c.full_kv_num_blocks)


def test_a_64k_causal_block_mask_is_made_without_the_dense_mask():
    seq = 65536  # eager: 2**32 pairs at 8 bytes, 32 GiB, more than a CI machine has
    assert seq * seq > flex.DENSE_MASK_ELEMENTS
    done = subprocess.run([sys.executable, "-c", MEASURE.format(seq=seq)], capture_output=True, text=True,
                          timeout=600, check=True)
    grown, blocks = (int(x) for x in done.stdout.split())
    assert blocks == seq // 128
    assert grown < 4 * 2**30, f"the process grew by {grown / 2**30:.1f} GiB making the mask"
