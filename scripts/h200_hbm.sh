#!/usr/bin/env bash
# HBM traffic on one GPU (issue 5): DRAM bytes per (case, backend) from Nsight Compute against the byte
# model, roofline placement at the measured intensity, and the KV bytes/token ledger checked against
# decode kernels, for the hbm groups of attnbench/schemas/hbm.schema.yaml (the H200 reference set):
#   fwd     causal and not, S 1k/4k/16k with B*S = 16k, H16 D128 bf16 (holds the anchor B4 H16 S4096)
#   decode  GQA Hq32 Hkv8 D128 B16 at KV 4k/16k/64k
#   mla     absorbed MLA decode (d_c 512 + d_h^R 64, 16 heads) via sdpa-math, eager, flex (+ flashinfer-mla)
# Core backends first; optional ones (flashinfer-mla, fa4, flashinfer, ...) where registered, while time is left.
# Writes $OUT/hbm.parquet, $OUT/ledger.parquet, $OUT/hbm-figures.tar.gz; prints a table, the ledger
# check, and last the anchor check (bytes read / Q+K+V bytes, expected ~1.0-1.2x on flash-style kernels).
# HBM_PARTS picks parts (default: all; names: fwd mla mla-extra fwd-extra decode-extra decode); with
# KEEP=<earlier hbm.parquet>, its rows of (group, backend) pairs not measured now join the table.
# usage (GPU host, repository root): ATTNBENCH_GIT_SHA=<sha> OUT=<dir> [HBM_PARTS="..."] [KEEP=<parquet>] bash scripts/h200_hbm.sh
set -uo pipefail
HBM_PARTS=${HBM_PARTS:-fwd mla mla-extra fwd-extra decode-extra decode}
KEEP=${KEEP:-}
OUT=${OUT:-results/h200-hbm}
work=${WORK:-/tmp/attnbench-h200-hbm}
rm -rf "$work"
mkdir -p "$OUT" "$work/parts" "$work/figures"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${BUDGET_S:-230}))
reserve=25  # ledger, figures and the summary at the end
log="$work/log.txt"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
(ncu --version 2>&1 || echo "ncu: not found") | tail -1

# The repository's config with schema defaults for hbm (the reference set); short timing, one ncu limit.
python3 - "$work/config.yaml" <<'PY' || echo "config: failed"
import sys, yaml
config = yaml.safe_load(open("config/config.yaml"))
config.pop("hbm", None)
config.update(sweep="h200-hbm", numerics=False,
              timing={**config.get("timing", {}), "warmup_ms": 100, "rep_ms": 100},
              hbm={"timeout_s": 200})
