#!/usr/bin/env bash
# Installs the pinned build and test dependencies from Debian (bookworm).
# Safe to run repeatedly: it only installs what is missing or at another version.
# --fuzz: also clang and its runtime libraries (libFuzzer, sanitizers) for scripts/fuzz.sh.
set -euo pipefail

# package=version pairs, pinned to Debian bookworm.
PACKAGES=(
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  g++=4:12.2.0-3
  googletest=1.12.1-0.2
  libgtest-dev=1.12.1-0.2
  nlohmann-json3-dev=3.11.2-2
)

# scripts/fuzz.sh: clang 14 and libclang-rt (libFuzzer, ASan, UBSan runtimes).
FUZZ_PACKAGES=(
  clang-14=1:14.0.6-12
  libclang-rt-14-dev=1:14.0.6-12
)
for a in "$@"; do
  case $a in
    --fuzz) PACKAGES+=("${FUZZ_PACKAGES[@]}") ;;
    *) echo "usage: scripts/install-deps.sh [--fuzz]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  name=${p%%=*}; want=${p#*=}
  have=$(dpkg-query -W -f='${Version}' "$name" 2>/dev/null || true)
  [ "$have" = "$want" ] || missing+=("$p")
done
cutlass() {  # CUTLASS/CuTe headers for the CUDA kernels (only where nvcc can build them)
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then "$(dirname "$0")/install-cutlass.sh"; fi
}
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all pinned packages present"; cutlass; exit 0; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends --allow-downgrades "${missing[@]}"
cutlass
