#!/usr/bin/env bash
# Builds or updates the current-stack virtualenv (Python 3.12; docs/setup.md):
# requirements-py312.txt, then requirements-py312-nodeps.txt without dependencies (dm-acme:
# its requirements pin dm-launchpad, which has no 3.12 wheel). No Launchpad, Reverb or
# TensorFlow: the agents, the placement layer and the one-process runner run here. The repo
# is put on the venv's path (a .pth file): setup.py is the Launchpad stack's package.
#
#   scripts/setup_venv312.sh [VENV]      (default .venv312)
#
# Cheap when nothing changed: a hash of the lock files and this script is kept in the venv,
# and pip runs only when it differs. JAX is the CPU build of jax 0.11.2; on the GPU machine
# the image's own CUDA JAX (the same version) serves instead.
set -euo pipefail
venv=${1:-.venv312}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
stamp="$venv/.magi_lp_setup"

python="$venv/bin/python"
if [ ! -x "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    py=$("$here/find_python.sh" 3.12)
    echo "magi_lp setup: creating $venv with $py"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    rm -f "$stamp"
fi

inputs=$(cd "$root" && cat requirements-py312.txt requirements-py312-nodeps.txt \
    scripts/setup_venv312.sh scripts/find_python.sh scripts/write_home_pth.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "inputs=$inputs" ]; then
    echo "magi_lp setup: $venv is up to date (Python 3.12, current stack)"
    exit 0
fi

echo "magi_lp setup: installing the current stack into $venv"
cd "$root"
"$python" -m pip install --quiet --upgrade pip
"$python" -m pip install --quiet -r requirements-py312.txt
"$python" -m pip install --quiet --no-deps -r requirements-py312-nodeps.txt
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root" >"$site/magi_lp_repo.pth"
bash "$here/write_home_pth.sh" "$venv"  # caches in the venv, not the home folder
echo "inputs=$inputs" >"$stamp"
echo "magi_lp setup: $venv ready"
