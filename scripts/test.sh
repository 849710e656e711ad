#!/usr/bin/env bash
# The test command of the README: installs the pinned dependencies, builds,
# and runs every test that needs no GPU, then the same CPU tests again under
# AddressSanitizer + UBSan, then the libFuzzer targets briefly (scripts/fuzz.sh).
# After the release tests: the Python package (pip install . into a venv under
# build/, CPU-only: the CUDA code is compiled once, by the release build) and
# its CPU pytest set (tests/python/cpu), which compares against build/dsmla,
# and the tests of the benchmark scripts that need no GPU (tests/bench).
# Tests labelled `gpu` also run (and report a skip) when no GPU is visible;
# pass --cpu-only to leave them out.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
labels="cpu|gpu"; sanitize=1; fuzz=1; python=1
for a in "$@"; do
  case $a in
    --cpu-only) labels="cpu" ;;
    --no-sanitize) sanitize=0 ;;
    --no-fuzz) fuzz=0 ;;
    --no-python) python=0 ;;
    *) echo "usage: scripts/test.sh [--cpu-only] [--no-sanitize] [--no-fuzz] [--no-python]" >&2; exit 2 ;;
  esac
done
phase_start=$SECONDS
phase() {  # the wall time of each phase, for keeping CI inside its budget
  echo "== [$((SECONDS - phase_start)) s] $*"; phase_start=$SECONDS
}
scripts/install-deps.sh
jobs=${DSMLA_JOBS:-$(nproc)}

phase "dependencies done; release build and tests"
scripts/build.sh build
ctest --test-dir build -L "$labels" --output-on-failure -j "$jobs" --timeout 1800

if [ $python = 1 ]; then
  phase "Python package (CPU-only build) and its CPU tests"
  scripts/python-env.sh build/venv
  # --no-build-isolation: the venv's pinned scikit-build-core / nanobind build it.
  # The wheel's own build tree (build-python/) rebuilds incrementally.
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs build/venv/bin/python -m pip install -q --no-build-isolation --no-deps \
    --disable-pip-version-check --config-settings=cmake.define.DSMLA_ENABLE_CUDA=OFF .
  DSMLA_CLI=$root/build/dsmla build/venv/bin/python -m pytest -q tests/python/cpu tests/bench
fi

if [ $sanitize = 1 ]; then
  phase "ASan + UBSan build (host code) and CPU tests"
  DSMLA_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-asan -DDSMLA_SANITIZE=ON -DDSMLA_ENABLE_CUDA=OFF
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    DSMLA_TEST_SCALE=small ctest --test-dir build-asan -L cpu --output-on-failure -j "$jobs" --timeout 1800
fi
if [ $fuzz = 1 ]; then
  # libFuzzer targets (clang): the regression inputs, then 15 s of fuzzing per
  # target (about 4 minutes with the build on 2 cores). Longer: scripts/fuzz.sh 3600.
  phase "fuzzers"
  scripts/fuzz.sh "${DSMLA_FUZZ_SECONDS:-15}"
fi
phase "all tests passed"
