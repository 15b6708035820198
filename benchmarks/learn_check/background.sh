#!/usr/bin/env bash
# Starts (or resumes) the preregistered learn-check runs in the background, detached from
# this shell so they outlive it, at the lowest CPU priority, one run per core at a time:
#
#   bash benchmarks/learn_check/background.sh [--paper] [DRQV2 [COMMIT]]
#        DRQV2: the official checkout (default ../drqv2); COMMIT: the code to run, the
#        first time only (default HEAD); --paper: the preregistered GPU comparison's runs
#        (`python -m benchmarks.learn_check --paper`), in runs/learn_check_paper/ (its own
#        worktree, log and pid) and kept in benchmarks/gpu_learn_check/cpu/
#
# The runs use a worktree of this repository pinned at one commit (runs/learn_check/tree,
# git-ignored), not this checkout, whose files others edit while the runs go on for hours:
# each resume runs the same code. Results are kept in this checkout
# (benchmarks/learn_check/results/), run folders in runs/learn_check/. Each run continues
# from its checkpoint (ours) or snapshot.pt (the official agent): call this again after a
# machine or session restart. Those live in runs/ (too large to commit): a machine that comes
# up new has lost them, and its runs start again from frame 0. What outlives it is each
# unfinished run's progress record (launches, evaluations so far) beside the kept results
# (<kept>/progress/): commit it after stopping the runs; a lost run's is moved to <kept>/lost/
# when the run starts again. Log:
# runs/learn_check/background.log (appended); the command's pid:
# runs/learn_check/background.pid. `kill $(cat runs/learn_check/background.pid)` stops it: the
# runs save a checkpoint and resume on the next call.
#
# The runs are at nice 19. Where the kernel groups processes by session
# (CONFIG_SCHED_AUTOGROUP, /proc/sys/kernel/sched_autogroup_enabled = 1), that nice only
# ranks them within their own group: setsid starts a new group at nice 0, an equal of every
# other session (each test run, each shell), so the runs get about one group's share.
# LEARN_CHECK_GROUP_NICE=19 lowers the group too (/proc/self/autogroup): the runs then take
# only what is idle, which on a machine that is never idle is nothing (measured: 0 CPU
# seconds in 90 s at load average 25, 2026-11-26).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
runs=runs/learn_check
kept=benchmarks/learn_check/results
mode=
if [ "${1:-}" = --paper ]; then
    shift
    runs=runs/learn_check_paper
    kept=benchmarks/gpu_learn_check/cpu
    mode=--paper
fi
drqv2=${1:-$root/../drqv2}
if [ ! -d "$drqv2" ]; then
    echo "learn_check: no official checkout at $drqv2: git clone https://github.com/facebookresearch/drqv2 $drqv2 && git -C $drqv2 checkout c0c650b" >&2
    exit 2
fi
drqv2=$(cd "$drqv2" && pwd)
cd "$root"
mkdir -p "$runs"
tree=$runs/tree
if [ ! -e "$tree/.git" ]; then
    commit=$(git rev-parse "${2:-HEAD}")
    git worktree prune
    git worktree add --detach "$tree" "$commit" >/dev/null
    echo "learn_check: runs pinned at $commit ($tree)"
fi
for venv in .venv .venv312 .venv-official; do
    [ -e "$tree/$venv" ] || ln -s "$root/$venv" "$tree/$venv"
done
bash scripts/setup_official_venv.sh .venv-official >/dev/null
pidfile=$runs/background.pid
if [ -f "$pidfile" ] && grep -qs benchmarks.learn_check "/proc/$(cat "$pidfile")/cmdline"; then
    echo "learn_check: already running (pid $(cat "$pidfile")); log $runs/background.log"
    exit 0
fi
cd "$tree"
setsid nohup env GROUP_NICE="${LEARN_CHECK_GROUP_NICE:-}" bash -c '
    [ -z "$GROUP_NICE" ] || echo "$GROUP_NICE" > /proc/self/autogroup 2>/dev/null || true
    echo "== $(date -Is) start at $(git rev-parse HEAD) (autogroup: $(cat /proc/self/autogroup 2>/dev/null || echo none))"
    exec nice -n 19 .venv/bin/python -m benchmarks.learn_check $4 --official "$0" --out "$1/$2" --kept "$1/$3"
' "$drqv2" "$root" "$runs" "$kept" "$mode" >>"$root/$runs/background.log" 2>&1 </dev/null &
echo $! >"$root/$pidfile"
echo "learn_check: started (pid $!); log $runs/background.log"
