"""A third-party backend as a plugin package would ship it (used by the entry-point test)."""
from attnbench.kernels.eager import eager_attention
from attnbench.kernels.registry import Backend


class ToyBackend(Backend):
    name = "toy"
    family = "eager"

    def attention(self, q, k, v, *, causal, scale):
        return eager_attention(q, k, v, causal=causal, scale=scale)
