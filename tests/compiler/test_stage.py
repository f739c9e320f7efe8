"""The triton stage on a CPU host: which configs it would compile, its rows, and how the planner schedules it."""
from pathlib import Path

from attnbench import config as configs
from attnbench import plan as planner
from attnbench.case import Case
from attnbench.compiler.precompile import tasks_for
from attnbench.compiler.report import compiler_rows
from attnbench.kernels.triton import tuning

REPO = Path(__file__).resolve().parents[2]


def _case(**kw):
    fields = dict(mode="fwd", layout="mha", batch=1, heads_q=4, heads_kv=4, head_dim_qk=64, head_dim_v=64, seq_q=256,
                  seq_kv=256, causal=False, dtype="bf16")
    return Case(**{**fields, **kw})


def test_precompile_tasks_cover_every_config_each_case_can_launch():
    fwd, bwd = _case(), _case(mode="fwd_bwd", causal=True)
    tasks = tasks_for([fwd, bwd, _case(dtype="fp32")], ["triton", "triton-fp8", "sdpa-flash"])
    kinds = {(t[0], t[5]) for t in tasks}
    assert kinds == {("fwd", False), ("fp8", False), ("fwd", True), ("bwd", True), ("dkdv", True), ("dq", True)}
    per_kind = {k: len(tuning.TABLES[k][64]) for k in tuning.TABLES}
    assert len(tasks) == per_kind["fwd"] * 2 + per_kind["fp8"] + per_kind["bwd"] + per_kind["dkdv"] + per_kind["dq"]
    assert tasks_for([fwd], ["sdpa-flash"]) == []  # no triton backend: nothing to compile


def test_compiler_rows_on_cpu_say_why_for_every_pair():
    rows = compiler_rows([_case(), _case(mode="fwd_bwd")], ["triton", "triton-fp8", "fa4"], "cpu")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"unavailable"}
    assert all("needs a CUDA GPU" in r["reason"] for r in rows)


def test_triton_sweep_plans_precompilation_only_on_a_gpu_and_the_report_for_its_groups():
    config = configs.load_config(REPO / "config" / "sweeps" / "h200-triton.yaml")
    plans = planner.check_config(config)
    cuda = {j.payload["stage"]: j.payload for j in plans["cuda"].jobs() if j.stage in ("triton", "precompile")}
    assert set(cuda) == {"triton-precompile", "triton-compiler"}
    assert set(plans["cuda"].triton_precompile_groups()) == {"fwd", "fwd-fp8", "fwd_bwd"}
    assert "triton-dq-separate" in cuda["triton-compiler"]["backends"] and len(cuda["triton-compiler"]["cases"]) == 64  # fwd-fp8 shares fwd's cases
    assert plans["cpu"].triton_precompile_groups() == []  # the interpreter compiles nothing ahead
