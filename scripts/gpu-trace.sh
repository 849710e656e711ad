#!/usr/bin/env bash
# Timelines of the sparse MLA kernel's CTAs on the GPU machine: builds the
# harness with per-CTA clock stamps (-DDSMLA_TRACE=ON, in build-trace; the
# library of every other build is untouched), runs each CASE once traced
# after its timing, and summarises the stamps with bench/trace_timeline.py.
# The stamps' stores perturb the kernel: read timelines, not times, from it.
# Writes into $OUT: trace.md (the timelines), trace.csv.gz (the stamps).
# --build-only: only the build (e.g. in the background while other trees build;
# the later run finds it done).
# Usage: scripts/gpu-trace.sh --build-only | CASE...   (harness case names of
#   --decode-sweep, '$'-anchored as --case takes them), e.g.
#   scripts/gpu-trace.sh "H128 B16$" "H128 B128$"
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; mkdir -p "$out"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSMLA_TRACE=ON -DDSMLA_BUILD_TESTS=OFF \
  >"$out/trace_build.log" 2>&1 &&
  ninja -C build-trace -j "${TRACE_JOBS:-16}" sparse_mla_kernel_bench >>"$out/trace_build.log" 2>&1 ||
  { tail -30 "$out/trace_build.log"; echo "gpu-trace: build failed"; exit 1; }
rm -f "$out/trace_build.log"
[ "$1" = --build-only ] && exit 0
csv=$(mktemp)
status=0
for c in "$@"; do
  build-trace/sparse_mla_kernel_bench --decode-sweep --case "$c" --trace "$csv" | grep -E "median|FAILED" ||
    { echo "gpu-trace: case '$c' failed"; status=1; }
done
python3 bench/trace_timeline.py "$csv" >"$out/trace.md" || status=1
gzip -c "$csv" >"$out/trace.csv.gz"
exit $status
