"""Launch a Launchpad program as local processes, watch it, and leave nothing behind.

`launch(program, envs, log_dir=...)` starts every node of `program` with Launchpad 0.5.0's
LOCAL_MULTI_PROCESSING launcher in its `output_to_files` terminal mode (the only mode that
works headless and in CI and sees a node's exit code), gives each node group its own
environment overrides through Launchpad's `PythonProcess(env=...)`, then supervises the
node processes until the program ends and returns an exit code:

- 0 when the program stops normally: a node calls `lp.stop()` (which SIGTERMs the pid
  that ran `lp.launch`, i.e. this process), the launcher gets SIGINT / SIGTERM / SIGHUP,
  or every node returns by itself. As in Launchpad, a node that returns (exit code 0)
  while others still run is not a failure; the program goes on without it.
- 1 when a node dies (non-zero exit code, or killed by a signal) before a stop was asked
  for. The launcher prints which node died (`group/index`, pid, exit code or signal) and
  the last lines of its log, then stops every other node.

Every node gets MAGI_LP_LAUNCH_ID in its environment; once the nodes are gone, every process
still carrying this launch's id is SIGKILLed, so nothing the program started outlives it.
Each node runs in its own session (the terminal's Ctrl-C reaches only the launcher, which
stops the nodes in order) and dies with the launcher (`magi_lp.launch.node_lifetime`).
Launchpad's job files and every node's TMPDIR live in a private temporary folder that is
removed at the end (and, after a launcher was SIGKILLed, by the next launch).

Stopping happens in stages (`stop_stages`): e.g. actors, evaluators and the coordinator
first, then the learner (whose final checkpoint then reads the final step counts from a
counter that is still up), then the counter and the replay.

`launch()` must run in the main thread (it handles signals, as `lp.launch` does) and the
node classes must be importable by the children (Launchpad pickles functions from
importable modules by reference). The Launchpad 0.5.0 behaviours this relies on, and why
supervising, stopping and cleaning up work as they do: docs/launchpad-notes.md.

This module starts; the rest of a launch is in its own modules: `launchpad_seam` (the
Launchpad internals touched), `supervisor` (watching the nodes, the stop in stages),
`exit_report` (a dead node's cause and log tail), `run_folders` (node logs, launcher.log,
the private temp folder).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import cloudpickle
import launchpad as lp

from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.errors import ConfigError
from magi_lp.launch import node_lifetime, processes, run_folders
from magi_lp.launch.launchpad_seam import start_local_program
from magi_lp.launch.supervisor import (
    KILL_WAIT_SECS,
    LAUNCH_ID_VAR,
    StopSignals,
    Supervisor,
    count_by_group,
    node_processes,
    node_stop_secs,
    stage_of,
)

# Defaults for every node; a group's own env wins.
_NODE_ENV_DEFAULTS = {"PYTHONUNBUFFERED": "1"}

# Variables the launcher sets in every node itself.
_LAUNCHER_VARS = (
    LAUNCH_ID_VAR,
    node_lifetime.LAUNCHER_PID_VAR,
    node_lifetime.RUN_TMP_VAR,
)


def launch(
    program: lp.Program,
    envs: Mapping[str, Mapping[str, str]],
    *,
    log_dir: str | os.PathLike,
    termination_notice_secs: float = 10,
    report_stream: TextIO | None = None,
    stop_stages: Sequence[Collection[str]] = (),
    saves_at_stop: Collection[str] = (),
    status: Any = None,
) -> int:
    """Runs `program` as local processes until it ends; returns the exit code.

    Args:
      program: the Launchpad program. Its node classes must be importable by a fresh
        Python process (Launchpad pickles them by reference).
      envs: for each group label of `program`, the environment variables (strings) to
        set in that group's nodes, on top of this process's environment (e.g.
        `PlacementPlan.envs()`). A group missing here gets no overrides.
      log_dir: each node's stdout and stderr go to `<log_dir>/<group>/<index>`.
      termination_notice_secs: how long nodes get between SIGTERM and SIGKILL when
        the program is being stopped.
      report_stream: where the launcher's own lines go (default: stderr).
      stop_stages: the order in which groups are stopped: stage k's nodes get SIGTERM once
        every node of the stages before it has ended (each stage gets
        `termination_notice_secs` before SIGKILL). Groups named in no stage stop first.
      saves_at_stop: groups whose nodes write something at stop (the learner's final
        checkpoint). A second stop signal kills the stages before theirs and waits for
        them; a node of theirs that is killed, or exits non-zero, is reported in words
        (a non-zero exit makes the exit code 1).
      status: an optional `magi_lp.launch.monitor.StatusMonitor`-like object with
        `start(nodes)`, `final_sample()` (called as a stop begins) and `stop()`, shown
        while the program runs.

    Returns:
      0 when the program stopped normally (`lp.stop()`, SIGINT / SIGTERM / SIGHUP to the
      launcher, or all nodes returned); 1 when a node died first. Either way every process
      of the program has ended and Launchpad's job files are removed.

    Raises:
      ConfigError: `envs` names a group the program does not have, or holds a non-string
        name or value; `termination_notice_secs` is not a non-negative number; `log_dir`
        cannot be created. Raised before anything is spawned.
      RuntimeError: called outside the main thread.
    """
    group_envs = _validated_envs(program, envs)
    notice_secs = _validated_notice(termination_notice_secs)
    log_path = run_folders.prepared_folder(log_dir, f"log_dir={str(log_dir)!r}")
    _require_main_thread()
    report = run_folders.reporter(report_stream, log_path / run_folders.LAUNCHER_LOG)
    run_folders.sweep_stale_run_folders(tempfile.gettempdir())
    kept = run_folders.keep_earlier_logs(log_path)
    if kept:
        report(f"logs of the earlier launch kept as {log_path}/<group>/<index>.{kept}")

    launch_id = uuid.uuid4().hex
    run_tmp = run_folders.make_run_temp()
    node_envs = _node_envs(group_envs, notice_secs, launch_id, run_tmp)
    init_file = Path(run_tmp, "node_init.pkl")
    init_file.write_bytes(cloudpickle.dumps(node_lifetime.enter_node))
    signals = StopSignals()
    signals.install()
    try:
        manager, interrupted = start_local_program(
            program,
            node_envs,
            log_dir=log_path,
            job_dir=run_tmp,
            init_file=init_file,
            reinstall_signals=signals.install,
        )
        if interrupted:
            signals.received.append(signal.SIGINT)
        nodes = node_processes(manager, log_path)
        report(
            f"started {len(nodes)} nodes ({count_by_group(nodes)}); "
            f"logs in {log_path}/<group>/<index>"
        )
        supervisor = Supervisor(
            nodes,
            signals,
            notice_secs,
            launch_id,
            report,
            stages=stage_of(stop_stages),
            saves_at_stop=frozenset(saves_at_stop),
            before_stop=None if status is None else status.final_sample,
            requested_stop=functools.partial(node_lifetime.requested_stop, run_tmp),
        )
        if status is not None:
            status.start([(n.group, n.index, n.process) for n in nodes])
        return supervisor.run()
    finally:
        if status is not None:
            status.stop()
        _leave_nothing(launch_id, run_tmp, report)
        signals.restore()


def _require_main_thread() -> None:
    """launch() handles SIGINT and SIGTERM for the program (and lp.launch installs signal
    handlers): only the main thread can."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "magi_lp.launch.launcher.launch() must run in the main thread: it handles SIGINT and "
            "SIGTERM for the program (and lp.launch installs signal handlers)."
        )


