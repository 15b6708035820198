"""Tests for magi_lp.launch.processes on real process trees (`sh` starting `sleep`s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from magi_lp.launch import processes

VAR = "MAGI_LP_PROCESSES_TEST"


@pytest.fixture
def tree():
    """`sh` with two `sleep` children, all marked with a fresh value; yields (popen, value)."""
    value = uuid.uuid4().hex
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60 & wait"], env={**os.environ, VAR: value}
    )
    deadline = time.monotonic() + 10
    while len(psutil.Process(shell.pid).children()) < 2:
        assert time.monotonic() < deadline, "the shell did not start its sleeps"
        time.sleep(0.01)
    yield shell, value
    processes.kill_tree(shell.pid)
    shell.wait()


def test_marked_processes_are_found_and_killed(tree):
    shell, value = tree
    found = processes.processes_marked(VAR, value)
    assert {p.pid for p in found} == {
        shell.pid,
        *(c.pid for c in psutil.Process(shell.pid).children()),
    }
    assert processes.processes_marked(VAR, "another value") == []

    killed = processes.kill_marked(VAR, value, wait_s=10)

    assert len(killed) == 3 and f"{shell.pid} (sh)" in killed
    assert not psutil.pid_exists(shell.pid)  # dead, and reaped by the wait (our child)
    assert processes.processes_marked(VAR, value) == []  # the orphaned sleeps too


def test_kill_tree_kills_the_process_and_its_descendants(tree):
    shell, _ = tree
    sleeps = psutil.Process(shell.pid).children()

    killed = processes.kill_tree(shell.pid, wait_s=10)

    assert sorted(killed) == sorted([f"{shell.pid} (sh)", *(f"{s.pid} (sleep)" for s in sleeps)])
    shell.wait(timeout=10)
    assert processes.wait_dead(sleeps, 10) == []
    assert processes.kill_tree(shell.pid) == []  # gone: nothing to do


def test_a_zombie_is_not_listed():
    value = uuid.uuid4().hex
    child = subprocess.Popen(["true"], env={**os.environ, VAR: value})
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert processes.processes_marked(VAR, value) == []
    finally:
        child.wait()


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a process of their own: `end_children` ends every child of the process it runs in.
_END_CHILDREN = """
import json, signal, subprocess, sys
import psutil
from magi_lp.launch import processes
polite = subprocess.Popen(["sleep", "60"])
stubborn = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
     "print('ready', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE,
)
stubborn.stdout.readline()
both = [psutil.Process(polite.pid), psutil.Process(stubborn.pid)]
killed = processes.end_children(grace_s=0.5, wait_s=10)
print(json.dumps({"killed": killed, "stubborn": stubborn.pid,
                  "alive": len(processes.wait_dead(both, 0))}))
"""

_DIE_WITH_PARENT = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; from magi_lp.launch import processes; "
     "print(processes.die_with_parent(signal.SIGKILL), flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True,
)
print(child.pid, child.stdout.readline().strip(), flush=True)
sys.stdin.read()
"""


def test_end_children_terms_then_kills_only_those_still_alive():
    done = subprocess.run(
        [sys.executable, "-c", _END_CHILDREN], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    result = json.loads(done.stdout)

    assert result["alive"] == 0
    assert len(result["killed"]) == 1 and result["killed"][0].startswith(f"{result['stubborn']} (")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_die_with_parent_ends_the_child_with_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", _DIE_WITH_PARENT],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid, took = parent.stdout.readline().split()
    child = psutil.Process(int(pid))
    assert took == "True"

    parent.kill()
    parent.wait(10)

    assert processes.wait_dead([child], 10) == []
