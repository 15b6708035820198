#!/usr/bin/env bash
# `make gpu-learn` on a device machine (benchmarks/README.md, "The learning run"): one call of
# the `run` tool, with the wheels folder (and .gl, the EGL loader's packages) carried:
#   bash benchmarks/gpu_learn_device.sh [WHEELS] [ARGS...]   (default .whl-learn; MINUTES=7)
# ARGS go to benchmarks.gpu_learn (e.g. --seeds "" --official-seeds 1,2,3). The runs live in
# /tmp/gl, which a warm machine keeps: a second call continues them where the first stopped.
# Unpacks .gl where it was carried (without EGL's loader PyOpenGL finds no EGL), installs the
# wheels into /tmp/site, and where WHEELS/official/ is there (DRQV2=... make gpu-learn-wheels)
# the official agent's own into /tmp/site-official, first on its path alone (its numpy 1.26),
# through .venv-official/bin/python. Writes to $OUT: gpu_learn.json, curves.csv, curves.png,
# gpu_learn.log and gpu_learn_runs.tgz (the runs' logs; no checkpoints). The commit comes from
# .commit (`git rev-parse --short HEAD > .commit` here first), the copied tree having no .git.
set -o pipefail
export PYTHONUNBUFFERED=1
wheels=${1:-.whl-learn}
shift $(($# > 0 ? 1 : 0))
minutes=${MINUTES:-7}
out=${OUT:?run this through the device tool, which sets OUT}
if [ -d .gl ]; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
# A second call on the same warm machine finds them installed (pip would only warn, once a
# package, that each target folder is there already).
if [ ! -f /tmp/site/.installed ]; then
    install --target /tmp/site "$wheels"/*.whl && touch /tmp/site/.installed || exit 3
fi
export PYTHONPATH=/tmp/site
# What the venvs' magi_lp_home.pth does (scripts/write_home_pth.sh), for this venv-less Python:
# on the H200 the runs left ~/.nv/ComputeCache, ~/.cache/nvidia/GLCache and matplotlib's folders.
export MPLCONFIGDIR=${MPLCONFIGDIR:-/tmp/gl-cache/matplotlib}
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/gl-cache/nvidia/ComputeCache}
export __GL_SHADER_DISK_CACHE_PATH=${__GL_SHADER_DISK_CACHE_PATH:-/tmp/gl-cache/nvidia/GLCache}
official=()
if [ -d "$wheels/official/drqv2" ]; then
    if [ ! -f /tmp/site-official/.installed ]; then
        install --target /tmp/site-official "$wheels"/official/*.whl &&
            touch /tmp/site-official/.installed || exit 3
    fi
    bash benchmarks/official_python.sh .venv-official /tmp/site-official:/tmp/site || exit 3
    official=(--official "$wheels/official/drqv2")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)"
timeout $((${minutes%.*} * 60 + 60)) python3 -m benchmarks.gpu_learn --minutes "$minutes" \
    --commit "$(cat .commit 2>/dev/null)" --out /tmp/gl "${official[@]}" "$@" 2>&1 |
    tee "$out/gpu_learn.log"
rc=$?
cp /tmp/gl/gpu_learn.json /tmp/gl/curves.csv /tmp/gl/curves.png "$out"/ 2>/dev/null
tar -czf "$out/gpu_learn_runs.tgz" -C /tmp/gl --exclude=checkpoints --exclude='*.pt' \
    --exclude=code --exclude=buffer .
ls -l "$out"
exit $rc
