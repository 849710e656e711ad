#!/usr/bin/env bash
# Puts the CUTLASS/CuTe headers the CUDA kernels use (header only, pinned) into
# .deps/cutlass/include, from the PyPI wheel nvidia-cutlass (checked by sha256).
# Safe to run repeatedly. The GPU machine has no network: this folder travels
# there inside .deps (see scripts/pack-device-deps.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dest=$root/.deps/cutlass
stamp=$dest/VERSION
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -f "$dest/include/cute/tensor.hpp" ]; then
  echo "install-cutlass: CUTLASS $version headers present"; exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1 || ! command -v unzip >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends python3-pip=23.0.1+dfsg-1 unzip=6.0-28
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$version" -d "$tmp"
wheel=$(ls "$tmp"/nvidia_cutlass-"$version"-*.whl)
echo "$sha256  $wheel" | sha256sum -c --quiet - || { echo "install-cutlass: checksum mismatch for $wheel" >&2; exit 1; }
unzip -q "$wheel" 'cutlass_library/source/include/*' -d "$tmp/x"
rm -rf "$dest"; mkdir -p "$dest"
mv "$tmp/x/cutlass_library/source/include" "$dest/include"
echo "$version" >"$stamp"
echo "install-cutlass: CUTLASS $version headers in $dest/include"
