#!/usr/bin/env bash
# dsmla's sparse and dense kernels against the anchors in one process, sample
# by sample on the same tensors (bench/paired.py), on the GPU machine (device
# tool, carry [".deps", ".anchors"] and any experiment trees). Builds the
# kernel shim of this tree and of every --tree given (each in its own
# build-gpu: an A/B of dsmla variants whose every round also times the
# anchors), then writes four files into $OUT: env.txt, paired.md, paired.json
# (every sample and the SM clock of every round when pynvml is there) and
# clocks.csv (nvidia-smi every 50 ms with "# phase" lines; read only, nothing set).
# Usage: scripts/gpu-paired.sh [--tree DIR=LABEL[,NAME=VALUE...]]... [bench/paired.py options: --only K,K --quick
#        --rounds N, and --shim build-gpu/libdsmla_kernel_shim.so=LABEL,NAME=VALUE for this tree under a switch]
#   e.g. scripts/gpu-paired.sh --only prefill,decode --shim build-gpu/libdsmla_kernel_shim.so=halves,DSMLA_SPARSE_KEY_ROWS=2
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; mkdir -p "$out"
trees=("$root=dsmla"); args=()
while [ $# -gt 0 ]; do
  case $1 in
    --tree) [ $# -ge 2 ] && [ "${2#*=}" != "$2" ] || { echo "usage: --tree DIR=LABEL" >&2; exit 2; }
            trees+=("$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
{ date -u; echo "tree $(cat .tree 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; } >"$out/env.txt" 2>&1
shims=()
for spec in "${trees[@]}"; do
  dir=$(cd "${spec%%=*}" && pwd) label=${spec#*=}  # the label may carry ",NAME=VALUE" settings
  echo "== shim of $dir ($label)" >>"$out/env.txt"
  { cmake -S "$dir" -B "$dir/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >/dev/null &&
    ninja -C "$dir/build-gpu" -j 16 dsmla_kernel_shim | tail -2; } >>"$out/env.txt" 2>&1 ||
    { echo "BUILD FAILED: $dir"; tail -30 "$out/env.txt"; exit 1; }
  shims+=(--shim "$dir/build-gpu/libdsmla_kernel_shim.so=$label")
done
A=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$A" .anchors/*.whl >/dev/null 2>&1 || echo "anchor wheels did not install" >>"$out/env.txt"
clocks=$out/clocks.csv
echo "# phase paired $(date -u +%H:%M:%S.%3N)" >"$clocks"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader -lms 50 \
  >>"$clocks" 2>/dev/null &
smi_pid=$!
PYTHONPATH=$A python3 bench/paired.py "${shims[@]}" --anchors .anchors/anchors_bench.py \
  --json "$out/paired.json" --md "$out/paired.md" "${args[@]}"
status=$?
kill "$smi_pid" 2>/dev/null
exit $status
