#!/usr/bin/env bash
# The main job of the README: builds dsmla and runs `dsmla demo`, on the GPU
# when one is visible and on the CPU backend otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/build.sh build >/dev/null
exec build/dsmla demo "$@"
