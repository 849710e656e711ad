#!/usr/bin/env bash
# One kernel launch under Nsight Compute on the GPU machine, summarised by
# bench/ncu_phases.py (stall reasons, barrier-delimited phases, the hottest
# instructions). Needs build-gpu (scripts/gpu-iterate.sh builds it); never
# changes the GPU's clocks (--clock-control none). Writes into $OUT:
#   profile_details.txt   ncu's details page (speed of light, occupancy, warp states)
#   profile_phases.md     bench/ncu_phases.py of the source page
#   profile_source.csv.gz the source page itself (per-instruction SASS counters)
# LAUNCH_SKIP (default 0) skips that many launches of the kernel first.
# (Run as a whole on the GPU machine on 2026-12-03: decode and 16K-prefill logits.)
# Usage: scripts/gpu-profile.sh KERNEL_REGEX BINARY [ARGS...]
#   e.g. scripts/gpu-profile.sh topk_kernel build-gpu/indexer_kernel_bench --kernel wgmma_ws \
#          --case "decode B=64 ctx=65536" --no-check
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; mkdir -p "$out"
kernel=$1; shift
report=$(mktemp -d)/profile
ncu --clock-control none -k "regex:$kernel" --launch-skip "${LAUNCH_SKIP:-0}" -c 1 --set full --import-source yes \
  -f -o "$report" "$@" >"$out/profile_run.log" 2>&1 || { tail -20 "$out/profile_run.log"; echo "gpu-profile: ncu failed"; exit 1; }
ncu -i "$report.ncu-rep" --page details >"$out/profile_details.txt" 2>&1
ncu -i "$report.ncu-rep" --page source --csv --print-source sass >"$report.csv" 2>&1
python3 bench/ncu_phases.py "$report.csv" >"$out/profile_phases.md" || exit 1
gzip -c "$report.csv" >"$out/profile_source.csv.gz"
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Achieved Occupancy" "$out/profile_details.txt" | head -6
head -4 "$out/profile_phases.md"