yaml.safe_dump(config, open(sys.argv[1], "w"), sort_keys=False)
PY
{ read -r -a extra; read -r -a mla_extra; } < <(python3 -c "
from attnbench.kernels.registry import backend_names
names = backend_names()
print(' '.join(n for n in ['fa4', 'fa3', 'fa2', 'flashinfer', 'flashinfer-fp8kv', 'triton'] if n in names))
print(' '.join(n for n in ['flashinfer-mla'] if n in names))")
echo "optional backends registered here: ${extra[*]:-none}; for mla: ${mla_extra[*]:-none}"
timeout 60 python3 -m attnbench.cli ceilings --out "$work/ceilings.json" 2>>"$log" || echo "ceilings: failed"

part() {  # name min_seconds hbm-args...: one `attnbench hbm` call, skipped when not chosen or too little time is left
  local name=$1 need=$2
  shift 2
  [[ " $HBM_PARTS " == *" $name "* ]] || return 0
  local left=$((deadline - SECONDS - reserve))
  if [ "$left" -lt "$need" ]; then echo "skip $name: ${left}s left"; return; fi
  local ceil=()
  [ -s "$work/ceilings.json" ] && ceil=(--ceilings "$work/ceilings.json")
  timeout -k 10 "$left" python3 -m attnbench.cli hbm --config "$work/config.yaml" "${ceil[@]}" \
    --workdir "$work/ncu" --out "$work/parts/$name.parquet" "$@" >>"$log" 2>&1 || echo "part $name ended with $?"
  echo "part $name done at ${SECONDS}s"
}
with() { local g=$1; shift; local a=(--group "$g"); for b in "$@"; do a+=(--backend "$b"); done; echo "${a[@]}"; }

core=(sdpa-flash sdpa-cudnn sdpa-efficient sdpa-math eager flex)
# shellcheck disable=SC2046
# prefill first (it holds the anchor), then what a short lease may leave out
part fwd 60 $(with fwd "${core[@]}")
part mla 30 --group mla
# FlashInfer's MLA kernel (its JIT compile is in the part's time): the absorbed decode on a dedicated kernel
[ ${#mla_extra[@]} -gt 0 ] && part mla-extra 60 $(with mla "${mla_extra[@]}")
if [ ${#extra[@]} -gt 0 ]; then
  part fwd-extra 40 $(with fwd "${extra[@]}")
  part decode-extra 30 $(with decode "${extra[@]}")
fi
part decode 40 $(with decode "${core[@]}")

if [ -n "$KEEP" ]; then  # earlier rows of the (group, backend) pairs not measured now
  python3 - "$KEEP" "$work/parts" <<'PY' || echo "keep: failed"
import glob, sys
import pandas as pd
keep, parts = sys.argv[1:]
now = pd.concat([pd.read_parquet(p) for p in glob.glob(f"{parts}/*.parquet")] or [pd.DataFrame(columns=["group", "backend"])])
measured = set(zip(now["group"], now["backend"]))
earlier = pd.read_parquet(keep)
kept = earlier[[pair not in measured for pair in zip(earlier["group"], earlier["backend"])]]
kept.to_parquet(f"{parts}/kept.parquet", index=False)
print(f"kept {len(kept)} earlier rows of {len(set(zip(kept['group'], kept['backend'])))} (group, backend) pairs")
PY
fi
parts=("$work"/parts/*.parquet)
if [ -e "${parts[0]}" ]; then
  python3 -m attnbench.cli hbm-table --out "$OUT/hbm.parquet" "${parts[@]}" 2>>"$log" || echo "hbm-table: failed"
fi
hbm=()
[ -s "$OUT/hbm.parquet" ] && hbm=(--hbm "$OUT/hbm.parquet")
python3 -m attnbench.cli ledger --config "$work/config.yaml" "${hbm[@]}" --out "$OUT/ledger.parquet" 2>>"$log" \
  || echo "ledger: failed"
if [ -s "$OUT/hbm.parquet" ] && [ -s "$OUT/ledger.parquet" ]; then
  python3 -m attnbench.cli hbm-figures --hbm "$OUT/hbm.parquet" --ledger "$OUT/ledger.parquet" \
    --out "$work/figures" 2>>"$log" && tar czf "$OUT/hbm-figures.tar.gz" -C "$work" figures
fi
grep -E "Traceback|Error|error:" "$log" | tail -12

python3 - "$OUT" <<'PY'
import sys
import pandas as pd
out = sys.argv[1]
try:
    df = pd.read_parquet(f"{out}/hbm.parquet")
except Exception as err:
    print(f"no hbm table: {err}")
    sys.exit(0)
pd.set_option("display.width", 220, "display.max_colwidth", 70, "display.max_rows", 400)
df["case"] = [f"{r.mode} {r.layout} B{r.batch} S{r.seq_q}/{r.seq_kv}{' c' if r.causal else ''}" for r in df.itertuples()]
ok = df[df.status == "ok"]
t = pd.DataFrame({"backend": ok.backend, "case": ok.case, "read_MB": ok.bytes_read / 1e6,
                  "write_MB": ok.bytes_written / 1e6, "x_model": ok.ratio_measured_model,
                  "x_min": ok.ratio_measured_min, "ms": ok.ms_median, "GB/s": ok.gbps_measured,
                  "bound": ok.bound_measured, "kernels": ok.n_kernels_profiled})
print(t.round(2).to_string(index=False))
print(df.groupby(["backend", "status"]).size().to_string())
bad = df[df.status != "ok"]
if len(bad):
    print(bad.assign(reason=bad.reason.str[:110]).groupby(["backend", "status", "reason"]).size().to_string())
try:
    led = pd.read_parquet(f"{out}/ledger.parquet")
    m = led[(led.table == "kv_measured") & (led.status == "ok")]
    print(m[["backend", "name", "dtype", "seq_kv", "bytes_per_token_layer", "measured_bytes_per_token_layer",
             "ratio_measured_formula", "decode_ms_per_step", "decode_us_per_token", "frac_of_bw"]]
          .rename(columns={"bytes_per_token_layer": "formula_B/tok", "measured_bytes_per_token_layer": "read_B/tok",
                           "ratio_measured_formula": "x_formula", "decode_ms_per_step": "ms/step",
                           "decode_us_per_token": "us/tok"}).round(3).to_string(index=False))
except Exception as err:
    print(f"no ledger: {err}")
a = df[(df["mode"] == "fwd") & df.causal & (df.batch == 4) & (df.heads_q == 16) & (df.seq_q == 4096)
       & (df.head_dim_qk == 128) & (df.dtype == "bf16")]
rows = [f"{r.backend} {r.ratio_read_min:.2f}x" if r.status == "ok" else f"{r.backend} {r.status}"
        for r in a.itertuples()]
qkv = a.read_min.iloc[0] / 1e6 if len(a) else float("nan")
print(f"ANCHOR causal fwd B4 H16 S4096 D128 bf16, bytes read / Q+K+V ({qkv:.0f} MB), expected ~1.0-1.2x on "
      f"flash-style kernels: " + ("; ".join(rows) if rows else "no rows"))
PY
