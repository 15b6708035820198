#!/usr/bin/env bash
# Prints the path of a working Python <version> interpreter, or explains what to install.
#   scripts/find_python.sh 3.10   the Launchpad stack: dm-launchpad has wheels only up to 3.10
#   scripts/find_python.sh 3.12   the current stack (requirements-py312.txt)
# Order: $PYTHON (3.10) or $PYTHON312 (3.12), a python3.X that actually runs (pyenv's shim
# refuses unless PYENV_VERSION is set), pyenv's versions folder, `uv python find 3.X`.
set -u
version=${1:?usage: find_python.sh 3.10|3.12}
case "$version" in
    3.10) var=PYTHON; why="dm-launchpad has wheels only up to Python 3.10" ;;
    3.12) var=PYTHON312; why="the current stack's lock, requirements-py312.txt, is for Python 3.12" ;;
    *) echo "error: find_python.sh knows 3.10 and 3.12, not $version" >&2; exit 2 ;;
esac
minor=${version#3.}

is_version() {
    [ -n "$1" ] && "$1" -c "import sys; sys.exit(0 if sys.version_info[:2] == (3, $minor) else 1)" >/dev/null 2>&1
}

override=${!var:-}
if [ -n "$override" ]; then
    if is_version "$override"; then echo "$override"; exit 0; fi
    echo "error: $var=$override is not a working Python $version interpreter." >&2
    echo "fix: point $var at a python$version binary, or unset it to search automatically." >&2
    exit 1
fi

candidates=()
command -v "python$version" >/dev/null 2>&1 && candidates+=("$(command -v "python$version")")
if command -v pyenv >/dev/null 2>&1; then
    root=$(pyenv root 2>/dev/null)
    for p in "$root"/versions/"$version"*/bin/"python$version"; do candidates+=("$p"); done
fi
for p in "$HOME"/.pyenv/versions/"$version"*/bin/"python$version" "/usr/bin/python$version" "/usr/local/bin/python$version"; do
    candidates+=("$p")
done
if command -v uv >/dev/null 2>&1; then
    candidates+=("$(uv python find "$version" 2>/dev/null)")
fi

for c in "${candidates[@]}"; do
    if is_version "$c"; then echo "$c"; exit 0; fi
done

cat >&2 <<MSG
error: no Python $version interpreter found ($why).
fix: install one, e.g. \`pyenv install $version\`, \`uv python install $version\` or \`apt-get install python$version\`,
     or point at an existing one with \`make test $var=/path/to/python$version\`.
MSG
exit 1
