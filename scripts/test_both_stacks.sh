#!/usr/bin/env bash
# `make test`: both stacks' suite as three legs at once:
# - the Launchpad leg: the whole suite on .venv, less the cluster tests;
# - the current leg: PY312_TESTS on .venv312, less the cluster tests;
# - the cluster leg: the multi-host tests (CLUSTER_TESTS: SLURM jobs, loopback hosts), each
#   file on its stack (.venv312 when PY312_TESTS lists it, else .venv), one after the other.
#
#   PY=.venv/bin/python PY312=.venv312/bin/python PY312_TESTS="tests/..." \
#       CLUSTER_TESTS="tests/..." PYTEST_ARGS="..." bash scripts/test_both_stacks.sh
#
# Much of each leg waits (a program starting up, a stop's notice, a SLURM job queued, Ray
# coming up). The Launchpad leg is the one that computes (about 1,250 of the suite's 1,680
# CPU-s); the cluster tests mostly wait (SLURM's two files: 380 s of wall time for 40 CPU-s),
# so on a leg of their own they take that time beside the others' rather than after them
# (two legs: 24:40 and 22:00 at 848ce03, 26:36 in all). The tests already pass beside other
# CPU-bound work: each finds its own processes by a marker and starts its own servers,
# clusters and temp folders; SLURM's two files no longer run at the same time.
#
# The Launchpad leg prints as it goes; the other two write to temp files that are printed
# once the Launchpad leg has ended (and then removed). The exit code is 0 only when every
# leg passed. Ctrl-C or SIGTERM reaches every leg's pytest as Ctrl-C, so each tears its
# tests down, and the cluster leg starts no further file.
set -uo pipefail
: "${PY:?}" "${PY312:?}" "${PY312_TESTS:?}"
PYTEST_ARGS=${PYTEST_ARGS:-}
CLUSTER_TESTS=${CLUSTER_TESTS:-}

# The lists of each leg.
current_tests=() cluster_lp=() cluster_312=() ignore_cluster=()
for test in $PY312_TESTS; do
    case " $CLUSTER_TESTS " in
    *" $test "*) ;;
    *) current_tests+=("$test") ;;
    esac
done
for test in $CLUSTER_TESTS; do
    ignore_cluster+=("--ignore=$test")
    case " $PY312_TESTS " in
    *" $test "*) cluster_312+=("$test") ;;
    *) cluster_lp+=("$test") ;;
    esac
done

current_log=$(mktemp "${TMPDIR:-/tmp}/magi_lp-test-current.XXXXXX")
cluster_log=$(mktemp "${TMPDIR:-/tmp}/magi_lp-test-cluster.XXXXXX")
current="" cluster=""
stop() {
    [ -n "$current" ] && kill -INT -- "-$current" 2>/dev/null
    [ -n "$cluster" ] && kill -INT -- "-$cluster" 2>/dev/null
}
trap 'rm -f "$current_log" "$cluster_log"' EXIT
trap 'stop' INT TERM

cluster_leg() {
    # Its files one after the other; a Ctrl-C (the group's SIGINT) starts no further one.
    local stopped=0 code=0
    trap 'stopped=1' INT
    if [ ${#cluster_lp[@]} -gt 0 ]; then
        # shellcheck disable=SC2086  # the pytest arguments are a word list
        "$PY" -m pytest "${cluster_lp[@]}" $PYTEST_ARGS || code=$?
    fi
    if [ ${#cluster_312[@]} -gt 0 ] && [ "$stopped" -eq 0 ]; then
        # shellcheck disable=SC2086
        "$PY312" -m pytest "${cluster_312[@]}" $PYTEST_ARGS || code=$((code ? code : $?))
    fi
    return "$code"
}

# Job control: each background leg runs in a process group of its own with SIGINT as it is
# (a background job without it would ignore SIGINT, and its pytest could not be stopped
# cleanly); the trap above forwards Ctrl-C to those groups.
set -m
# shellcheck disable=SC2086  # the pytest arguments are a word list
"$PY312" -m pytest "${current_tests[@]}" $PYTEST_ARGS >"$current_log" 2>&1 &
current=$!
if [ ${#ignore_cluster[@]} -gt 0 ]; then
    cluster_leg >"$cluster_log" 2>&1 &
    cluster=$!
fi
set +m
echo "make test: the current-stack leg and the cluster leg run at the same time; their output follows this leg's"

# shellcheck disable=SC2086
"$PY" -m pytest "${ignore_cluster[@]}" $PYTEST_ARGS
launchpad_code=$?

wait "$current"
current_code=$?
current=""
cluster_code=0
if [ -n "$cluster" ]; then
    wait "$cluster"
    cluster_code=$?
    cluster=""
fi
echo
echo "================ the current-stack leg ($PY312) ================"
cat "$current_log"
echo
echo "================ the cluster leg (${cluster_lp[*]} on $PY; ${cluster_312[*]} on $PY312) ================"
cat "$cluster_log"
echo
echo "make test: exit codes: Launchpad leg $launchpad_code, current-stack leg $current_code, cluster leg $cluster_code"
[ "$launchpad_code" -eq 0 ] && [ "$current_code" -eq 0 ] && [ "$cluster_code" -eq 0 ]
