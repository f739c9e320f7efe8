#!/usr/bin/env bash
# Context extension on one H200 (issue 8), within ~5 minutes:
#   cost        fwd, fwd_bwd (causal prefill) and decode at 8k..128k for B1 H32/Hkv8 (GQA) D128 bf16 through the
#               microbench harness (attnbench.context.cost), peak memory per row, `oom` rows where a backend stops
#               fitting: sdpa-cudnn, sdpa-flash, sdpa-efficient (fwd_bwd at 128k: cudnn and flash only), eager and
#               sdpa-math up to 64k, flex on fewer lengths (it compiles per shape), fa4 / flashinfer when registered
#               (an `unavailable` row with the reason when not installed). Then the RoPE table/rotation time.
#   capability  pretrain the tiny GPT at L=1024 (context.capability.cuda of the default config, STEPS steps),
#               then none / PI / YaRN / NTK / dynamic NTK / Llama 3 at L..8L, with and without a short fine-tune.
# Every unit (one group with its backends, one method) is guarded and writes its own part as it finishes; units left when
# the time is up are listed as skipped; a process that crashes is rerun once without the unit it was in.
# Timed samples per row are cut to 3 (attnbench.bench.timing.MIN_REPS is 10): a 128k fwd_bwd call takes ~1-2 s.
# Writes $OUT/context_cost.parquet (cost rows, experiment=context_cost, and rope_overhead rows),
# $OUT/context_capability.parquet and $OUT/context_log.txt, and prints the tables last.
# usage (on the GPU host, from the repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> bash scripts/h200_context.sh
set -uo pipefail
OUT=${OUT:-results/h200-context}
WORK=${WORK:-/tmp/attnbench-h200-context}
BUDGET_S=${BUDGET_S:-290}   # the whole script
COST_S=${COST_S:-$((BUDGET_S * 57 / 100))}  # of which the cost experiment
STEPS=${STEPS:-500}         # pretraining steps (fine-tunes are 5% of it)
mkdir -p "$OUT" "$WORK/cost" "$WORK/capability"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
LOG="$OUT/context_log.txt"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee "$LOG"

cat > "$WORK/driver.py" <<'PY'
"""Phases of scripts/h200_context.sh: cost | capability | merge WORK DEADLINE_EPOCH_S [STEPS]."""
import copy, sys, time, traceback
from pathlib import Path

import pandas as pd
import torch

phase, work, deadline = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script at toy sizes
from attnbench.config import load_config
from attnbench.context import experiment as E
from attnbench.report import context as tables

config = load_config("config/config.yaml")


def left() -> float:
    return deadline - time.time()


def unit(path: Path, what: str, fn) -> None:
    """Run ``fn() -> rows`` once: skipped if done, if it crashed the process before, or if time is up."""
    marker = path.with_suffix(".started")
    if path.exists():
        return
    if marker.exists():
        print(f"{what}: crashed its process in an earlier attempt; not rerun", flush=True)
        return
    if left() < 8:
        print(f"{what}: skipped, out of time", flush=True)
        return
    marker.touch()
    start = time.time()
    try:
        rows = fn()
        pd.DataFrame(rows).to_parquet(path, index=False)
        print(f"{what}: {len(rows)} rows in {time.time() - start:.1f} s ({left():.0f} s left)", flush=True)
    except Exception:
        traceback.print_exc()
        print(f"{what}: failed after {time.time() - start:.1f} s", flush=True)
    marker.unlink()


if phase == "cost":
    from attnbench.bench import timing
    from attnbench.bench.ceilings import measure_ceilings
    from attnbench.bench.microbench import RunOptions
    from attnbench.context.cost import cost_plan, rope_overhead, run_cost
    from attnbench.kernels.registry import backend_names

    timing.MIN_REPS = 3  # see the script header
    k = 1024
    gpu = device == "cuda"
    seqs = [8 * k, 16 * k, 32 * k, 64 * k, 128 * k] if gpu else [256, 512, 1024]
    shape = dict(layout="gqa", batch=1, heads_q=32, gqa_group=4, head_dim=128, dtype="bf16") if gpu \
        else dict(layout="gqa", batch=1, heads_q=4, gqa_group=2, head_dim=32, dtype="fp32")
    fast = ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient"] if gpu else ["sdpa-flash"]
    extra = [b for b in ("fa4", "flashinfer") if b in backend_names()]
    # One unit per group, all its backends in one run_group call: inputs (drawn on the host, seconds at 128k)
    # are made once per case and shared by the backends. Highest priority first; the deadline cuts the tail.
    groups = {
        "fwd": dict(shape, mode="fwd", seq=seqs, causal=True, backends=fast + extra),
        "decode": dict(shape, mode="decode", seq=seqs, backends=fast + extra + ["sdpa-math", "eager"]),
        "fwd_bwd": dict(shape, mode="fwd_bwd", seq=seqs[:-1], causal=True, backends=fast + extra),
        # the unfused baselines materialise S x S scores: they stop fitting well before 128k
        "unfused": dict(shape, mode=["fwd", "fwd_bwd"], seq=seqs[:-1], causal=True, backends=["eager", "sdpa-math"]),
        "fwd_bwd-128k": dict(shape, mode="fwd_bwd", seq=seqs[-1:], causal=True, backends=fast[:2] + extra),
    }
    if gpu:  # flex compiles once per shape (tens of seconds each): fewer lengths, last
        groups.update({"flex-fwd": dict(shape, mode="fwd", seq=[8 * k, 32 * k, 128 * k], causal=True, backends=["flex"]),
                       "flex-decode": dict(shape, mode="decode", seq=[8 * k, 128 * k], backends=["flex"]),
                       "flex-fwd_bwd": dict(shape, mode="fwd_bwd", seq=[8 * k, 32 * k], causal=True, backends=["flex"])})
    context = copy.deepcopy(config["context"])
    context["cost"][device] = {"backends": fast, "groups": groups}
    plan = cost_plan(context, device)
    print(f"cost: {device}; registered extras: {extra or 'none'}; {left():.0f} s", flush=True)
    ceilings = measure_ceilings(device)
    t = config["timing"]

    def measure(group):
        options = RunOptions(sweep="h200-context", device=device, seed=config["seed"], warmup_ms=t["warmup_ms"],
                             rep_ms=t["rep_ms"], cpu_min_run_time_s=0.02, ceilings=ceilings)
        return lambda: run_cost(plan, group, options)

    for group in plan.groups:
        unit(work / "cost" / f"{group}.parquet", f"cost {group} ({', '.join(plan.group_backends[group])})",
             measure(group))
    lengths = [8 * k, 32 * k, 128 * k] if gpu else [256, 1024]
    unit(work / "cost" / "rope_overhead.parquet", "rope overhead",
         lambda: rope_overhead(lengths, heads_q=shape["heads_q"], heads_kv=shape["heads_q"] // shape["gqa_group"],
                               head_dim=shape["head_dim"], dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                               device=device, original_max_len=1024))

