#!/usr/bin/env bash
# `make test`: both legs at once, the Launchpad stack's (the whole suite on .venv) and the
# current stack's (PY312_TESTS on .venv312).
#
#   PY=.venv/bin/python PY312=.venv312/bin/python PY312_TESTS="tests/..." \
#       PYTEST_ARGS="..." bash scripts/test_both_stacks.sh
#
# Much of each leg waits (a program starting up, a stop's notice, a SLURM job queued, Ray
# coming up), so the two side by side take less time than one after the other. The tests
# already pass beside other CPU-bound work: each finds its own processes by a marker and
# starts its own servers, clusters and temp folders.
#
# The Launchpad leg prints as it goes; the current leg writes to a temp file that is printed
# once it has ended (and then removed). The exit code is 0 only when both legs passed.
# Ctrl-C or SIGTERM reaches both legs' pytest as Ctrl-C, so each tears its tests down.
set -uo pipefail
: "${PY:?}" "${PY312:?}" "${PY312_TESTS:?}"
PYTEST_ARGS=${PYTEST_ARGS:-}

log=$(mktemp "${TMPDIR:-/tmp}/magi_lp-test-current.XXXXXX")
current=""
stop() {
    [ -n "$current" ] && kill -INT -- "-$current" 2>/dev/null
}
trap 'rm -f "$log"' EXIT
trap 'stop' INT TERM

# Job control: the current leg runs in a process group of its own with SIGINT as it is (a
# background job without it would ignore SIGINT, and its pytest could not be stopped
# cleanly); the trap above forwards Ctrl-C to that group.
set -m
# shellcheck disable=SC2086  # the test lists and pytest arguments are word lists
"$PY312" -m pytest $PY312_TESTS $PYTEST_ARGS >"$log" 2>&1 &
current=$!
set +m
echo "make test: the current-stack leg runs at the same time; its output follows this leg's"

# shellcheck disable=SC2086
"$PY" -m pytest $PYTEST_ARGS
launchpad_code=$?

wait "$current"
current_code=$?
current=""
echo
echo "================ the current-stack leg ($PY312) ================"
cat "$log"
echo
echo "make test: Launchpad stack leg exit code $launchpad_code, current stack leg exit code $current_code"
[ "$launchpad_code" -eq 0 ] && [ "$current_code" -eq 0 ]
