"""Ragged batches and attention variants on every backend that runs on CPU, against the fp64 reference.

Each backend's timed path (``build()``, its result through ``Backend.output``) is checked with
:func:`attnbench.bench.numerics.check_built`: eager, sdpa-math, sdpa-flash (PyTorch's CPU flash
kernel), sdpa-padded, flex (its mask and score mods through FlexAttention's unfused path; one case
compiled, marked slow) and triton (the interpreter, fp16). A backend that cannot express a case says
why in ``supports()`` or raises an unsupported error; every other one must be within the 2x gate.
Shapes are small and off the tile grid.
"""
import pytest
import torch

from attnbench.bench.inputs import make_tensors
from attnbench.bench.numerics import check_built
from attnbench.case import Case
from attnbench.failures import classify
from attnbench.kernels import flex, get_backend, sdpa
from attnbench.workloads.grid import expand_grid

VARIANT_GRID = {"mode": "fwd", "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 32, "seq": 67,
                "batch": 2, "causal": True, "variant": ["none", "sliding_window", "softcap", "alibi", "document",
                                                         "prefix_lm"], "window": 9, "softcap": 3.0, "doc_len": 20,
                "prefix_len": 13}
# which CPU backend runs which variant natively (the others refuse with a reason)
NATIVE = {
    "eager": {"none", "sliding_window", "softcap", "alibi", "document", "prefix_lm"},
    "sdpa-math": {"none", "sliding_window", "alibi", "prefix_lm"},  # document: nested, GQA refused
    "sdpa-flash": {"none", "sliding_window", "alibi", "prefix_lm"},
    "sdpa-padded": {"none", "sliding_window", "alibi", "document", "prefix_lm"},
    "flex": {"none", "sliding_window", "softcap", "alibi", "document", "prefix_lm"},
    "triton": {"none", "document"},
}


