#!/usr/bin/env bash
# One call on the GPU machine (Python 3.12 with torch and transformers, nvcc,
# no network): builds and installs the Python package with the CUDA backend
# (sm_90a, 16 jobs) from this checkout, then runs the Python GPU tests
# (tests/python/gpu: torch op vs the C++ CUDA backend, torch.compile, CUDA
# graphs, the transformers adapter) and the CPU set. Each test file runs on
# its own (with a time limit), so a failure or crash leaves the others
# running; a summary ends the output.
#
# Usage (device tool, carry [".whl", ".deps"]; scripts/pack-python-wheels.sh
# and scripts/pack-device-deps.sh fill them):
#   scripts/gpu-python.sh [TEST_PATH...]   logs into $OUT (default ./out)
# TEST_PATH: only these test files / folders (default: the GPU set, then the
# CPU set). DSMLA_TEST_TIMEOUT: seconds per test file (default 300). The
# build tree (build-gpu-python/build) is kept, so a second call on a warm
# machine rebuilds incrementally.
# Files written (flat): python-env.txt, python-build.log, python-tests.log,
# transformers.json (logit errors, prefill times).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/out}
mkdir -p "$out"
py=${DSMLA_PYTHON:-python3}
jobs=${DSMLA_JOBS:-16}
work=$root/build-gpu-python
tools=$work/tools site=$work/site
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi

{ date -u; git rev-parse HEAD 2>/dev/null; "$py" --version; nvcc --version | tail -1; cmake --version | head -1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$py" -c 'import numpy, torch; print("numpy", numpy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)'
  "$py" -c 'import transformers; print("transformers", transformers.__version__)'
  "$py" -c 'import pytest; print("pytest", pytest.__version__)'; } >"$out/python-env.txt" 2>&1
cat "$out/python-env.txt"

echo "== build tools from .whl (into $tools, not the system's site-packages)"
[ -d .whl ] || { echo "no .whl/: run scripts/pack-python-wheels.sh and carry .whl"; exit 1; }
rm -rf "$tools"
want=(scikit-build-core nanobind pathspec packaging)
"$py" -c 'import pytest' 2>/dev/null || want+=(pytest iniconfig pluggy pygments)
"$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --find-links .whl --target "$tools" \
  "${want[@]}" >"$out/python-build.log" 2>&1 || { cat "$out/python-build.log"; echo "TOOLS FAILED"; exit 1; }

echo "== pip install . (CUDA backend, sm_90a, $jobs jobs)"
start=$SECONDS
rm -rf "$site"
PYTHONPATH=$tools CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$py" -m pip install -v --disable-pip-version-check \
  --no-build-isolation --no-deps --no-index --target "$site" \
  --config-settings=cmake.define.DSMLA_ENABLE_CUDA=ON --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  --config-settings="build-dir=$work/build" . >>"$out/python-build.log" 2>&1
rc=$?
echo "build: rc $rc, $((SECONDS - start)) s"; tail -5 "$out/python-build.log"
[ $rc = 0 ] || { grep -nE "error|Error" "$out/python-build.log" | head -30; echo "BUILD FAILED"; exit 1; }

echo "== tests"
export PYTHONPATH=$site:$tools DSMLA_REPORT_DIR=$out
: >"$out/python-tests.log"
summary=() status=0
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/python/gpu/test_torch_cuda.py tests/python/gpu/test_torch_cpu.py
                                 tests/python/gpu/test_transformers.py tests/python/cpu)
for f in "${files[@]}"; do
  start=$SECONDS
  echo "==== $f" >>"$out/python-tests.log"
  # -s: the transformers tests print their errors and times; -rA: a line per test.
  timeout "${DSMLA_TEST_TIMEOUT:-300}" "$py" -m pytest "$f" -q -rA -s -p no:cacheprovider >>"$out/python-tests.log" 2>&1
  rc=$?
  line=$(tail -1 "$out/python-tests.log")
  summary+=("$(printf '%-42s rc %3d %4ds  %s' "$f" "$rc" $((SECONDS - start)) "$line")")
  [ $rc = 0 ] || [ $rc = 5 ] || status=1  # 5: nothing collected
  # A crash (SIGSEGV 139, SIGABRT 134): the native backtrace, from cuda-gdb
  # (the machine has no gdb; cuda-gdb debugs host code too), stopping at the first failure.
  if { [ $rc = 139 ] || [ $rc = 134 ]; } && command -v cuda-gdb >/dev/null; then
    echo "==== $f under cuda-gdb (rc $rc)" >>"$out/python-tests.log"
    timeout 240 cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args "$py" -m pytest "$f" -x -q -p no:cacheprovider \
      >>"$out/python-tests.log" 2>&1
  fi
done
grep -E "^(FAILED|ERROR)|rel-L2|top-k holds|prefill of" "$out/python-tests.log" | head -80
echo "== summary"
printf '%s\n' "${summary[@]}"
[ $status = 0 ] && echo "== all Python GPU tests passed" || echo "== SOME PYTHON TESTS FAILED (see $out/python-tests.log)"
exit $status
