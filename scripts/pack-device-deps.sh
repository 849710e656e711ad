#!/usr/bin/env bash
# Copies the build dependencies the GPU machine lacks (it has no network) into
# .deps/ (git-ignored), to be sent along with `carry: [".deps"]`:
# GoogleTest sources and the nlohmann-json headers, from the pinned Debian packages,
# and the pinned CUTLASS/CuTe headers (scripts/install-cutlass.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
rm -rf "$root/.deps/googletest" "$root/.deps/include"; mkdir -p "$root/.deps/include"
cp -r /usr/src/googletest "$root/.deps/googletest"
cp -r /usr/include/nlohmann "$root/.deps/include/nlohmann"
"$root/scripts/install-cutlass.sh"
du -sh "$root/.deps"
