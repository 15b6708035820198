#!/usr/bin/env bash
# Downloads the wheels `make gpu-system` (the distributed DrQ-v2 on Ray, benchmarks/gpu_system.py)
# needs on a GPU machine whose Python 3.12 has its own CUDA JAX but no network, into one
# git-ignored folder (default .whl-system/) that fits a device call's 64 MiB with the repo:
# - what `make gpu-learn-wheels` carries (scripts/gpu_learn_wheels.sh: dm_control without its
#   unused assets, mujoco, Haiku, dm-acme, ...), with two more cuts: mujoco without
#   `mujoco/experimental/` (the studio viewer: 15 of its 26 MB, never imported by
#   `import mujoco`) and its Filament renderer, and no labmaze (only dm_control.locomotion
#   imports it; the suite tasks do not);
# - ray 2.60.0 (the current stack's pin) without `ray/jars` (the Java workers: 31 of its 79 MB)
#   nor the libraries on top of Ray Core that a run never imports (rllib, tune, train, serve,
#   data, llm) nor the dashboard's web client; and its one dependency the GPU machine's image
#   lacks, jsonschema (+ jsonschema-specifications, referencing, rpds-py).
# Each repacked wheel gets a RECORD that matches what it holds (scripts/repack_wheel.py), so pip
# installs it. Prints each wheel's size, the folder's, the repository's part of a device call and
# the sum, and fails if the sum is over 64 MiB. On the GPU machine (benchmarks/README.md):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-system/*.whl
#   PYTHONPATH=/tmp/site make gpu-system GPU_CHECK_PYTHON=python3
set -euo pipefail
dest=${1:-.whl-system}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
limit_mib=64
pins() {  # the exact pins of these names in the current stack's lock
    for name in "$@"; do
        grep -i -E "^${name}==" "$root/requirements-py312.txt" "$root/requirements-py312-nodeps.txt" |
            cut -d: -f2
    done
}
PYTHON=$py bash "$here/gpu_learn_wheels.sh" "$dest" >/dev/null
rm -f "$dest"/labmaze-*.whl
# shellcheck disable=SC2046  # one word per pin
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --dest "$dest" \
    $(pins ray jsonschema jsonschema-specifications referencing rpds-py)
"$py" "$here/repack_wheel.py" "$dest"/mujoco-*.whl \
    --drop mujoco/experimental/ --drop mujoco/_render_filament
"$py" "$here/repack_wheel.py" "$dest"/ray-*.whl \
    --drop ray/jars/ --drop ray/rllib/ --drop ray/tune/ --drop ray/train/ --drop ray/serve/ \
    --drop ray/data/ --drop ray/llm/ --drop ray/dashboard/client/build/
"$py" - "$dest" "$root" "$limit_mib" <<'EOF'
import base64, hashlib, subprocess, sys, zipfile
from pathlib import Path

dest, root, limit = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
wheels = sorted(dest.glob("*.whl"))
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:  # RECORD lists every file with its sha256
        names = {n for n in archive.namelist() if not n.endswith("/")}
        record = next(n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1)
        rows = [line.split(",") for line in archive.read(record).decode().splitlines() if line]
        listed = {row[0] for row in rows if not row[0].endswith("/")}  # folders: no matter
        assert listed == names, f"{wheel.name}: RECORD lists other files"
        for name, digest, _ in rows:
            if digest and not name.endswith("/"):
                data = hashlib.sha256(archive.read(name)).digest()
                want = "sha256=" + base64.urlsafe_b64encode(data).rstrip(b"=").decode()
                assert digest == want, f"{wheel.name}: {name} does not match its RECORD"
    print(f"{wheel.stat().st_size / 2**20:6.1f} MiB  {wheel.name}")
folder = sum(w.stat().st_size for w in wheels) / 2**20
files = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd=root, capture_output=True, check=True,
).stdout.split(b"\0")
repo = sum((root / f.decode()).stat().st_size for f in files if f and (root / f.decode()).is_file())
repo /= 2**20
total = folder + repo
print(f"{folder:6.1f} MiB  {dest}/ ({len(wheels)} wheels)")
print(f"{repo:6.1f} MiB  the working tree that travels (tracked + untracked, not ignored)")
print(f"{total:6.1f} MiB  one device call carrying {dest}/ (limit {limit:.0f} MiB)")
if total > limit:
    sys.exit(f"over the device call's {limit:.0f} MiB: {total:.1f} MiB")
EOF
