"""Tests for magi_lp.launch.processes on real process trees (`sh` starting `sleep`s)."""

from __future__ import annotations

import os
import subprocess
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
