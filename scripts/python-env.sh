#!/usr/bin/env bash
# Creates a venv with the pinned Python tools of python/requirements.txt
# (scikit-build-core, nanobind, NumPy, pytest) from PyPI.  Usage:
#   scripts/python-env.sh [VENV_DIR]     (default build/venv)
# Safe to run repeatedly: nothing is installed while the venv matches the pins.
# Needs python3 >= 3.9 (DSMLA_PYTHON names another interpreter); where Debian
# left out venv / ensurepip, installs python3.X-venv for that interpreter.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/venv}
py=${DSMLA_PYTHON:-python3}
req=$root/python/requirements.txt

"$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
  || { echo "python-env: $py is older than 3.9" >&2; exit 1; }
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.dsmla-requirements" 2>/dev/null)" = "$want" ]; then
  echo "python-env: $venv matches python/requirements.txt"
  exit 0
fi

if ! "$py" -m venv --clear "$venv" >/dev/null 2>&1; then
  # Debian ships venv's ensurepip separately; the package must match the
  # interpreter's own Debian version, so it is not pinned here.
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "python-env: '$py -m venv' failed; install python$ver-venv" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "python-env: installing python$ver-venv"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "python$ver-venv"
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
echo "$want" > "$venv/.dsmla-requirements"
echo "python-env: $venv ready ($("$venv/bin/python" --version))"