@pytest.fixture(autouse=True)
def unfused_flex(monkeypatch):
    """FlexAttention's unfused path applies the same mods as the compiled kernel, without 25 s of compile a shape."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex.Flex, "_flex", lambda self: flex_attention)


def dtype_for(name: str) -> str:
    return "fp16" if name == "triton" else "fp32"  # the interpreter's tl.dot cannot do bf16; fp32 elsewhere


def run(name: str, case: Case):
    """(result, None) when the backend ran, or (None, reason) when it refused."""
    backend = get_backend(name)
    ok, reason = backend.supports(case)
    if not ok:
        return None, reason
    try:
        return check_built(case, backend, "cpu", seed=5), None
    except Exception as err:
        status, reason = classify(err)
        assert status == "unsupported", reason  # a refusal must be a clean unsupported, not a crash
        return None, reason


@pytest.mark.parametrize("name", list(NATIVE))
@pytest.mark.parametrize("variant", VARIANT_GRID["variant"])
def test_each_variant_matches_fp64_on_every_cpu_backend(name, variant):
    (case,) = [c for c in expand_grid({**VARIANT_GRID, "dtype": dtype_for(name)}) if c.variant == variant]
    result, reason = run(name, case)
    if variant not in NATIVE[name]:
        assert result is None and reason
        return
    assert result is not None, reason
    assert 0 < result.out.rel_err < (2e-3 if name == "triton" else 1e-5)
    assert result.worst_ratio_vs_eager() <= 2.0


RAGGED = {
    "prefill": {"mode": "fwd", "causal": True,
                "workload": {"distribution": "uniform", "min_len": 5, "max_len": 45, "token_budget": 120,
                             "batches": 1, "seed": 2}},
    "chunked": {"mode": "fwd", "causal": True,
                "workload": {"distribution": "uniform", "min_len": 20, "max_len": 70, "token_budget": 96, "chunk": 32,
                             "batches": 2, "seed": 1}},
    "decode": {"mode": "decode", "workload": {"distribution": "lognormal", "median_len": 40, "sigma": 0.6,
                                              "requests": 3, "batches": 1}},
    "cross": {"mode": "fwd", "causal": False,  # non-causal ragged: the one nested SDPA runs on CPU
              "workload": {"distribution": "uniform", "min_len": 5, "max_len": 45, "token_budget": 120, "batches": 1}},
}
RAGGED_NATIVE = {  # (backend, kind) pairs that must run; on CPU nested SDPA runs only the math kernel, not causal
    "eager": set(RAGGED), "sdpa-padded": set(RAGGED), "flex": set(RAGGED), "triton": set(RAGGED),
    "sdpa-math": {"cross", "decode"}, "sdpa-flash": set(),
}


@pytest.mark.parametrize("name", list(RAGGED_NATIVE))
@pytest.mark.parametrize("kind", list(RAGGED))
def test_ragged_batches_match_fp64_on_every_cpu_backend(name, kind):
    grid = {"layout": "mha", "heads_q": 2, "head_dim": 32, "dtype": dtype_for(name), **RAGGED[kind]}
    case = expand_grid(grid)[-1]
    assert case.ragged
    if kind == "chunked":
        assert any(q < kv for q, kv in zip(case.lens_q, case.lens_kv))  # a chunk after a cached prefix
    result, reason = run(name, case)
    if kind not in RAGGED_NATIVE[name]:
        assert result is None and reason
        return
    assert result is not None, reason
    assert 0 < result.out.rel_err < (2e-3 if name == "triton" else 1e-5)
    assert result.worst_ratio_vs_eager() <= 2.0


def test_sdpa_builds_its_masks_before_the_timed_call(monkeypatch):
    """A chunk against a prefix and a variant: the returned callable builds no mask."""
    built = []
    real_bottom_right, real_dense_mask = sdpa._bottom_right, sdpa.dense_mask
    monkeypatch.setattr(sdpa, "_bottom_right", lambda *a: built.append("causal") or real_bottom_right(*a))
    monkeypatch.setattr(sdpa, "dense_mask", lambda *a, **k: built.append("variant") or real_dense_mask(*a, **k))
    chunk = Case(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16, seq_q=8,
                 seq_kv=40, causal=True, dtype="fp32")
    window = Case(**{**chunk.fields(), "seq_q": 40, "variant": "sliding_window", "window": 5})
    for name, case in (("sdpa-math", chunk), ("sdpa-math", window)):
        fn = get_backend(name).build(case, make_tensors(case, "cpu", seed=0))
        before = len(built)
        assert before >= 1
        fn()
        assert len(built) == before  # nothing built inside the timed call


def test_sdpa_flash_takes_the_lower_right_causal_bias_for_a_chunk():
    from torch.nn.attention.bias import CausalBias

    mask, is_causal = get_backend("sdpa-flash")._causal_mask(8, 40, "cpu")
    assert isinstance(mask, CausalBias) and not is_causal
    mask, _ = get_backend("sdpa-math")._causal_mask(8, 40, "cpu")  # materialised: CausalBias would run flash
    assert mask.dtype == torch.bool and mask.shape == (8, 40) and mask[0, 32] and not mask[0, 33]


@pytest.mark.slow
def test_compiled_flex_runs_a_ragged_batch_and_a_variant(monkeypatch):
    monkeypatch.undo()  # the compiled kernel itself (Inductor's C++ on CPU)
    for grid in (RAGGED["chunked"], {**VARIANT_GRID, "variant": "alibi"}):
        case = expand_grid({"layout": "mha", "heads_q": 2, "head_dim": 32, "dtype": "fp32",
                            **{k: v for k, v in grid.items() if k not in ("layout", "heads_q", "gqa_group")}})[-1]
        result = check_built(case, get_backend("flex"), "cpu", seed=1)
        assert result.out.rel_err < 1e-5 and result.worst_ratio_vs_eager() <= 2.0
