#!/usr/bin/env bash
# Per-kernel durations of the fp8_ds_mla decode, ours and FlashMLA's, under
# Nsight Compute on the GPU machine (device tool, carry [".deps", ".anchors"]):
# for each H:B point, one launch of our sparse kernel and its split merge
# (tools/bench/kernels/sparse_mla_kernel_bench, the anchors' inputs) and one
# call of FlashMLA's decode (bench/profile_anchor.py: its split kernel and
# combine), each with its duration, grid, registers, occupancy and memory /
# compute throughput. ncu serialises the kernels, so programmatic launch
# overlap is not in these figures; they say which kernel holds the time.
# Never changes the GPU's clocks (--clock-control none). Builds build-gpu's
# harness if needed. Writes $OUT/decode_durations.txt.
# Usage: scripts/gpu-decode-durations.sh [H:B ...]   (default 128:1 128:16 64:16)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
out=${OUT:-$root/out}; mkdir -p "$out"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
points=("$@"); [ ${#points[@]} -gt 0 ] || points=(128:1 128:16 64:16)
for p in "${points[@]}"; do
  [[ $p =~ ^[0-9]+:[0-9]+$ ]] || { echo "gpu-decode-durations: '$p' is not H:B" >&2; exit 2; }
done
[ -x build-gpu/sparse_mla_kernel_bench ] || {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSMLA_GTEST_SOURCE_DIR="$root/.deps/googletest" >/dev/null &&
    ninja -C build-gpu -j 16 sparse_mla_kernel_bench >/dev/null; } || { echo "gpu-decode-durations: build failed"; exit 1; }
anchors=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$anchors" .anchors/*.whl >/dev/null 2>&1 ||
  echo "gpu-decode-durations: anchor wheels did not install" >&2
report=$out/decode_durations.txt; : >"$report"
sections=(--clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy)
keep='^  [a-zA-Z_].*\(|Duration|Grid Size|Registers Per|Achieved Occ|Memory Throughput|Compute \(SM\)'
log=$(mktemp)
for p in "${points[@]}"; do
  h=${p%:*} b=${p#*:}
  # The first launch of the case: its check run (the sparse kernel, then the merge when split).
  timeout 120 ncu "${sections[@]}" -c 2 -k regex:"head_rows|sparse_mla" \
    build-gpu/sparse_mla_kernel_bench --decode-sweep --case "H$h B$b\$" >"$log" 2>&1 || echo "(ncu rc $?)" >>"$report"
  { echo "== dsmla H $h batch $b"; grep -E "$keep" "$log"; } >>"$report"
  timeout 120 env PYTHONPATH="$anchors" ncu "${sections[@]}" --profile-from-start off -c 4 \
    python3 bench/profile_anchor.py flashmla_decode "$b" "$h" >"$log" 2>&1 || echo "(ncu rc $?)" >>"$report"
  { echo "== FlashMLA H $h batch $b"; grep -E "$keep" "$log"; } >>"$report"
done
rm -f "$log"
grep -E "^==|^  [a-zA-Z_]|Duration" "$report"
