"""The numerics gate: one baseline (eager) for kernels in the case dtype, a stated bound for fp8 ones,
and the error over the best fused backend reported beside it."""
import math

import pytest
import torch

from attnbench.bench import numerics
from attnbench.bench.microbench import RunOptions, run_group
from attnbench.case import Case
from attnbench.kernels import registry
from attnbench.kernels.eager import eager_attention
from attnbench.kernels.registry import Backend


def tiny(**kw):
    base = dict(mode="fwd", layout="mha", batch=1, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=16,
                seq_q=32, seq_kv=32, causal=False, dtype="bf16")
    return Case(**{**base, **kw})


class Noisy(Backend):
    """Eager attention plus relative noise of a chosen size: a kernel with a known error."""

    family = "fused"

    def __init__(self, name, noise, compute_dtype=None):
        self.name, self.noise, self.compute_dtype = name, noise, compute_dtype

    def attention(self, q, k, v, *, causal, scale, **kw):
        out = eager_attention(q, k, v, causal=causal, scale=scale)
        gen = torch.Generator().manual_seed(7)
        return out + self.noise * out.detach().abs().mean() * torch.randn(out.shape, generator=gen).to(out.dtype)


@pytest.fixture
def noisy(monkeypatch):
    backends = {"tight": Noisy("tight", 0.0), "loose": Noisy("loose", 0.2),
                "fp8-good": Noisy("fp8-good", 0.04, "fp8"), "fp8-bad": Noisy("fp8-bad", 0.5, "fp8")}
    monkeypatch.setattr(registry, "_REGISTRY", {**registry.all_backends(), **backends})
    return backends


def _rows(names, **options):
    rows = run_group([tiny()], names, RunOptions(cpu_min_run_time_s=0.005, repeats=1, **options), log=lambda s: None)
    return {r["backend"]: r for r in rows}


def test_the_gate_holds_kernels_in_the_case_dtype_to_eagers_error(noisy):
    rows = _rows(["eager", "tight", "loose"])
    assert rows["tight"]["status"] == "ok" and rows["tight"]["max_err_ratio"] == 2.0
    assert rows["eager"]["err_ratio_vs_eager"] == 1.0
    loose = rows["loose"]
    assert loose["status"] == "numerics_fail" and loose["err_ratio_vs_eager"] > 2
    assert loose["reason"].startswith("error ") and "eager's in bf16 (allowed: <= 2.0x)" in loose["reason"]


def test_fp8_backends_are_held_to_the_e4m3_bound(noisy):
    rows = _rows(["fp8-good", "fp8-bad"])
    assert numerics.FP8_REL_ERR_BOUND == 2 * 2**-4
    good, bad = rows["fp8-good"], rows["fp8-bad"]
    assert good["status"] == "ok" and good["rel_err"] < numerics.FP8_REL_ERR_BOUND < bad["rel_err"]
    assert good["err_ratio_vs_eager"] > 2  # it would fail the ratio gate it is not held to
    assert bad["status"] == "numerics_fail" and "allowed for an e4m3 backend: <= 0.125" in bad["reason"]
    assert math.isnan(good["max_err_ratio"])


def test_error_over_the_best_fused_backend_is_reported(noisy):
    rows = _rows(["tight", "loose", "eager", "fp8-good"])
    assert rows["tight"]["err_ratio_vs_best_fused"] == 1.0  # the most accurate fused backend is its own baseline
    loose, tight = rows["loose"], rows["tight"]
    assert loose["err_ratio_vs_best_fused"] == pytest.approx(loose["rel_err"] / tight["rel_err"])
    assert rows["fp8-good"]["err_ratio_vs_best_fused"] > 1  # fp8 rows are compared, never the baseline


def test_ratios_vs_best_fused_by_hand():
    rows = [{"status": "ok", "rel_err": 2e-3, "rel_err_dq": 4e-3},  # fused
            {"status": "ok", "rel_err": 1e-3, "rel_err_dq": 1e-2},  # fused
            {"status": "ok", "rel_err": 5e-4, "rel_err_dq": 1e-3},  # not fused (eager): compared, not a baseline
            {"status": "error", "rel_err": float("nan")}]
    ratios = numerics.ratios_vs_best_fused(rows, [True, True, False, False])
    # baselines: rel_err 1e-3 (row 1), rel_err_dq 4e-3 (row 0); a row's ratio is its worst column's
    assert ratios[:3] == pytest.approx([2.0, 2.5, 0.5]) and math.isnan(ratios[3])
    assert all(math.isnan(r) for r in numerics.ratios_vs_best_fused(rows, [False] * 4))
