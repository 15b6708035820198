#!/usr/bin/env bash
# The official agent's python on a device machine: VENV/bin/python, a wrapper that runs this
# machine's python3 with PATHS first on its path (the official wheels, then gpu-learn's).
#   bash benchmarks/official_python.sh VENV PATHS
# Where VENV is a real venv (a development machine's .venv-official, with pyvenv.cfg), it is
# left as it is: its bin/python is a link to an interpreter, and gpu_learn_device.sh, writing
# the wrapper through that link, replaced pyenv's python3.11 with it (2026-11-27). An earlier
# call's wrapper is removed first, never written through.
set -euo pipefail
venv=${1:?VENV} paths=${2:?PATHS}
if [ -f "$venv/pyvenv.cfg" ]; then
    echo "official_python: $venv is a venv here; not replaced"
    exit 0
fi
mkdir -p "$venv/bin"
rm -f "$venv/bin/python"
printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$paths" "$(command -v python3)" >"$venv/bin/python"
chmod +x "$venv/bin/python"
