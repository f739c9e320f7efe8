#!/usr/bin/env bash
# Pretraining experiments at GPU scale on one H200 (issue 7), compact enough for ~6 minutes:
#   a. divergence: kernel swap (sdpa-math reference vs sdpa-flash, sdpa-cudnn) vs seed swap vs fp16-vs-fp32,
#      weight divergence at snapshots, plus each backend's attention error against fp64 at the model's shape
#   b. LR sensitivity at 3 LRs, baseline vs qk-layernorm + z-loss 1e-4 (bf16, uncompiled)
#   c. FP8 recipes vs bf16 through torchao (tensorwise, rowwise; MXFP8 emulated on Hopper), compiled (torchao's
#      casts run unfused without torch.compile: the first H200 attempt ran them uncompiled at a fraction of
#      bf16's speed); `unavailable` rows where torchao is not installed
#   d. layouts mha/gqa/mqa/mla at matched parameters, compiled, fastest backend per layout (bf16)
# Model: pretrain.cuda of the default config (~10.7M parameters: 6 layers, 6 heads, 384 wide), byte-level
# Shakespeare, seq 256, batch 64, 2000 steps per run (STEPS=...). MFU uses the matmul rate measured here (attnbench.bench.ceilings).
# Every run is guarded (an error is a row) and time-boxed (a run past the budget is `truncated`).
# EXPERIMENTS="divergence lr_sensitivity fp8 layouts" (the default: all four, in that order) picks a subset, so one
# lease can run them as separate processes. Runs whose speed is compared (layouts) need the GPU to themselves;
# RUNS="fp8/fp8-rowwise fp8/mxfp8" keeps only those runs of the chosen experiments (default: all of them).
# SHARED_GPU=<what else ran> records, in every summary row's `gpu_shared_with`, that this process shared the GPU with
# other training processes, whose tokens/s and MFU are then not the run's own (its losses and weights are).
# Writes $OUT/pretrain_steps.parquet, $OUT/pretrain_runs.parquet, $OUT/pretrain_divergence.parquet
# (weight divergence and fp64 numerics rows, column `table`; only with divergence), and prints a summary table last.
# usage (on the GPU host, from the repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> bash scripts/h200_pretrain.sh
set -uo pipefail
OUT=${OUT:-results/h200-pretrain}
WORK=${WORK:-/tmp/attnbench-h200-pretrain}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
python3 - "$OUT" "$WORK" "${BUDGET_S:-330}" "${STEPS:-2000}" "${EXPERIMENTS:-divergence lr_sensitivity fp8 layouts}" \
  "${SHARED_GPU:-}" "${RUNS:-}" <<'PY'
import dataclasses, math, sys, time, traceback
from pathlib import Path

import pandas as pd
import torch

start = time.monotonic()
out, work, budget, steps = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
chosen, shared_with, only = sys.argv[5].split(), sys.argv[6], sys.argv[7].split()
deadline = start + budget
from attnbench.failures import first_line
from attnbench.bench.results import write_atomic
from attnbench.config import load_config
from attnbench.train import experiments as ex
from attnbench.train.loop import train
from attnbench.train.precision import get_precision

