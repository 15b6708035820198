"""The Launchpad 0.5.0 internals the local launch relies on, in one place.

Launchpad's public API (`lp.Program`, `lp.launch`, `PythonProcess(env=..., args=...)`,
`lp.stop`, `lp.wait_for_stop`, Courier) is used as documented everywhere else. What it
does not offer on one machine (a node's log folder, a session of its own, the list of node
processes, a stop that does not SIGKILL a node's main thread after 10 s) comes from private
attributes, touched only here; the several-hosts path has its own list
(`magi_lp.cluster.prepare`, below). Each, with what breaks if an upgrade changes it:

- `run_locally.launch_local_output_to_files._LOGGING_DIR`: node logs go to
  `<workdir>/nodes` (`start_local_program`). If it changes: they go to /tmp/launchpad_out.
- `WorkerManager.process_worker(..., **popen_kwargs)`: each node starts in its own session,
  so a terminal's Ctrl-C reaches only the launcher. If it changes: Ctrl-C interrupts nodes
  mid-stop.
- `WorkerManager._active_workers` (`{'group/index': [Popen]}`): the node processes the
  launcher supervises (`active_workers`). If it changes: nothing can be supervised.
- flag `lp_worker_manager_registers_signals`: the launcher keeps its own SIGINT/SIGTERM
  handlers. If it changes: Launchpad's handlers stop nodes all at once, without stages.
- `WorkerManager.__init__` and flag `lp_termination_notice_secs`, in a node: its stop
  watcher sets the managers' stop event and switches off their self-SIGKILL
  (`record_worker_managers`). If they change: a node blocked in C++ is SIGKILLed after
  10 s instead of leaving by itself within its stop budget.
- `WorkerManager(register_in_thread=True).stop_event()`: a node started on one host of
  several (`node_worker_manager`, `magi_lp.cluster.host_node`). If it changes: such nodes
  cannot start.

`magi_lp.cluster.prepare` also does by hand what `lp.launch` does before it spawns (the
semi-public `launch.serialization.serialize_functions`, `address.AbstractAddressBuilder`,
`context.LaunchType`, a node's `launch_context.initialize`, `input_handles`, `addresses`).

Every function checks what it needs and raises one RuntimeError naming the attribute and the
pinned version (requirements.txt) instead of failing somewhere inside Launchpad. The whole
seam is exercised by the launcher's tests (tests/test_launcher.py, tests/test_node_lifetime.py,
tests/test_cluster.py). More on why: docs/launchpad-notes.md.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PINNED = "Launchpad 0.5.0 as pinned in requirements.txt"


def _require(owner: Any, name: str) -> None:
    if not hasattr(owner, name):
        raise RuntimeError(
            f"launchpad's {getattr(owner, '__name__', owner)} no longer has {name}; magi_lp "
            f"supports {PINNED} (magi_lp/launch/launchpad_seam.py lists what it relies on)."
        )


def start_local_program(
    program: Any,
    node_envs: Mapping[str, Mapping[str, str]],
    *,
    log_dir: Path,
    job_dir: str,
    init_file: Path,
    reinstall_signals: Callable[[], None],
) -> tuple[Any, bool]:
    """Runs `lp.launch` (local multi-processing, output to files) with our folders.

    Every node runs `init_file` (Launchpad's `--init_file`) first, gets its group's env, and
    starts in a session of its own, so the terminal's Ctrl-C (sent to the foreground process
    group) reaches only the launcher, which stops the nodes in order; a node can neither be
    interrupted mid-stop nor re-arm an inherited-ignored SIGINT into a crash.

    Args:
      program: the `lp.Program`.
      node_envs: each launch group's full environment overrides.
      log_dir: each node's output goes to `<log_dir>/<group>/<index>`.
      job_dir: where Launchpad writes its job files (the launch's private temp folder).
      init_file: the cloudpickled function every node runs before its own imports.
      reinstall_signals: puts the launcher's signal handlers back (Launchpad replaces them).

    Returns:
      Launchpad's WorkerManager, and whether a Ctrl-C reached Launchpad's own handler
      during `lp.launch` (it then SIGTERMed the nodes started so far; the caller stops).
    """
    import launchpad as lp
    from absl import flags
    from launchpad.launch import worker_manager
    from launchpad.launch.run_locally import launch_local_output_to_files
    from launchpad.nodes.python.local_multi_processing import PythonProcess

    _require(launch_local_output_to_files, "_LOGGING_DIR")
    _require(worker_manager.WorkerManager, "process_worker")
    resources = {
        group: PythonProcess(env=dict(env), args={"init_file": str(init_file)})
        for group, env in node_envs.items()
    }
    flag_values = flags.FLAGS
    if not flag_values.is_parsed():
        # lp.launch would do the same; we need the flags readable before it.
        flag_values(sys.argv, known_only=True)
    saved_registers = flag_values.lp_worker_manager_registers_signals
    saved_log_dir = launch_local_output_to_files._LOGGING_DIR
    saved_tempdir = tempfile.tempdir
    saved_alarm = signal.getsignal(signal.SIGALRM)
    flag_values.lp_worker_manager_registers_signals = False
    launch_local_output_to_files._LOGGING_DIR = str(log_dir)
    tempfile.tempdir = job_dir
    process_worker = worker_manager.WorkerManager.process_worker

    def process_worker_in_own_session(self, name, command, env=None, **kwargs):
        return process_worker(self, name, command, env=env, start_new_session=True, **kwargs)

    worker_manager.WorkerManager.process_worker = process_worker_in_own_session
    try:
        # Launchpad prints where logs go and suggests LAUNCHPAD_LOGGING_DIR, which does
        # not apply here; the launcher reports the log folder itself.
        with contextlib.redirect_stdout(io.StringIO()):
            manager = lp.launch(
                program,
                launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING,
                local_resources=resources,
                terminal="output_to_files",
            )
    finally:
        worker_manager.WorkerManager.process_worker = process_worker
        flag_values.lp_worker_manager_registers_signals = saved_registers
        launch_local_output_to_files._LOGGING_DIR = saved_log_dir
        tempfile.tempdir = saved_tempdir
        reinstall_signals()
        signal.signal(signal.SIGALRM, signal.SIG_DFL if saved_alarm is None else saved_alarm)
    # The manager would otherwise wait for (and raise about) the nodes at interpreter exit.
    atexit.unregister(manager.wait)
    interrupted = bool(manager.wait_for_stop(0))
    if interrupted:
        # Launchpad's SIGINT handler armed SIGALRM to escalate; the launcher takes over.
        signal.alarm(0)
    return manager, interrupted


def active_workers(manager: Any) -> dict[str, list[subprocess.Popen]]:
    """The node processes a WorkerManager started: `{'group/index': [Popen, ...]}`."""
    workers = getattr(manager, "_active_workers", None)
    if not isinstance(workers, Mapping):
        raise RuntimeError(
            f"launchpad's WorkerManager no longer keeps _active_workers; magi_lp supports "
            f"{PINNED} (magi_lp/launch/launchpad_seam.py)."
        )
    result = {}
    for title, popens in workers.items():
        for process in popens:
            if not isinstance(process, subprocess.Popen):
                raise RuntimeError(f"unexpected Launchpad worker {process!r} for {title}")
        result[title] = list(popens)
    return result


def record_worker_managers(managers: list[Any]) -> None:
    """In a node: appends every WorkerManager Launchpad makes from now on to `managers` (so
    the node's stop watcher can set their stop event) and switches off their self-SIGKILL
    10 s after SIGTERM (`--lp_termination_notice_secs`). Does nothing in a process that
    Launchpad's process entry did not start (it has not imported the worker manager)."""
    worker_manager = sys.modules.get("launchpad.launch.worker_manager")
    if worker_manager is None:
        return
    with contextlib.suppress(Exception):
        from absl import flags

        flags.FLAGS.lp_termination_notice_secs = -1
    manager_class = worker_manager.WorkerManager
    original_init = manager_class.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        managers.append(self)

    manager_class.__init__ = recording_init


def node_worker_manager(program_name: str, notice_secs: float) -> Any:
    """A WorkerManager for a node started outside `lp.launch` (one host of several), with
    Launchpad's flags parsed first (its manager reads the termination notice from them)."""
    from absl import flags
    from launchpad.launch import worker_manager

    flags.FLAGS([program_name], known_only=True)
    flags.FLAGS.lp_termination_notice_secs = max(1, int(notice_secs))
    return worker_manager.WorkerManager(register_in_thread=True)
