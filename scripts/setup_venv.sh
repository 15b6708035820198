#!/usr/bin/env bash
# Builds the project virtualenv from a Python 3.10 found by find_python310.sh.
set -euo pipefail
venv=${1:-.venv}
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/find_python310.sh")
echo "magi_lp setup: using $py"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r requirements.txt
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
# MuJoCo renders headless through EGL; Mesa's software EGL works without a GPU.
if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
    echo "warning: libEGL not found; pixel environments need it (Debian: apt-get install libegl1 libegl-mesa0)." >&2
fi
echo "magi_lp setup: done"
