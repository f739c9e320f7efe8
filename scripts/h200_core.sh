#!/usr/bin/env bash
# Reference run of the harness core on one GPU (issue 2): GPU tests, ceilings, the cuda grid
# of config/config.yaml one (group, backend) job at a time, merged into one parquet under $OUT.
# usage (on the GPU host, from the repository root): ATTNBENCH_GIT_SHA=<sha> bash scripts/h200_core.sh
set -uo pipefail
OUT=${OUT:-results/h200-core}
work=results/h200-core-parts
mkdir -p "$OUT" "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
ab() { python3 -m attnbench.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -m gpu tests 2>&1 | tail -5 | tee -a "$OUT/gpu.txt"
ab ceilings --out "$OUT/ceilings.json"
deadline=$((SECONDS + ${BUDGET_S:-540}))
run() {  # group backend
  local left=$((deadline - SECONDS))
  if [ $left -lt 20 ]; then echo "skip $1/$2: out of time"; return; fi
  timeout $left python3 -m attnbench.cli microbench --config config/config.yaml --group "$1" --backend "$2" \
    --ceilings "$OUT/ceilings.json" --out "$work/$1--$2.parquet" 2>>"$work/log.txt" \
    || echo "job $1/$2 ended with $?"
  tail -1 "$work/log.txt"
}
for b in sdpa-cudnn sdpa-flash sdpa-efficient sdpa-math eager flex; do run anchor $b; done
for b in sdpa-cudnn sdpa-flash sdpa-efficient sdpa-math flex; do run decode $b; done
for b in sdpa-cudnn sdpa-flash sdpa-efficient; do run prefill $b; done
run prefill-flex flex
for b in sdpa-math eager; do run prefill $b; done
python3 - "$work" "$OUT" <<'PY'
import glob, sys, pandas as pd
work, out = sys.argv[1:]
df = pd.concat([pd.read_parquet(p) for p in sorted(glob.glob(f"{work}/*.parquet"))], ignore_index=True)
df.to_parquet(f"{out}/microbench-core.parquet", index=False)
cols = ["backend", "mode", "causal", "dtype", "status", "ms_median", "tflops", "cv", "err_ratio_vs_math"]
a = df[(df.group == "anchor")]
print(a[cols].to_string(index=False))
print(df.groupby(["backend", "status"]).size().to_string())
PY
cp "$work/log.txt" "$OUT/log.txt"
