#!/usr/bin/env bash
# Downloads the wheels `make gpu-learn` (single-process DrQ-v2 on dm_control pixels) needs on a
# GPU machine whose Python 3.12 has its own CUDA JAX, optax, orbax, chex, lxml, scipy, PyYAML
# and absl-py (KINDS.md's package list) but no network: ml_collections, dm-haiku (+jmp),
# mujoco, PyOpenGL, glfw, dm_control, dm-env, dm-tree, labmaze and dm-acme, at the versions of
# requirements-py312.txt / requirements-py312-nodeps.txt (the current stack this repo tests).
# dm_control goes without the assets the suite's DrQ-v2 tasks never load (locomotion walkers,
# soccer, the dog, MuJoCo's test models: 56 MB -> about 9 MB) and dm-acme (an sdist that says
# Python <= 3.10) as a wheel built here without that bound (scripts/repack_wheel.py), so the
# set fits a device call's 64 MiB. Into a git-excluded folder (default .whl-learn/; not .whl/,
# whose mujoco-core 4.0.0 for `make gpu-check` would clash with mujoco 3.17.0). On the GPU
# machine:
#   bash benchmarks/gpu_learn_device.sh .whl-learn   (benchmarks/README.md, "The learning run")
# Also writes .commit (git-ignored): HEAD's short hash, with -dirty where the tree differs.
# With DRQV2=<checkout of facebookresearch/drqv2>, also the official agent's seed: its files
# (checked against official.py's pinned hashes) and its own wheels at the learn check's pins
# (benchmarks/learn_check/requirements-official.txt: numpy 1.26.4, hydra-core, omegaconf,
# antlr4, termcolor), into <dest>/official/. Its numpy is its own: under the GPU machine's
# numpy 2, dm_control's action_scale wrapper makes the action spec float64 and the official
# replay storage's dtype assertion fails at the first transition (seen on the H200).
set -euo pipefail
dest=${1:-.whl-learn}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
pins() {  # the exact pins of these names in the current stack's lock
    for name in "$@"; do
        grep -i -E "^${name}==" "$root/requirements-py312.txt" "$root/requirements-py312-nodeps.txt" |
            cut -d: -f2
    done
}
rm -rf "$dest"
mkdir -p "$dest"
# shellcheck disable=SC2046  # one word per pin
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --dest "$dest" \
    $(pins ml_collections dm-haiku jmp mujoco PyOpenGL glfw dm_control dm-env dm-tree labmaze)
"$py" -m pip wheel --quiet --no-deps --wheel-dir "$dest" "$(pins dm-acme)"
"$py" "$here/repack_wheel.py" "$dest"/dm_acme-*.whl --any-python
"$py" "$here/repack_wheel.py" "$dest"/dm_control-*.whl \
    --drop dm_control/locomotion/walkers/assets/ --drop dm_control/locomotion/soccer/assets/ \
    --drop dm_control/suite/dog_assets/ --drop dm_control/mujoco/testing/assets/
if [ -n "${DRQV2:-}" ]; then
    official_pins() {
        for name in "$@"; do
            grep -i -E "^${name}==" "$root/benchmarks/learn_check/requirements-official.txt"
        done
    }
    mkdir -p "$dest/official"
    # shellcheck disable=SC2046  # one word per pin
    "$py" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --dest "$dest/official" $(official_pins numpy hydra-core omegaconf termcolor)
    "$py" -m pip wheel --quiet --no-deps --wheel-dir "$dest/official" \
        "$(official_pins antlr4-python3-runtime)"
    (cd "$root" && "$py" -c "import sys; from pathlib import Path
from benchmarks.learn_check import official
official.copy_files(Path(sys.argv[1]), Path(sys.argv[2]))" "$DRQV2" "$dest/official/drqv2")
fi
ls -1 "$dest" "$dest"/official 2>/dev/null || true
du -sh "$dest"
# The commit the device call runs, for its results (the copied tree has no .git): "-dirty" where
# the tree differs from it (untracked files that travel included).
dirty=$(git -C "$root" status --porcelain)
echo "$(git -C "$root" rev-parse --short HEAD)${dirty:+-dirty}" >"$root/.commit"
echo "gpu-learn-wheels: .commit: $(cat "$root/.commit")"
