#!/usr/bin/env bash
# A few Nsight Compute counters (time, tensor pipe, L2 and DRAM traffic,
# instructions, SM clock) of every launch of the kernels matching
# KERNEL_REGEX while bench/paired.py runs the prebuilt shims DIR (one round,
# no warm-up: each contender's first calls are the checks and the one timed
# call), so dsmla's kernels and the anchors' are read under the same counters
# in one process. Never changes the GPU's clocks (--clock-control none).
# Writes $OUT/metrics.csv (ncu --csv --page raw) and $OUT/metrics.md (one row
# a launch). Carry [".anchors", ".exp", ".tree"].
# Usage: scripts/gpu-metrics.sh KERNEL_REGEX DIR=LABEL... -- PAIRED_ARGS...
#   e.g. scripts/gpu-metrics.sh 'dense_mha_kernel|device_kernel|sdpa' .exp/main=dsmla -- --only dense --sizes 4096
#   (FlashAttention-3's kernel is a cutlass::device_kernel)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
. scripts/gpu-steps.sh
out=${OUT:-$root/out}; mkdir -p "$out"
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
regex=$1; shift
tree_args "scripts/gpu-metrics.sh KERNEL_REGEX DIR=LABEL... -- PAIRED_ARGS..." has_shim "$@"
shims=()
for spec in "${trees[@]}"; do shims+=(--shim "${spec%%=*}/libdsmla_kernel_shim.so=${spec#*=}"); done
anchors=$(anchor_packages) || echo "gpu-metrics: the anchor wheels did not install" >&2
metrics=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__inst_executed.sum,\
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,\
dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
l1tex__m_xbar2l1tex_read_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active
PYTHONPATH=$anchors ncu --clock-control none -k "regex:$regex" --metrics "$metrics" --csv --page raw \
  python3 bench/paired.py "${shims[@]}" --anchors .anchors/anchors_bench.py --rounds 1 --warmup 0 ${paired[@]+"${paired[@]}"} \
  >"$out/metrics_run.log" 2>&1 || { tail -20 "$out/metrics_run.log"; echo "gpu-metrics: ncu failed"; exit 1; }
grep -E '^"' "$out/metrics_run.log" >"$out/metrics.csv"
python3 - "$out/metrics.csv" "$metrics" >"$out/metrics.md" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units, data = rows[0], rows[1], rows[2:]
keep = [head.index("Kernel Name")] + [head.index(m) for m in sys.argv[2].split(",") if m in head]
print("| " + " | ".join(f"{head[i]} ({units[i]})" if units[i] else head[i] for i in keep) + " |")
print("|" + "---|" * len(keep))
for r in data:
    print("| " + " | ".join(r[i][:60] for i in keep) + " |")
PY
cat "$out/metrics.md"
