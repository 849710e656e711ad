#!/usr/bin/env bash
# A/B of a kernel variant inside one device call, after
# scripts/gpu-iterate.sh: builds the sparse and dense harnesses a second time
# with extra CUDA flags (a compile-time switch of a kernel) in build-gpu-b, runs
# them and writes harness_b.log (the dense harness's table at its end, as in
# gpu-iterate's harness.log) and ratios_b.md (against the anchors.json of the
# same call) into $OUT.  Usage: scripts/gpu-ab.sh "-DSWITCH=1" [HARNESS_ARGS...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; flags=$1; shift
echo "== variant B: $flags"
cmake -S . -B build-gpu-b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$flags" \
  -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >"$out/build_b.log" 2>&1 &&
  ninja -C build-gpu-b -j 16 sparse_mla_kernel_bench dense_mha_kernel_bench >>"$out/build_b.log" 2>&1 ||
  { tail -20 "$out/build_b.log"; exit 1; }
grep -E "spill" "$out/build_b.log" | sort | uniq -c
timeout 150 build-gpu-b/sparse_mla_kernel_bench "$@" >"$out/harness_b.log" 2>&1 || echo "HARNESS B FAILED"
{ echo; echo "== dense MHA kernel harness"; } >>"$out/harness_b.log"
timeout 100 build-gpu-b/dense_mha_kernel_bench >>"$out/harness_b.log" 2>&1 || echo "DENSE HARNESS B FAILED"
sed -n '/== dense MHA kernel harness/,$p' "$out/harness_b.log" | grep -iE "ms|fail|mismatch" | head -20
python3 bench/kernel_ratios.py "$out/harness_b.log" "$out/anchors.json" --title "variant B: $flags" >"$out/ratios_b.md" && cat "$out/ratios_b.md"