def _node_envs(
    group_envs: Mapping[str, Mapping[str, str]], notice_secs: float, launch_id: str, run_tmp: str
) -> dict[str, dict[str, str]]:
    """Each group's env as its nodes get it: the defaults, the stop notice and the private
    TMPDIR under the group's own env; the launch's marks over it (a group cannot change what
    the launcher sweeps and stops its nodes by)."""
    return {
        group: {
            **_NODE_ENV_DEFAULTS,
            node_lifetime.STOP_SECS_VAR: f"{node_stop_secs(notice_secs):g}",
            "TMPDIR": run_tmp,
            **env,
            LAUNCH_ID_VAR: launch_id,
            node_lifetime.LAUNCHER_PID_VAR: str(os.getpid()),
            node_lifetime.RUN_TMP_VAR: run_tmp,
        }
        for group, env in group_envs.items()
    }


def _leave_nothing(launch_id: str, run_tmp: str, report: Callable[[str], None]) -> None:
    """Kills every process still carrying this launch's id and removes its temp folder.
    Normally nothing is left; after an error anywhere in the launch this is the cleanup of
    whatever was already spawned."""
    strays = processes.kill_marked(LAUNCH_ID_VAR, launch_id, wait_s=KILL_WAIT_SECS)
    if strays:
        report(f"killed {len(strays)} leftover processes: {', '.join(strays)}")
    shutil.rmtree(run_tmp, ignore_errors=True)


def _validated_envs(
    program: lp.Program, envs: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """Checks `envs` against the program's groups; returns an env for every group."""
    groups = list(program.groups)
    if not isinstance(envs, Mapping):
        raise ConfigError(
            refusal(
                "envs",
                "a dict from group label to a dict of environment variables",
                envs,
                "e.g. {'actor': {'OMP_NUM_THREADS': '1'}}",
            )
        )
    result: dict[str, dict[str, str]] = {group: {} for group in groups}
    for group, env in envs.items():
        if group not in program.groups:
            raise ConfigError(
                fact_refusal(
                    f"envs[{group!r}] names no node group of the program",
                    f"its groups are {', '.join(sorted(groups))}",
                    "fix the label or drop the entry",
                )
            )
        if not isinstance(env, Mapping):
            raise ConfigError(
                refusal(
                    f"envs[{group!r}]",
                    "a dict of environment variables",
                    env,
                    "e.g. {'OMP_NUM_THREADS': '1'}",
                )
            )
        for name, value in env.items():
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ConfigError(
                    refusal(
                        f"each variable name of envs[{group!r}]",
                        "a non-empty string without '=' or NUL",
                        name,
                        "rename the variable",
                    )
                )
            if name in _LAUNCHER_VARS:
                raise ConfigError(
                    fact_refusal(
                        f"envs[{group!r}][{name!r}]",
                        "this variable is set by the launcher itself",
                        "remove it",
                    )
                )
            if not isinstance(value, str):
                raise ConfigError(
                    refusal(
                        f"envs[{group!r}][{name!r}]",
                        "a string",
                        value,
                        f"e.g. {str(value)!r}",
                    )
                )
            if "\0" in value:
                raise ConfigError(
                    refusal(
                        f"envs[{group!r}][{name!r}]",
                        "a string without NUL characters",
                        value,
                        "remove the NUL",
                    )
                )
        result[group] = dict(env)
    return result


def _validated_notice(termination_notice_secs: Any) -> float:
    ok = (
        isinstance(termination_notice_secs, int | float)
        and not isinstance(termination_notice_secs, bool)
        and math.isfinite(termination_notice_secs)
        and termination_notice_secs >= 0
    )
    if not ok:
        raise ConfigError(
            refusal(
                "termination_notice_secs",
                "a number of seconds >= 0",
                termination_notice_secs,
                "e.g. 10 (the default; 0 kills nodes without notice)",
            )
        )
    return float(termination_notice_secs)
