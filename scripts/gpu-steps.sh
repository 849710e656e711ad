# Steps shared by scripts/gpu-trees.sh, gpu-prebuilt.sh, gpu-switches.sh,
# gpu-metrics.sh and gpu-bench.sh (sourced, not run). The caller defines OUT, log (the summary
# file), status (set to 1 on a failure) and say (echo into the terminal and
# the log).

# has_shim DIR: DIR holds a prebuilt kernel shim (scripts/stage-prebuilt.sh),
# or a message. Where DIR.tar.xz exists, DIR is unpacked from it afresh: a
# warm device machine keeps the DIR an earlier call unpacked, which a tree
# restaged under the same name must replace.
has_shim() {
  if [ -f "$1.tar.xz" ]; then
    rm -rf "$1"
    tar -C "$(dirname "$1")" -xJf "$1.tar.xz" || { echo "cannot unpack $1.tar.xz" >&2; return 1; }
  fi
  [ -f "$1/libdsmla_kernel_shim.so" ] || { echo "no $1/libdsmla_kernel_shim.so" >&2; return 1; }
}

# anchor_packages: installs the anchor wheels (.anchors/*.whl, carried) into
# a fresh directory and prints it (for PYTHONPATH); when they do not install,
# pip's output goes to stderr and it fails.
anchor_packages() {
  local dir pip_out
  dir=$(mktemp -d) || return 1
  pip_out=$(python3 -m pip install -q --no-index --no-deps --target "$dir" .anchors/*.whl 2>&1) ||
    { echo "$pip_out" >&2; return 1; }
  echo "$dir"
}

# tree_args USAGE CHECK ARGS...: [--sanitize] DIR=LABEL... [-- PAIRED_ARGS...]
# into $sanitize, trees[] and paired[]. CHECK DIR (a command) fails with a
# message when DIR is no usable tree; then, or without a tree, the caller exits 2.
tree_args() {
  local usage=$1 check=$2; shift 2
  sanitize=0; trees=(); paired=()
  while [ $# -gt 0 ]; do
    case $1 in
      --sanitize) sanitize=1; shift ;;
      --) shift; paired=("$@"); break ;;
      *=*) "$check" "${1%%=*}" || exit 2; trees+=("$1"); shift ;;
      *) echo "usage: $usage" >&2; exit 2 ;;
    esac
  done
  [ ${#trees[@]} -ge 1 ] || { echo "usage: $usage" >&2; exit 2; }
}

# gpu_tests BUILD_DIR LABEL [NAME=VALUE...]: the GPU tests matching FILTER
# (default *Sparse*) with the settings exported, their summary into the log.
gpu_tests() {
  local build=$1 label=$2; shift 2
  env "$@" timeout "${TEST_TIMEOUT:-300}" "$build/tests/test_gpu_cuda" --gtest_filter="${FILTER:-*Sparse*}" \
    --gtest_brief=1 >"$OUT/t.log" 2>&1 ||
    { status=1; say "TESTS FAILED: $label"; grep -E "FAILED|Failure" "$OUT/t.log" | head -20 >>"$log"; }
  grep -E "tests ran|PASSED" "$OUT/t.log" | tail -2 | tee -a "$log"; rm -f "$OUT/t.log"
}

# gpu_sanitize BUILD_DIR LABEL [NAME=VALUE...]: scripts/gpu-sanitize.sh's
# groups SANITIZE_GROUPS (default sparse) with the settings exported.
gpu_sanitize() {
  local build=$1 label=$2; shift 2
  say "== sanitizer: $label $(date -u +%H:%M:%S)"
  env "$@" SANITIZE_GROUPS="${SANITIZE_GROUPS:-sparse}" scripts/gpu-sanitize.sh "$build" >"$OUT/s.log" 2>&1 ||
    { status=1; say "SANITIZER FAILED: $label"; grep -E "ERROR|FAILED|Invalid|Race" "$OUT/s.log" | head -20 >>"$log"; }
  grep -E "^== |ERROR SUMMARY|tests ran|PASSED" "$OUT/s.log" | tail -40 >>"$log"; rm -f "$OUT/s.log"
}

# gpu_spills BUILD_LOG: ptxas's non-zero spill lines of a build, into the log.
gpu_spills() {
  grep -E "spill" "$1" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head -10 >>"$log"
}
