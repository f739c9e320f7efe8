#!/usr/bin/env bash
# Reference run of the pipeline on one GPU (issue 3): the paper sweep (config/sweeps/paper.yaml)
# through Snakemake itself, up to the rendered report; then into $OUT:
#   microbench-<sweep>.parquet every results row of the sweep
#   <sweep>-outputs.tar.gz     tables (md/tex/csv), figures (png/svg), env files, logs, job benchmarks
#   report.html                the executed report (figures embedded)
# Needs snakemake, jupytext, nbconvert and ipykernel importable (installed from wheels beforehand).
# usage (GPU host, repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> bash scripts/h200_pipeline.sh
set -uo pipefail
OUT=${OUT:-results/h200-pipeline}
SWEEP=${SWEEP:-paper}  # config/sweeps/$SWEEP.yaml
RESULTS=results/$SWEEP
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
started=$(date +%s)
# Time boxes: Snakemake as a whole, and the point after which microbench jobs become "not run" rows.
SNAKEMAKE_BUDGET_S=${SNAKEMAKE_BUDGET_S:-$(( ${BUDGET_S:-470} - 20 ))}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-$(( SNAKEMAKE_BUDGET_S * 4 / 5 ))}

# The rules call `attnbench`; where the package is on PYTHONPATH but not installed, a shim provides it.
if ! command -v attnbench >/dev/null 2>&1; then
  shim=$(mktemp -d)
  printf '#!/bin/sh\nexec python3 -m attnbench.cli "$@"\n' > "$shim/attnbench"
  chmod +x "$shim/attnbench"
  export PATH="$shim:$PATH"
fi
# Wheels installed with `pip --target` keep nbconvert's templates under <target>/share/jupyter, which
# Jupyter does not search by itself (the report rule failed on the H200 host without this).
IFS=: read -ra site_dirs <<< "${PYTHONPATH:-}"
for d in "${site_dirs[@]}"; do
  [ -d "$d/share/jupyter" ] && export JUPYTER_PATH="$d/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv || true
echo "snakemake $(snakemake --version 2>&1 | tail -1); $(python3 -m jupytext --version 2>&1 | tail -1) jupytext; nbconvert $(python3 -c 'import nbconvert; print(nbconvert.__version__)' 2>&1 | tail -1)"

# Microbench jobs that would start, or still run, after this point become rows that say so
# (attnbench guard), so aggregation and the report still run inside Snakemake's time box.
export ATTNBENCH_DEADLINE=$((started + BENCH_BUDGET_S))
rm -rf "$RESULTS" "reports/$SWEEP"
echo "time boxes: snakemake ${SNAKEMAKE_BUDGET_S}s, microbench jobs start until ${BENCH_BUDGET_S}s"
timeout "$SNAKEMAKE_BUDGET_S" snakemake report --configfile "config/sweeps/$SWEEP.yaml" --cores all \
  > "$OUT/snakemake.log" 2>&1
echo "snakemake exited with $? after $(( $(date +%s) - started )) s"
grep -E "^attnbench: |steps \(|Error|error" "$OUT/snakemake.log" | tail -20

# If Snakemake could not aggregate (parse failure, timeout), join whatever job outputs exist.
if [ ! -f "$RESULTS/microbench.parquet" ] && ls "$RESULTS"/microbench/*/*.parquet >/dev/null 2>&1; then
  echo "aggregate did not run under snakemake; joining the job outputs directly"
  attnbench aggregate --merged "$RESULTS/microbench.parquet" --tables "$RESULTS/tables" \
    --figures "$RESULTS/figures" "$RESULTS"/microbench/*/*.parquet || echo "aggregate failed"
fi
[ -f "$RESULTS/microbench.parquet" ] && cp "$RESULTS/microbench.parquet" "$OUT/microbench-$SWEEP.parquet"
[ -f "reports/$SWEEP/report.html" ] && cp "reports/$SWEEP/report.html" "$OUT/report.html"
mv "$OUT/snakemake.log" "$RESULTS/snakemake.log" 2>/dev/null || true
tar -czf "$OUT/$SWEEP-outputs.tar.gz" --ignore-failed-read "$RESULTS/tables" "$RESULTS/figures" "$RESULTS/env" \
  "$RESULTS/logs" "$RESULTS/benchmarks" "$RESULTS/snakemake.log" 2>/dev/null || echo "tar reported a problem"
ls -la "$OUT"

python3 - "$OUT" "$SWEEP" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out, sweep = Path(sys.argv[1]), sys.argv[2]
path = out / f"microbench-{sweep}.parquet"
if not path.is_file():
    sys.exit("no merged results")
df = pd.read_parquet(path)
print(df.groupby(["backend", "status"]).size().unstack(fill_value=0).to_string())
ok = df[df.status == "ok"]
pre = ok[ok["mode"].isin(["fwd", "fwd_bwd"])].pivot_table(index=["mode", "causal", "backend"], columns="seq_kv",
                                                           values="tflops", aggfunc="max")
print("\nTFLOP/s (prefill)\n" + pre.round(1).to_string())
dec = ok[ok["mode"] == "decode"].pivot_table(index=["dtype", "layout", "backend"], columns="seq_kv", values="gbps",
                                             aggfunc="max")
print("\nGB/s (decode)\n" + dec.round(1).to_string())
PY
echo "total $(( $(date +%s) - started )) s"
