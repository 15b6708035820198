#!/usr/bin/env bash
# Builds or updates the project virtualenv: requirements.txt, then the JAX build this machine
# can use (cpu, or cuda12 = requirements-cuda12.txt on top; scripts/choose_jax_build.py says
# which and why, in one line).
#
#   scripts/setup_venv.sh [VENV] [JAX]      JAX: auto | cpu | cuda12, or empty for the request
#                                           recorded in the venv (auto the first time)
#
# Cheap when nothing changed (`make run` and `make test` call it every time): it re-runs the
# choice, compares it and a hash of the lock files and set-up scripts with the stamp in the
# venv, and installs only when they differ. A forced JAX=cpu / JAX=cuda12 is recorded and kept
# until `make setup JAX=auto`.
# MAGI_LP_SETUP_DRY_RUN=1 prints the venv and pip commands instead of running them (tests).
set -euo pipefail
venv=${1:-.venv}
request=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
stamp="$venv/.magi_lp_setup"
dry=${MAGI_LP_SETUP_DRY_RUN:-}

run() {
    if [ -n "$dry" ]; then echo "+ $*"; else "$@"; fi
}

# 1. A Python 3.10 virtualenv (dm-launchpad has wheels only up to 3.10).
python="$venv/bin/python"
if [ ! -x "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
    py=$("$here/find_python.sh" 3.10)
    echo "magi_lp setup: creating $venv with $py"
    run rm -rf "$venv"
    run "$py" -m venv "$venv"
    rm -f "$stamp"
    if [ -n "$dry" ]; then mkdir -p "$venv"; python=$py; fi
fi

# 2. The JAX build: what was asked (JAX=..., else the recorded request, else auto) and what
#    the machine's NVIDIA driver allows. Its reason line goes to stderr, i.e. to the user.
#    NVML is asked through the venv's nvidia-ml-py (pinned in requirements.txt): a fresh venv
#    gets that small package first, so the check does not rest on nvidia-smi being on PATH.
if [ -z "$dry" ] && ! "$python" -c 'import pynvml' 2>/dev/null; then
    run "$python" -m pip install --quiet "$(grep -E '^nvidia-ml-py==' "$root/requirements.txt")"
fi
recorded=$(sed -n 's/^request=//p' "$stamp" 2>/dev/null || true)
request=${request:-${recorded:-auto}}
choice=$("$python" "$here/choose_jax_build.py" "$request")

# 3. Install only when the choice or an input of the set-up changed.
inputs=$(cd "$root" && cat requirements.txt requirements-cuda12.txt setup.py \
    scripts/setup_venv.sh scripts/choose_jax_build.py scripts/find_python.sh \
    scripts/write_home_pth.sh |
    sha256sum | cut -d' ' -f1)
wanted=$(printf 'choice=%s\ninputs=%s' "$choice" "$inputs")
if [ -f "$stamp" ] && [ "$(grep -v '^request=' "$stamp")" = "$wanted" ]; then
    printf 'request=%s\n%s\n' "$request" "$wanted" >"$stamp"
    echo "magi_lp setup: $venv is up to date (JAX build $choice)"
    exit 0
fi

echo "magi_lp setup: installing into $venv (JAX build $choice)"
cd "$root"
run "$python" -m pip install --quiet --upgrade pip
if [ "$choice" = cuda12 ]; then
    # One resolution of both files, so pip sees the pins of each at once.
    run "$python" -m pip install --quiet -r requirements.txt -r requirements-cuda12.txt
else
    run "$python" -m pip install --quiet -r requirements.txt
    # A CUDA plugin left from an earlier cuda12 choice would still be loaded by JAX.
    leftovers=$("$python" "$here/choose_jax_build.py" --installed requirements-cuda12.txt)
    if [ -n "$leftovers" ]; then
        # shellcheck disable=SC2086  # one word per package
        run "$python" -m pip uninstall --quiet --yes $leftovers
    fi
fi
run "$python" -m pip install --quiet --no-deps --no-build-isolation -e .
# MuJoCo renders headless through EGL; Mesa's software EGL works without a GPU.
if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
    echo "warning: libEGL not found; pixel environments need it (Debian: apt-get install libegl1 libegl-mesa0)." >&2
fi
# Caches that TensorFlow's Keras, matplotlib and Mesa would make in the home folder go inside
# the venv instead (scripts/write_home_pth.sh says which and why).
[ -n "$dry" ] || bash "$here/write_home_pth.sh" "$venv"
printf 'request=%s\n%s\n' "$request" "$wanted" >"$stamp"
if [ "$choice" = cuda12 ]; then
    echo "magi_lp setup: done; \`make gpu-check\` measures the GPU with this build"
else
    echo "magi_lp setup: done"
fi
