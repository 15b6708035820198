#!/usr/bin/env bash
# Builds or updates the official PyTorch DrQ-v2's virtualenv (Python 3.11, CPU torch) from
# benchmarks/learn_check/requirements-official.txt, for benchmarks/learn_check/official.py.
#
#   scripts/setup_official_venv.sh [VENV]      (default .venv-official)
#
# Cheap when nothing changed: a hash of the lock and this script is kept in the venv, and pip
# runs only when it differs. Python 3.11: $PYTHON311, else python3.11 on PATH, pyenv's
# versions, `uv python find 3.11` (scripts/find_python.sh knows only 3.10 and 3.12).
set -euo pipefail
venv=${1:-.venv-official}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
lock="$root/benchmarks/learn_check/requirements-official.txt"
stamp="$venv/.magi_lp_setup"

is_311() {
    [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1
}

find_python311() {
    if [ -n "${PYTHON311:-}" ]; then
        if is_311 "$PYTHON311"; then echo "$PYTHON311"; return 0; fi
        echo "error: PYTHON311=$PYTHON311 is not a working Python 3.11 interpreter." >&2
        return 1
    fi
    local candidates=() c
    command -v python3.11 >/dev/null 2>&1 && candidates+=("$(command -v python3.11)")
    if command -v pyenv >/dev/null 2>&1; then
        for c in "$(pyenv root 2>/dev/null)"/versions/3.11*/bin/python3.11; do candidates+=("$c"); done
    fi
    for c in "$HOME"/.pyenv/versions/3.11*/bin/python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11; do
        candidates+=("$c")
    done
    command -v uv >/dev/null 2>&1 && candidates+=("$(uv python find 3.11 2>/dev/null)")
    for c in "${candidates[@]}"; do
        if is_311 "$c"; then echo "$c"; return 0; fi
    done
    echo "error: no Python 3.11 interpreter found (the official DrQ-v2's lock is for 3.11)." >&2
    echo "fix: \`pyenv install 3.11\` or \`uv python install 3.11\`, or set PYTHON311=/path/to/python3.11" >&2
    return 1
}

python="$venv/bin/python"
if ! is_311 "$python"; then
    py=$(find_python311)
    echo "magi_lp setup: creating $venv with $py"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    rm -f "$stamp"
fi

inputs=$(cat "$lock" "$here/setup_official_venv.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "inputs=$inputs" ]; then
    echo "magi_lp setup: $venv is up to date (Python 3.11, official DrQ-v2)"
    exit 0
fi

echo "magi_lp setup: installing the official DrQ-v2's lock into $venv"
"$python" -m pip install --quiet -r "$lock"
echo "inputs=$inputs" >"$stamp"
echo "magi_lp setup: $venv ready"
