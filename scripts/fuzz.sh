#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, CUDA off) in
# build-fuzz/, runs every file of fuzz/regressions/ through every target, then
# fuzzes each target for SECONDS (default 60) from a seed corpus of valid small
# inputs. Any crash, sanitizer report, leak, timeout or out-of-memory fails the
# script; libFuzzer leaves the input in build-fuzz/artifacts/.
#
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 3600       # an hour per target; the corpus in build-fuzz/corpus/ grows across runs
#   DSMLA_FUZZ_JOBS=4 scripts/fuzz.sh 3600   # 4 parallel fuzzing processes per target
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-60}
case $seconds in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2 ;; esac
fuzz_jobs=${DSMLA_FUZZ_JOBS:-1}
jobs=${DSMLA_JOBS:-$(nproc)}
targets=(safetensors case planner)

scripts/install-deps.sh --fuzz
build=$root/build-fuzz
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DDSMLA_ENABLE_CUDA=OFF -DDSMLA_BUILD_TESTS=OFF -DDSMLA_BUILD_FUZZERS=ON >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
ninja -C "$build" -j "$jobs" "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
common=(-timeout=20 -rss_limit_mb=2560 -malloc_limit_mb=2560 -print_final_stats=1)

echo "== fuzz: every regression input through every target"
mapfile -t regressions < <(find fuzz/regressions -type f | sort)
for t in "${targets[@]}"; do
  DSMLA_FUZZ_FORWARD=1 "$build/fuzz/fuzz_$t" "${common[@]}" "${regressions[@]}" >"$build/regressions_$t.log" 2>&1 \
    || { tail -50 "$build/regressions_$t.log"; echo "fuzz: target $t fails on a regression input" >&2; exit 1; }
  echo "fuzz_$t: ${#regressions[@]} regression inputs ok"
done

[ "$seconds" -gt 0 ] || { echo "== fuzz: regressions passed (no fuzzing asked for)"; exit 0; }

# Seeds: valid small inputs (the regression tree holds them: valid_* files);
# the corpus directory keeps what the fuzzer finds between runs.
seeds=$build/seeds
rm -rf "$seeds"
for t in "${targets[@]}"; do mkdir -p "$seeds/$t" "$build/corpus/$t"; done
cp fuzz/regressions/case/valid_* "$seeds/case/"
cp fuzz/regressions/case/valid_* "$seeds/safetensors/"
cp fuzz/regressions/planner/valid_* "$seeds/planner/"
mkdir -p "$build/artifacts"
declare -A max_len=([safetensors]=65536 [case]=65536 [planner]=4096)
for t in "${targets[@]}"; do
  echo "== fuzz: fuzz_$t for ${seconds} s"
  log=$build/fuzz_$t.log
  extra=()
  [ "$fuzz_jobs" -gt 1 ] && extra=(-fork="$fuzz_jobs")
  if ! "$build/fuzz/fuzz_$t" "${common[@]}" "${extra[@]}" -max_total_time="$seconds" -max_len="${max_len[$t]}" \
      -artifact_prefix="$build/artifacts/${t}-" "$build/corpus/$t" "$seeds/$t" >"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz: fuzz_$t FAILED (input saved under $build/artifacts/)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$log" | tail -2 | sed "s/^/fuzz_$t: /"
done
echo "== fuzz: no crash"
