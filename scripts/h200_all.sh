#!/usr/bin/env bash
# One GPU lease, several reference stages: each stage script runs under its own time budget with its own
# output folder, then is packed into "$OUT/<stage>.tar.gz" (the lease returns at most 8 files).
# usage (GPU host, repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> bash scripts/h200_all.sh stage:budget_s ...
#   stages: core pipeline backends stability hbm triton pretrain context
set -uo pipefail
OUT=${OUT:?set OUT}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
declare -A SCRIPT=(
  [core]="bash scripts/h200_core.sh" [pipeline]="bash scripts/h200_pipeline.sh"
  [backends]="python3 scripts/h200_backends.py" [stability]="python3 scripts/h200_stability.py"
  [hbm]="bash scripts/h200_hbm.sh" [triton]="python3 scripts/h200_triton.py"
  [pretrain]="bash scripts/h200_pretrain.sh" [context]="bash scripts/h200_context.sh"
)
for spec in "$@"; do
  stage=${spec%%:*}; budget=${spec##*:}
  dir=/tmp/attnbench-out/$stage; rm -rf "$dir"; mkdir -p "$dir"
  echo "=== $stage (budget ${budget}s) $(date -u +%T)"
  # the stage keeps 10% of its budget for its own wrap-up; a hard kill 15 s after the budget
  OUT=$dir BUDGET_S=$((budget * 9 / 10)) timeout -k 5 $((budget + 15)) ${SCRIPT[$stage]} > "$dir/stdout.txt" 2>&1
  echo "--- $stage exit $? $(date -u +%T)"; tail -25 "$dir/stdout.txt"
  tar -czf "$OUT/$stage.tar.gz" -C /tmp/attnbench-out "$stage"
done
