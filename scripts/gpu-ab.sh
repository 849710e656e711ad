#!/usr/bin/env bash
# A/B of a sparse-kernel variant inside one device call, after
# scripts/gpu-iterate.sh: builds the sparse harness a second time with extra
# CUDA flags (a compile-time switch of the kernel) in build-gpu-b, runs it and
# writes harness_b.log and ratios_b.md (against the anchors.json of the same
# call) into $OUT.  Usage: scripts/gpu-ab.sh "-DSWITCH=1" [HARNESS_ARGS...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; flags=$1; shift
echo "== variant B: $flags"
cmake -S . -B build-gpu-b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$flags" \
  -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$out/build_b.log" 2>&1 &&
  ninja -C build-gpu-b -j 16 sparse_mla_kernel_bench >>"$out/build_b.log" 2>&1 || { tail -20 "$out/build_b.log"; exit 1; }
grep -E "spill" "$out/build_b.log" | sort | uniq -c
timeout 150 build-gpu-b/sparse_mla_kernel_bench "$@" >"$out/harness_b.log" 2>&1 || echo "HARNESS B FAILED"
python3 bench/kernel_ratios.py "$out/harness_b.log" "$out/anchors.json" --title "variant B: $flags" >"$out/ratios_b.md" && cat "$out/ratios_b.md"
