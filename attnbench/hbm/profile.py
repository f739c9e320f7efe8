"""The process Nsight Compute profiles: each (case, backend) call once, alone, inside named ranges.

For every case (inputs drawn once) and backend: availability and support checks,
``build`` (layout conversion, masks), ``warmup_calls`` calls (compilation,
autotuning, lazy initialisation), then the one profiled call::

    synchronize; cudaProfilerStart
    push "attnbench-hbm"; push "attnbench-hbm:<case_id>:<backend>"
        fn(); synchronize
    pop; pop; cudaProfilerStop

ncu runs with ``--profile-from-start off``, so nothing outside that bracket is
profiled. Each step is written to the manifest (JSON lines, flushed) before and
after, so the parent can tell which call a crash happened in.

Usage (the parent, :mod:`attnbench.hbm.stage`, writes the plan)::

    python -m attnbench.hbm.profile --plan plan.json --manifest manifest.jsonl
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from typing import Callable

import torch

from attnbench.case import Case
from attnbench.failures import classify
from attnbench.bench.inputs import make_tensors
from attnbench.hbm.ncu import RANGE, range_tag
from attnbench.kernels.registry import Backend, get_backend, safe_available


def case_seed(case: Case, base: int) -> int:
    """The per-case input seed (the microbench stage's rule, so both draw the same inputs)."""
    return (int(case.case_id, 16) + base) % (2**31)


@contextlib.contextmanager
def profiled(tag: str, device: str):
    """Open the profiler and the NVTX ranges around the body; on CPU (tests) only run the body."""
    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        with torch.cuda.nvtx.range(RANGE), torch.cuda.nvtx.range(tag):
            yield
            torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def profile_one(case: Case, backend: Backend, tensors, device: str, warmup_calls: int) -> tuple[str, str]:
    """Build, warm up and run one profiled call; (status, reason) with the harness's status words."""
    ok, reason = safe_available(backend)
    if not ok:
        return "unavailable", reason
    ok, reason = backend.supports(case)
    if not ok:
        return "unsupported", reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = backend.build(case, tensors)
            for _ in range(warmup_calls):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            with profiled(range_tag(case.case_id, backend.name), device):
                fn()
            return "ok", ""
        except Exception as err:
            return classify(err, caught)


def run_plan(plan: dict, emit: Callable[..., None]) -> None:
    """Profile every (case, backend) of the plan; never raises for one call's failure."""
    device, warmup = plan["device"], plan["warmup_calls"]
    for entry in plan["cases"]:
        case = Case(**entry["case"])
        try:
            tensors = make_tensors(case, device, seed=case_seed(case, plan["seed"]))
        except Exception as err:  # inputs that cannot be drawn are this case's rows (oom or error), not the job's end
            tensors, input_error = None, classify(err)
        for name in entry["backends"]:
            emit(event="start", case_id=case.case_id, backend=name)
            if tensors is None:
                status, reason = input_error[0], f"drawing the case's inputs: {input_error[1]}"
            else:
                status, reason = profile_one(case, get_backend(name), tensors, device, warmup)
            emit(event="end", case_id=case.case_id, backend=name, status=status, reason=reason)
            if device == "cuda":  # the call's outputs and workspaces are gone now
                torch.cuda.empty_cache()
        del tensors
        if device == "cuda":
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.hbm.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True, help="JSON plan written by attnbench.hbm.stage")
    parser.add_argument("--manifest", required=True, help="JSON-lines file of start/end events (appended)")
    args = parser.parse_args(argv)
    with open(args.plan) as f:
        plan = json.load(f)
    with open(args.manifest, "a") as out:
        def emit(**event):
            out.write(json.dumps(event) + "\n")
            out.flush()

        run_plan(plan, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
