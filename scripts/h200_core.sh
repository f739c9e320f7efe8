#!/usr/bin/env bash
# Reference run of the harness core on one GPU (issue 2): GPU-marked tests, ceilings, then the groups of
# config/sweeps/core-h200.yaml, one process per group (all its backends), each under the time left;
# merged into $OUT/microbench-core.parquet with the log and ceilings.
# CORE_GROUPS picks groups (default: all of them); with KEEP=<earlier microbench-core.parquet>, that file's rows of
# groups not run now are kept in the merged file (each row carries its own git sha and timestamp).
# usage (GPU host, repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> [CORE_GROUPS="prefill ..."] [KEEP=<parquet>] bash scripts/h200_core.sh
set -uo pipefail
OUT=${OUT:-results/h200-core}
CONFIG=${CONFIG:-config/sweeps/core-h200.yaml}
CORE_GROUPS=${CORE_GROUPS:-decode prefill prefill-unfused prefill-flex prefill-flex-gqa}
KEEP=${KEEP:-}
work=/tmp/attnbench-h200-core
rm -rf "$work"; mkdir -p "$OUT" "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${BUDGET_S:-300}))
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout 60 python3 -m pytest -q -m gpu tests/test_backends.py 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
python3 -m attnbench.cli ceilings --out "$OUT/ceilings.json"
for group in $CORE_GROUPS; do
  left=$((deadline - SECONDS - 15))
  if [ $left -lt 20 ]; then echo "skip $group: out of time"; continue; fi
  echo "== $group ($left s left) $(date -u +%T)" | tee -a "$work/log.txt"
  timeout -k 5 $left python3 -m attnbench.cli microbench --config "$CONFIG" --group "$group" \
    --ceilings "$OUT/ceilings.json" --out "$work/$group.parquet" 2>>"$work/log.txt" || echo "group $group ended with $?"
  grep -v USDT "$work/log.txt" | tail -2
done
cp "$work/log.txt" "$OUT/log.txt"
python3 - "$work" "$OUT" "$KEEP" <<'PY'
import glob, sys, pandas as pd
work, out, keep = sys.argv[1:]
parts = sorted(glob.glob(f"{work}/*.parquet"))
if not parts:
    sys.exit("no group finished")
df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
if keep:
    earlier = pd.read_parquet(keep)
    kept = earlier[~earlier["group"].isin(df["group"].unique())]
    print(f"kept {len(kept)} rows of groups {sorted(kept['group'].unique())} from {keep}")
    df = pd.concat([kept, df], ignore_index=True)
df.to_parquet(f"{out}/microbench-core.parquet", index=False)
print(df.groupby(["group", "backend", "status"]).size().to_string())
ok = df[(df.status == "ok") & (df["mode"] != "decode") & (df.dtype == "bf16") & (df.head_dim_qk == 128) & (df.layout == "mha")]
print(ok.pivot_table(index=["mode", "causal", "backend"], columns="seq_kv", values="tflops").round(0).to_string())
PY
