#!/usr/bin/env bash
# Downloads the pinned pure-Python wheels that scripts/gpu-python.sh installs
# on the GPU machine (no network there) into .whl/ (git-ignored), to be sent
# along with `carry: [".whl", ".deps"]` (.deps: scripts/pack-device-deps.sh).
# The versions are python/requirements.txt's; every wheel is py3-none-any.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pin() { grep -E "^$1==" "$root/python/requirements.txt" | head -1 | cut -d';' -f1 | tr -d ' '; }
rm -rf "$root/.whl"; mkdir -p "$root/.whl"
# Build tools (scikit-build-core and its dependencies), then pytest and its
# (installed there only where the machine lacks pytest).
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --abi none --platform any -d "$root/.whl" \
  "$(pin scikit-build-core)" "$(pin nanobind)" "$(pin pathspec)" "$(pin packaging)" \
  "$(pin pytest)" "$(pin iniconfig)" "$(pin pluggy)" "$(pin pygments)"
ls -l "$root/.whl"
du -sh "$root/.whl"