elif phase == "capability":
    steps = int(sys.argv[4])
    spec = E.capability_spec(config["context"], device)
    if device == "cuda":
        spec["pretrain"].update(steps=steps, warmup_steps=max(10, steps // 20))
        spec["model"] = {"d_model": 384, "n_layers": 6, "n_heads": 6, "backend": "sdpa-flash"}
    else:  # smoke sizes
        spec.update(train_len=96, eval_factors=[1, 2], extension_factors=[2])
        spec["model"] = {"d_model": 16, "n_layers": 1, "n_heads": 2, "backend": "sdpa-math"}
        spec["pretrain"].update(steps=4, batch_tokens=384)
        spec["eval"].update(tokens=384, n_docs=2)
        spec["passkey"].update(n=2)
    ckpt = work / "capability" / "pretrain.pt"
    if not ckpt.exists():
        torch.manual_seed(spec["seed"])
        checkpoint = E.pretrain(spec, device)
        torch.save(checkpoint, ckpt)
        print(f"pretrain: {checkpoint['params']} parameters, L={spec['train_len']}, {spec['pretrain']['steps']} steps, "
              f"final loss "
              f"{checkpoint['losses'][-1]:.3f}, {checkpoint['train_s']:.1f} s ({left():.0f} s left)", flush=True)
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    for method in ("none", "linear", "yarn", "ntk", "dynamic_ntk", "llama3"):
        unit(work / "capability" / f"{method}.parquet", f"capability {method}",
             lambda method=method: E.evaluate(checkpoint, spec, method, device))

else:  # merge
    out = Path(sys.argv[4])
    cost = [pd.read_parquet(p) for p in sorted((work / "cost").glob("*.parquet"))]
    cap = [pd.read_parquet(p) for p in sorted((work / "capability").glob("*.parquet"))]
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_colwidth", 40)
    if cost:
        df = pd.concat(cost, ignore_index=True)
        df.to_parquet(out / "context_cost.parquet", index=False)
        attn = df[df["experiment"] == "context_cost"]
        rope = df[df["experiment"] == "rope_overhead"]
        print(f"\n== cost: {len(attn)} rows ({(attn.status == 'ok').sum()} ok, {(attn.status == 'oom').sum()} oom); "
              "cell = median ms | peak GiB | roofline bound, or the status")
        print(tables.cost_table(attn).to_string(index=False))
        if len(rope):
            print("\n== RoPE tables (per forward for dynamic NTK) and q/k rotation, ms")
            print(tables.rope_overhead_table(rope).round(3).to_string(index=False))
    if cap:
        df = pd.concat(cap, ignore_index=True)
        df.to_parquet(out / "context_capability.parquet", index=False)
        ok = df[df["status"] == "ok"]
        first = ok.iloc[0]
        print(f"\n== capability: pretrained at L={first['train_len']} ({first['params']} parameters, "
              f"{first['pretrain_steps']} steps, final train loss {first['pretrain_final_loss']:.3f})")
        stride = int(ok[ok["eval"] == "sliding"]["stride"].iloc[0])
        for title, table in ((f"sliding-window perplexity (PI Table 1 shape), stride {stride}",
                              tables.perplexity_table(ok, "sliding")),
                             ("truncated-window perplexity (YaRN Table 1 shape)", tables.perplexity_table(ok, "truncated")),
                             ("passkey retrieval accuracy", tables.passkey_table(ok))):
            print(f"\n-- {title}")
            print(table.round(3).to_string(index=False))
PY

end_cost=$((t0 + COST_S))
end_all=$((t0 + BUDGET_S))
for attempt in 1 2; do  # a second attempt only after a crash; finished units are not rerun
  left=$((end_cost - $(date +%s)))
  [ $left -gt 10 ] || break
  timeout $((left + 20)) python3 "$WORK/driver.py" cost "$WORK" "$end_cost" 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] && break
done
for attempt in 1 2; do
  left=$((end_all - 15 - $(date +%s)))
  [ $left -gt 10 ] || break
  timeout $((left + 10)) python3 "$WORK/driver.py" capability "$WORK" "$((end_all - 15))" "$STEPS" 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] && break
done
python3 "$WORK/driver.py" merge "$WORK" 0 "$OUT" 2>&1 | tee -a "$LOG"
echo "total $(( $(date +%s) - t0 )) s; wrote $(ls "$OUT" | tr '\n' ' ')"
