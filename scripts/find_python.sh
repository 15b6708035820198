#!/usr/bin/env bash
# Prints the path of a working Python 3.10 interpreter, or explains what to install.
# dm-launchpad publishes wheels only up to CPython 3.10, so nothing newer will do.
# Order: $PYTHON, a python3.10 that actually runs (pyenv's shim refuses unless
# PYENV_VERSION is set), pyenv's versions folder, `uv python find 3.10`.
set -u

is_310() {
    [ -n "$1" ] && "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 10) else 1)' >/dev/null 2>&1
}

if [ -n "${PYTHON:-}" ]; then
    if is_310 "$PYTHON"; then echo "$PYTHON"; exit 0; fi
    echo "error: PYTHON=$PYTHON is not a working Python 3.10 interpreter." >&2
    echo "fix: point PYTHON at a python3.10 binary, or unset it to search automatically." >&2
    exit 1
fi

candidates=()
command -v python3.10 >/dev/null 2>&1 && candidates+=("$(command -v python3.10)")
if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root 2>/dev/null)
    for p in "$root"/versions/3.10*/bin/python3.10; do candidates+=("$p"); done
fi
for p in "$HOME"/.pyenv/versions/3.10*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
    candidates+=("$p")
done
if command -v uv >/dev/null 2>&1; then
    candidates+=("$(uv python find 3.10 2>/dev/null)")
fi

for c in "${candidates[@]}"; do
    if is_310 "$c"; then echo "$c"; exit 0; fi
done

cat >&2 <<'MSG'
error: no Python 3.10 interpreter found (dm-launchpad has wheels only up to Python 3.10).
fix: install one, e.g. `pyenv install 3.10`, `uv python install 3.10` or `apt-get install python3.10`,
     or point at an existing one with `make test PYTHON=/path/to/python3.10`.
MSG
exit 1
