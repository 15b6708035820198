"""A node ends by itself at a stop, whatever its main thread is blocked in.

Each case runs a small node-like process: Launchpad's WorkerManager (as process_entry makes
it) with the stop watcher of `magi_lp.launch.node_lifetime`, and a main thread blocked in C
(libc `sleep` through ctypes, which releases the GIL, as a Reverb insert or a Courier call
does) so that no Python signal handler runs until the block returns.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# What a stopped node may take to leave here: its budget plus a Python start-up and exit
# on a machine whose cores are busy (the budget itself is what is asserted apart).
_SLACK_S = 10.0

NODE = textwrap.dedent(
    """
    import ctypes, os, sys, threading, time
    from launchpad.launch import worker_manager
    from absl import flags
    flags.FLAGS(["node"], known_only=True)
    from magi_lp.launch import node_lifetime

    node_lifetime.watch_for_stop(float(sys.argv[1]))
    manager = worker_manager.WorkerManager(register_in_thread=True)
    hold_s = float(sys.argv[2])

    def report_event():
        manager.stop_event().wait()
        print("stop event set", flush=True)

    threading.Thread(target=report_event, daemon=True).start()
    libc = ctypes.CDLL(None)
    print("ready", flush=True)

    def block_in_c():
        while True:  # a signal ends one sleep; the loop blocks again at once
            libc.sleep(60)

    if hold_s:
        with node_lifetime.hold_exit("a test save"):
            end = None
            while True:
                libc.usleep(100_000)
                if node_lifetime.stop_requested():
                    end = end or time.monotonic() + hold_s
                    if time.monotonic() >= end:
                        break
            # Inside the hold: once it is released the watcher may leave at once, before
            # a line printed after the `with` (seen at load 7: "leaving" came first).
            print("save done", flush=True)
        libc.sleep(60)
    else:
        block_in_c()
    """
)


def _start(budget_s: float, hold_s: float = 0.0) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", NODE, str(budget_s), str(hold_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def _stop(process: subprocess.Popen) -> tuple[int, float, str]:
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"the node ignored SIGTERM for 30 s:\n{out}")
    return process.returncode, time.monotonic() - start, out


def test_node_blocked_in_c_leaves_after_its_budget_with_exit_0():
    process = _start(budget_s=0.5)
    code, took, out = _stop(process)
    assert code == 0, out
    # The stop event is set from the watcher thread while the main thread is still blocked.
    assert "stop event set" in out, out
    assert "leaving the process" in out and "main thread in" in out, out
    assert 0.5 <= took < 0.5 + _SLACK_S, out


def test_hold_exit_keeps_the_process_until_the_save_is_done():
    process = _start(budget_s=0.2, hold_s=1.5)
    code, took, out = _stop(process)
    assert code == 0, out
    # Not left during the save (1.5 s, longer than the budget); left right after it.
    assert out.index("save done") < out.index("leaving the process"), out
    assert 1.5 <= took < 1.5 + _SLACK_S, out


def test_stop_budget_from_env():
    from magi_lp.launch import node_lifetime, supervisor

    assert node_lifetime.stop_secs_from_env({}) == node_lifetime.DEFAULT_STOP_SECS
    assert node_lifetime.stop_secs_from_env({node_lifetime.STOP_SECS_VAR: "1.5"}) == 1.5
    for bad in ("x", "-1"):
        env = {node_lifetime.STOP_SECS_VAR: bad}
        assert node_lifetime.stop_secs_from_env(env) == node_lifetime.DEFAULT_STOP_SECS
    # A node's budget always ends before the launcher's SIGKILL.
    assert supervisor.node_stop_secs(10) == node_lifetime.DEFAULT_STOP_SECS == 1.0
    assert supervisor.node_stop_secs(1) == 0.5


RETURNING_NODE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from launchpad.launch import worker_manager
    from absl import flags
    flags.FLAGS(["node"], known_only=True)
    from magi_lp.launch import node_lifetime

    node_lifetime.enter_node()  # what every node runs first (MAGI_LP_NODE_STOP_SECS=60)
    manager = worker_manager.WorkerManager(register_in_thread=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


    class SlowTeardown:
        # What TensorFlow's, gRPC's and Reverb's teardown cost on a busy machine, and more:
        # a module global is finalised with the interpreter, after the watcher is gone.
        def __del__(self):
            time.sleep(60)


    slow = SlowTeardown()
    print("ready", child.pid, flush=True)
    manager.stop_event().wait()
    print("run returned", flush=True)
    """
)


def test_node_whose_run_returns_at_a_stop_leaves_without_finalising_and_ends_its_child():
    import os

    import psutil

    env = dict(os.environ, MAGI_LP_NODE_STOP_SECS="60")
    process = subprocess.Popen(
        [sys.executable, "-c", RETURNING_NODE],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    ready, child_pid = process.stdout.readline().split()
    assert ready == "ready"
    code, took, out = _stop(process)
    assert code == 0, out
    assert "run returned" in out, out
    # Neither the watcher's budget (60 s) nor the teardown (60 s) was waited for.
    assert took < _SLACK_S, out
    assert "leaving the process" not in out, out
    child = int(child_pid)
    gone = not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert gone, f"the node's child {child} outlived it"


LEAVING_HOST_NODE = textwrap.dedent(
    """
    import sys, tempfile
    from magi_lp.launch import node_lifetime, run_folders

    with run_folders.private_temp() as run_tmp:  # as magi_lp.cluster.host_node runs a node
        with tempfile.NamedTemporaryFile(delete=False) as left_by_a_library:
            pass
        print(run_tmp, left_by_a_library.name, flush=True)
        node_lifetime.leave_process(3)  # a node leaving at its stop, from inside the block
    print("not reached", flush=True)
    """
)


def test_a_node_leaving_with_os_exit_takes_its_private_temp_folder(tmp_path):
    """A SLURM node leaves from inside its `private_temp` block: the folder goes with it."""
    import os

    done = subprocess.run(
        [sys.executable, "-c", LEAVING_HOST_NODE],
        capture_output=True,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
        timeout=60,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    run_tmp, left = done.stdout.split()
    assert Path(left).parent == Path(run_tmp) and Path(run_tmp).parent == tmp_path
    assert list(tmp_path.iterdir()) == [], "the node's private temp folder was left"
