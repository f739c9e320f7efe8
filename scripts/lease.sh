#!/usr/bin/env bash
# Run sweeps through Snakemake on a time-limited GPU lease, and pack what they made for the trip back.
#
#   OUT=<dir> BUDGET_S=<seconds> [EXPECT_GPU=H200] [RESTORE_ROWS=results/reference/<gpu>/<folder>] \
#     [SNAKEMAKE_CONFIG='<key>=<value>'] bash scripts/lease.sh <sweep>[:<group>,...] [<sweep>[:<group>,...] ...]
#   (from the repository root)
#
# Each <sweep> is config/sweeps/<sweep>.yaml. A sweep alone runs its default target (every job, and the report
# where nbconvert is installed: without it the report is left to `attnbench render` on the machine that commits);
# <sweep>:<group>,<group> runs only those results groups (results/<sweep>/microbench/<group>.parquet, a context
# sweep's results/<sweep>/context/cost/<group>.parquet, or a pretraining experiment's
# results/<sweep>/pretrain/<experiment>/runs.parquet), the first named first, for a cold machine that should not
# measure again the groups an earlier lease already brought back. A named pretraining experiment is run again
# even where its runs file exists (--forcerun pretrain_experiment): a job at its time_limit_s ends with runs
# `truncated` or `skipped`, and the next call continues them (finished runs are read back, not trained again).
# The lease is a host without network whose calls are cut after a few minutes: this wrapper only does what the
# pipeline cannot do for itself.
#   1. installs the wheel bundles carried in .gpu-wheels/ (../shared/tools/gpu-wheels; docs/reference-runs.md),
#      and puts an `attnbench` command on PATH where the package is not installed;
#   2. records the GPU (nvidia-smi) beside the results;
#   3. sets the deadline the guard honours (ATTNBENCH_DEADLINE): jobs that would start after it become rows
#      that say so, and a job still running then is stopped and keeps its finished rows;
#   4. runs `snakemake --configfile config/sweeps/<sweep>.yaml` (with SNAKEMAKE_CONFIG, one `--config` value on
#      top, merged key by key: e.g. pretrain={select: {runs: [...]}} trains only the runs a short lease can finish,
#      and the planned config in results/<sweep>/env records it); a cut call leaves a sweep that the next call
#      on the same warm machine resumes (Snakemake reruns only what is missing or incomplete), and that a cold
#      machine resumes from the pack of step 5, carried as .gpu-wheels/<sweep>.tar.gz and unpacked first, or, for
#      named pretraining experiments, from committed rows: with RESTORE_ROWS (the sweep's reference folder) a cold
#      machine first puts back the runs those rows finished (`attnbench experiment restore`), so a long experiment
#      spread over several sessions trains only the runs still missing (the rows are in the tree: nothing to carry);
#   5. packs results/<sweep>/, reports/<sweep>/ and the Snakemake log as $OUT/<sweep>.tar.gz (without checkpoints
#      and weight snapshots, *.pt: a cold machine keeps the finished training runs and the weight divergence rows
#      computed so far, restarts the truncated runs, and trains again the finished runs whose snapshots a
#      divergence pair still needs); a pack over FILE_LIMIT_BYTES, the largest file a call brings back, comes
#      back as <sweep>.tar.gz.part-00, -01, ... (`cat <sweep>.tar.gz.part-* > <sweep>.tar.gz` joins them: a call
#      brings back 8 files, so a lease runs few sweeps);
#   6. packs FlashInfer's JIT cache as $OUT/flashinfer-cache.tar.gz (when it fits what a call brings back): carried
#      in the next cold machine's call as .gpu-wheels/flashinfer-cache.tar.gz, it is unpacked before the sweeps, so
#      FlashInfer does not compile its kernel variants again (about a minute each).
# Provenance comes from git inside the jobs: carry a copy of .git and set GIT_DIR (docs/reference-runs.md; a tree with uncommitted
# changes writes git_sha <sha>-dirty, and such rows are never committed as reference).
set -uo pipefail
OUT=${OUT:?set OUT to the folder whose files come back}
BUDGET_S=${BUDGET_S:-540}          # the whole call; Snakemake is stopped SNAKEMAKE_MARGIN_S before its end
SNAKEMAKE_MARGIN_S=${SNAKEMAKE_MARGIN_S:-45}
JOBS_MARGIN_S=${JOBS_MARGIN_S:-75}  # no job starts in the last JOBS_MARGIN_S seconds (time for tables, report)
PARSE_S=${PARSE_S:-60}              # Snakemake's start on a GPU host (the plan imports torch), before any job
FILE_LIMIT_BYTES=${FILE_LIMIT_BYTES:-16000000}  # the largest file a call brings back
FLASHINFER_CACHE=${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer
[ $# -ge 1 ] || { echo "usage: OUT=<dir> bash scripts/lease.sh <sweep>[:<group>,...] [...]" >&2; exit 2; }
started=$(date +%s)
mkdir -p "$OUT"
# 0. the card: a reference sweep is for one GPU model (EXPECT_GPU, a part of nvidia-smi's name such as H200), and a
#    lease that named one kind can bring another: on any other card nothing is installed or measured
if [ -n "${EXPECT_GPU:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ $gpu == *"$EXPECT_GPU"* ]] || { echo "this GPU is '${gpu:-none}', not EXPECT_GPU=$EXPECT_GPU: nothing run" >&2; exit 3; }
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# 1. wheels and the attnbench command
if [ -f .gpu-wheels/install.sh ]; then
  bash .gpu-wheels/install.sh stage && bash .gpu-wheels/install.sh finish || echo "wheel install failed" >&2
fi
[ -f /opt/gpu-site/env.sh ] && source /opt/gpu-site/env.sh
export PYTHONPATH=$PWD:${PYTHONPATH}
if ! command -v attnbench >/dev/null 2>&1; then
  shim=$(mktemp -d)
  printf '#!/bin/sh\nexec python3 -m attnbench.cli "$@"\n' > "$shim/attnbench" && chmod +x "$shim/attnbench"
  export PATH="$shim:$PATH"
fi
# pip --target installs leave nbconvert's templates under <site>/share/jupyter, where Jupyter does not look
[ -d /opt/gpu-site/share/jupyter ] && export JUPYTER_PATH=/opt/gpu-site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}

if [ -f .gpu-wheels/flashinfer-cache.tar.gz ] && [ ! -d "$FLASHINFER_CACHE" ]; then
  mkdir -p "$(dirname "$FLASHINFER_CACHE")" && tar -xzf .gpu-wheels/flashinfer-cache.tar.gz -C "$(dirname "$FLASHINFER_CACHE")" \
    && echo "FlashInfer's JIT cache unpacked into $FLASHINFER_CACHE"
fi

pack() {  # 5. what the sweep made (this call's log beside it; the latest Snakemake log of the sweep inside)
  cp "$OUT/$1-snakemake.log" "results/$1/snakemake.log" 2>/dev/null
  tar -czf "$OUT/$1.tar.gz" --exclude="*.pt" \
    --ignore-failed-read "results/$1" "reports/$1" 2>/dev/null
  size=$(stat -c %s "$OUT/$1.tar.gz" 2>/dev/null || echo 0)
  if [ "$size" -gt "$FILE_LIMIT_BYTES" ]; then  # no file over the limit comes back: parts that do, joined by cat
    split -d -b "$FILE_LIMIT_BYTES" "$OUT/$1.tar.gz" "$OUT/$1.tar.gz.part-" && rm "$OUT/$1.tar.gz" \
      && echo "$1.tar.gz is ${size} bytes, over ${FILE_LIMIT_BYTES}: in parts, joined by cat $1.tar.gz.part-* > $1.tar.gz"
  fi
  ls -la "$OUT/$1".tar.gz* 2>/dev/null
}

# 2. the GPU, and the commit the jobs will record
{ nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
    --format=csv; echo "commit: $(git rev-parse HEAD 2>/dev/null || echo 'no .git: rows say unknown')";
  git status --porcelain --untracked-files=no 2>/dev/null | head -5; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

omit=()  # the report needs nbconvert, which the GPU image lacks unless a bundle brought it
python3 -c "import nbconvert" 2>/dev/null || { omit=(--omit-from report); echo "no nbconvert: the report is rendered where the rows are committed"; }

for spec in "$@"; do
  sweep=${spec%%:*}
  config=config/sweeps/$sweep.yaml
  [[ $sweep =~ ^[A-Za-z0-9][A-Za-z0-9_-]*$ && -f $config ]] || { echo "no sweep file $config (config/sweeps/<name>.yaml)" >&2; continue; }
  # a cold machine resumes what an earlier call packed: Snakemake sees its finished jobs (mtimes kept by tar)
  # as done, and the parse reopens its stopped ones; only the results folder is taken from the archive
  if [ -f ".gpu-wheels/$sweep.tar.gz" ] && [ ! -d "results/$sweep" ]; then
    tar -xzf ".gpu-wheels/$sweep.tar.gz" "results/$sweep" && echo "=== $sweep: resumed from .gpu-wheels/$sweep.tar.gz"
  fi
  cold=1; [ -d "results/$sweep" ] && cold=0
  targets=(); first=(); force=(); extra=()
  [ -n "${SNAKEMAKE_CONFIG:-}" ] && extra=(--config "$SNAKEMAKE_CONFIG")
  if [ "$spec" != "$sweep" ]; then  # the planner checks the group names and names the paths (attnbench plan --targets)
    listed=$(attnbench plan --config "$config" --targets "${spec#*:}") || { echo "=== $sweep: not started" >&2; continue; }
    mapfile -t targets <<< "$listed"
    first=(--prioritize "${targets[0]}")  # the first named group runs first; Snakemake orders the rest
    [[ $listed == *"/pretrain/"* ]] && force=(--forcerun pretrain_experiment)  # continue truncated experiments
  fi
  if [ -n "${RESTORE_ROWS:-}" ] && [ "$cold" = 1 ]; then  # the named experiments' finished runs, from committed rows
    for runs in "${targets[@]}"; do
      [[ $runs == */pretrain/*/runs.parquet ]] || continue  # a microbench or context group has no runs to restore
      folder=${runs%/runs.parquet}
      attnbench experiment restore --config "$config" --rows "$RESTORE_ROWS/pretrain/${folder##*/}" --out "$folder" \
        || echo "=== $sweep: nothing restored for ${folder##*/}" >&2
    done
  fi
  left=$(( started + BUDGET_S - SNAKEMAKE_MARGIN_S - $(date +%s) ))
  if [ "$left" -lt $(( JOBS_MARGIN_S + PARSE_S )) ]; then  # every job would only write its not-run rows
    echo "=== $sweep: not started, ${left}s left (a job needs more than ${JOBS_MARGIN_S} + ${PARSE_S}s)"
    [ -d "results/$sweep" ] && pack "$sweep"
    continue
  fi
  # 3. the deadline every guarded job honours
  export ATTNBENCH_DEADLINE=$(( $(date +%s) + left - JOBS_MARGIN_S ))
  echo "=== $sweep: ${left}s for Snakemake $(date -u +%T)${targets:+ (groups ${spec#*:})}"
  # 4. the sweep (a stale lock from a cut call is released first; incomplete outputs are rerun)
  snakemake --configfile "$config" --unlock >/dev/null 2>&1
  timeout --signal=INT --kill-after=20 "$left" \
    snakemake "${targets[@]}" --configfile "$config" "${extra[@]}" --cores all --rerun-incomplete \
      "${omit[@]}" "${first[@]}" "${force[@]}" \
    > "$OUT/$sweep-snakemake.log" 2>&1  # the targets first: --configfile, --config, --omit-from, --prioritize and --forcerun take every word after them
  echo "--- $sweep: snakemake exited $? after $(( $(date +%s) - started ))s"
  grep -E "^attnbench: |steps \([0-9]+%\) done|Error in rule|MissingOutput" "$OUT/$sweep-snakemake.log" | tail -8
  # "N of N steps done" counts a job that wrote only not-run rows at the deadline: the rows say what ran
  status_table=results/$sweep/microbench/tables/status.md
  [ -f "$status_table" ] && tail -n +3 "$status_table" | cut -c1-160
  # each pretraining experiment's runs by status, and the last lines of its job's log
  for runs in "results/$sweep"/pretrain/*/runs.parquet; do
    [ -f "$runs" ] || continue
    python3 -c 'import sys, pandas as pd; print(sys.argv[1], pd.read_parquet(sys.argv[1])["status"].value_counts().to_dict())' "$runs"
    experiment=$(basename "$(dirname "$runs")")
    tail -n 3 "results/$sweep/logs/pretrain/$experiment.log" 2>/dev/null | cut -c1-200
  done
  pack "$sweep"
done
# 6. FlashInfer's JIT cache, for the next cold machine
if [ -d "$FLASHINFER_CACHE" ]; then
  tar -czf "$OUT/flashinfer-cache.tar.gz" -C "$(dirname "$FLASHINFER_CACHE")" flashinfer 2>/dev/null
  size=$(stat -c %s "$OUT/flashinfer-cache.tar.gz" 2>/dev/null || echo 0)
  if [ "$size" -gt "$FILE_LIMIT_BYTES" ]; then
    rm -f "$OUT/flashinfer-cache.tar.gz"; echo "FlashInfer's JIT cache not packed: ${size} bytes compressed, over ${FILE_LIMIT_BYTES}"
  else
    echo "FlashInfer's JIT cache packed: ${size} bytes"
  fi
fi
echo "total $(( $(date +%s) - started ))s"