unknown = [name for name in chosen if name not in ex.EXPERIMENTS]
if unknown or not chosen:
    sys.exit(f"EXPERIMENTS={' '.join(chosen)!r} is not allowed; allowed: any of {', '.join(ex.EXPERIMENTS)}")

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the precision swap
config = load_config("config/config.yaml")
compact = {  # the committed GPU-scale settings, shortened to fit the budget
    "train": {"steps": steps, "warmup_steps": max(10, steps // 20), "eval_every": max(1, steps // 4),
              "eval_batches": 8, "probe_every": 10, "ckpt_every": 0,
              # flex compiles per shape (tens of seconds) and sdpa-math is never the fastest: left out of `auto`
              "backend_candidates": ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient"]},
    "experiments": {"divergence": {"backends": ["sdpa-math", "sdpa-flash", "sdpa-cudnn"]},
                    "lr_sensitivity": {"lrs": [0.001, 0.01, 0.1]}},
}
config["pretrain"]["cuda"] = ex.deep_merge(config["pretrain"]["cuda"], compact)
if device == "cpu":  # a smoke run of this script without a GPU: the CPU-sized model, a few steps
    config["pretrain"]["train"].update(steps=min(steps, 20), eval_every=10, probe_every=5)
    config["pretrain"]["experiments"]["lr_sensitivity"]["lrs"] = [0.001, 0.01, 0.1]
print(f"device {device}, budget {budget:.0f}s, {steps} steps per run, experiments {' '.join(chosen)}"
      + (f", GPU shared with {shared_with}" if shared_with else ""), flush=True)

peaks, summaries, steps_frames, extra = {}, [], [], []
plans = {}
for name, compiled in (("divergence", False), ("lr_sensitivity", False), ("fp8", True), ("layouts", True)):
    if name not in chosen:
        continue
    try:
        plans[name] = [dataclasses.replace(s, train=dataclasses.replace(s.train, compile=compiled and device == "cuda"))
                       for s in ex.plan(config, name, device)]
    except Exception as err:
        traceback.print_exc()
        summaries.append({"run": name, "experiment": name, "status": "error", "reason": f"plan: {err}"})
if only:
    names = [s.name for specs in plans.values() for s in specs]
    if set(only) - set(names):
        sys.exit(f"RUNS={' '.join(sorted(set(only) - set(names)))!r} is not allowed; allowed: {', '.join(names)}")
    plans = {name: [s for s in specs if s.name in only] for name, specs in plans.items()}
# the divergence tables load every run's snapshots after the last run: the runs stop early enough to leave them time
# (a lease once killed this script while it built them, after all five runs, and the snapshots went with the machine)
runs_deadline = deadline - (60 if "divergence" in plans else 0)


def save():
    """Write what has finished so far: a run killed at the stage's hard limit loses only itself."""
    write_atomic(pd.DataFrame(summaries), out / "pretrain_runs.parquet")
    if steps_frames:
        write_atomic(pd.concat(steps_frames, ignore_index=True), out / "pretrain_steps.parquet")
    if extra:
        write_atomic(pd.concat(extra, ignore_index=True), out / "pretrain_divergence.parquet")


def run(name, spec):
    left = runs_deadline - time.monotonic()
    # a compiled run spends tens of seconds compiling before its first step checks the deadline
    if left < (45 if spec.train.compile else 15):
        summaries.append({"run": spec.name, **spec.tags, "status": "skipped", "reason": "out of time budget"})
        return
    try:
        dtype = get_precision(spec.train.precision).matmul_dtype
        peak = ex.peak_flops_for(device, dtype, peaks)
        t0 = time.monotonic()
        try:
            s = train(spec, ex.run_dir(work / name, spec), device, peak_flops=peak, progress=False,
                      deadline=runs_deadline - 5)
        except Exception:
            if not spec.train.compile:
                raise
            traceback.print_exc()
            print(f"{spec.name}: compiled run failed; running it uncompiled", flush=True)
            spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, compile=False))
            s = train(spec, ex.run_dir(work / name, spec), device, peak_flops=peak, progress=False,
                      deadline=runs_deadline - 5)
        summaries.append(dict(s, gpu_shared_with=shared_with))
        path = ex.run_dir(work / name, spec) / "steps.parquet"
        if path.is_file():
            steps_frames.append(pd.read_parquet(path).assign(**{k: str(v) for k, v in spec.tags.items()}))
        print(f"{spec.name}: {s.get('status')} {time.monotonic() - t0:.0f}s val {s.get('final_val_loss', float('nan')):.3f} "
              f"tok/s {s.get('tokens_per_s', float('nan')):.0f} mfu {s.get('mfu', float('nan')):.3f} {s.get('reason', '')}",
              flush=True)
    except Exception as err:
        traceback.print_exc()
        summaries.append({"run": spec.name, **spec.tags, "status": "error",
                          "reason": first_line(err)})
    save()


# divergence first (it needs all its runs), then LRs (both variants at one LR before the next; uncompiled, cheap),
# then the FP8 recipes, then the compiled layouts (compilation dominates their time; the last ones are truncated if the budget runs out)
for spec in plans.get("divergence", []):
    run("divergence", spec)
for spec in sorted(plans.get("lr_sensitivity", []), key=lambda s: (s.train.lr, s.tags["variant"])):
    run("lr_sensitivity", spec)
for spec in plans.get("fp8", []):
    run("fp8", spec)
for spec in plans.get("layouts", []):
    run("layouts", spec)
if "divergence" in plans:
    try:
        div = ex.divergence_frame(plans["divergence"], work / "divergence", device)
        extra.append(div.assign(table="weight_divergence"))
        save()
    except Exception:
        traceback.print_exc()
    try:
        extra.append(ex.numerics_frame(config, device).assign(table="numerics_vs_fp64"))
    except Exception:
        traceback.print_exc()

save()
runs = pd.DataFrame(summaries)
pd.set_option("display.width", 220)
for frame in extra:
    if len(frame):
        cols = [c for c in ("table", "variant", "backend", "dtype", "step", "max_abs", "rel_l2", "wasserstein",
                            "out_rel_err", "dq_rel_err", "status") if c in frame]
        last = frame.sort_values("step").groupby("run").tail(1) if "step" in frame else frame
        print(last[cols].to_string(index=False))
cols = [c for c in ("run", "status", "backend", "params", "steps_done", "final_val_loss", "max_attention_logit",
                    "spike_score_loss", "tokens_per_s", "mfu", "kv_bytes_per_token_bf16") if c in runs]
print(f"total {time.monotonic() - start:.0f}s")
print(runs[cols].to_string(index=False))
PY
