#!/usr/bin/env bash
# Downloads the wheels `make gpu-check` needs on a GPU machine that has a Python 3.12 with its
# own CUDA JAX (and numpy, optax, absl-py, tabulate, nvidia-ml-py) but no network and none of
# the project's venv: ml_collections (+PyYAML) for the configs, dm-haiku (+jmp) for the DrQ-v2
# networks, mujoco-core (+PyOpenGL) for the EGL rendering figure. About 14 MB, cp312 / py3
# wheels for Linux x86_64, into a git-excluded folder (default .whl/) that travels with the
# working tree. On the GPU machine (benchmarks/README.md):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site make gpu-check GPU_CHECK_PYTHON=python3
# Versions: the ones checked on Python 3.12 / jax 0.11 (dm-haiku 0.0.17 is the first that
# imports on jax >= 0.5; the venv keeps 0.0.12 for jax 0.4.30).
set -euo pipefail
dest=${1:-.whl}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
mkdir -p "$dest"
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
    --dest "$dest" \
    ml_collections==1.1.0 PyYAML==6.0.3 dm-haiku==0.0.17 jmp==0.0.4 \
    mujoco-core==4.0.0 PyOpenGL==3.1.10
ls -1 "$dest"
du -sh "$dest"
