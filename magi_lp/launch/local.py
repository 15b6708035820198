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
stops the nodes in order) and dies with the launcher (`magi_lp.launch.node_process`).
Launchpad's job files and every node's TMPDIR live in a private temporary folder that is
removed at the end (and, after a launcher was SIGKILLed, by the next launch).

Stopping happens in stages (`stop_stages`): e.g. actors, evaluators and the coordinator
first, then the learner (whose final checkpoint then reads the final step counts from a
counter that is still up), then the counter and the replay.

`launch()` must run in the main thread (it handles signals, as `lp.launch` does) and the
node classes must be importable by the children (Launchpad pickles functions from
importable modules by reference). The Launchpad 0.5.0 behaviours this relies on, and why
supervising, stopping and cleaning up work as they do: docs/launchpad-notes.md.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import cloudpickle
import launchpad as lp
import psutil
from absl import flags
from launchpad.launch import worker_manager
from launchpad.launch.run_locally import launch_local_output_to_files
from launchpad.nodes.python.local_multi_processing import PythonProcess

from magi_lp import console
from magi_lp.errors import ConfigError
from magi_lp.launch import node_process, processes

LAUNCH_ID_VAR = "MAGI_LP_LAUNCH_ID"
"""Environment variable that marks every process started for one `launch()` call."""

TAIL_LINES = 20
"""How many lines of a dead node's log the exit report shows."""

_POLL_SECS = 0.1
# After SIGKILL a process should be gone at once; one stuck in uninterruptible sleep is
# reported instead of hanging the launcher forever.
_KILL_WAIT_SECS = 10.0
# Defaults for every node; a group's own env wins.
_NODE_ENV_DEFAULTS = {"PYTHONUNBUFFERED": "1"}

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A repeat of the same signal within this time is an echo, not a second request.
_ECHO_SECS = 0.2
_KILL_SIGNALS = (signal.SIGQUIT,)
# Variables the launcher sets in every node itself.
_LAUNCHER_VARS = (
    LAUNCH_ID_VAR,
    node_process.LAUNCHER_PID_VAR,
    node_process.RUN_TMP_VAR,
)
_RUN_TMP_PREFIX = "magi_lp_launch_"
_OWNER_FILE = "launcher.pid"


@dataclasses.dataclass(frozen=True)
class NodeExit:
    """How one node process ended.

    Attributes:
      group: the Launchpad group label the node belongs to.
      index: the node's index within its group (Launchpad's task id).
      pid: the node's process id.
      returncode: `Popen.returncode`: the exit code, or minus the signal that killed it.
      log_path: the file its stdout and stderr went to.
    """

    group: str
    index: int
    pid: int
    returncode: int
    log_path: Path

    @property
    def name(self) -> str:
        """`group/index`, the name used in reports and for the log file."""
        return f"{self.group}/{self.index}"

    @property
    def status(self) -> str:
        """The exit code or the killing signal, in words."""
        return describe_returncode(self.returncode)


def describe_returncode(returncode: int) -> str:
    """Says what a `Popen.returncode` means: 'exit code 3' or 'killed by signal SIGKILL (9)'."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {name} ({-returncode})"


def read_tail(path: str | os.PathLike, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of a text file; empty when it does not exist."""
    block = 64 * 1024
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            data = b""
            while size > 0 and data.count(b"\n") <= lines:
                step = min(block, size)
                size -= step
                f.seek(size)
                data = f.read(step) + data
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


# Lines a process writes as it dies in native code: glog's fatal lines, XLA's flag check,
# CPython's fatal error, a C++ exception nobody caught.
# The specific ones (glog `F1123 ...` and TF/XLA's `<time>: F <file>:<line>] ...`) name the
# reason; the generic ones only that it was fatal.
_FATAL_NATIVE = re.compile(
    r"^(F\d{4} .*|.*: F [\w/.-]+:\d+\] .*|.*Check failed.*|.*Unknown flags? in XLA_FLAGS.*)$"
)
_FATAL_GENERIC = re.compile(r"^(Fatal Python error.*|terminate called after throwing.*)$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*$")
CAUSE_SCAN_BYTES = 1 << 20


def death_cause(node: NodeExit, *, stopping: bool = False) -> str | None:
    """The line of a dead node's log that says why it died, or what its end suggests.

    A native fatal line (glog `F`, `Check failed`, unknown XLA flags, `Fatal Python error`)
    comes first for a node killed by a signal; otherwise the last Python exception (the
    line after its traceback); a SIGKILL with no stop in progress is, when the log says
    nothing, most often the kernel's out-of-memory killer.
    """
    try:
        with open(node.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - CAUSE_SCAN_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    native = [line.strip() for line in lines if _FATAL_NATIVE.match(line.strip())] or [
        line.strip() for line in lines if _FATAL_GENERIC.match(line.strip())
    ]
    exception = None
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for later in lines[i + 1 :]:
                if later and not later[0].isspace() and _EXCEPTION.match(later):
                    exception = later.strip()
                    break
    if native and (node.returncode < 0 or exception is None):
        return native[-1]
    if exception is not None:
        return exception
    if node.returncode == -signal.SIGKILL and not stopping:
        return _sigkill_cause(node.pid)
    return None


def _sigkill_cause(pid: int) -> str:
    """Why a node was SIGKILLed with no stop in progress: the kernel's out-of-memory killer
    when the kernel log says so (read only where it is readable), else who else might."""
    kernel_log = _read_kernel_log()
    if kernel_log is None:
        return (
            "killed by SIGKILL while no stop was in progress, and its log names no error: "
            "most often the kernel's out-of-memory killer (`dmesg | grep -i oom`; the kernel "
            "log is not readable here)"
        )
    killed = re.compile(rf"(Killed process {pid}\b|\bpid={pid}\b)")
    for line in reversed(kernel_log):
        if killed.search(line) and ("oom" in line.lower() or "out of memory" in line.lower()):
            return f"killed by the kernel's out-of-memory killer (kernel log: {line.strip()})"
    return (
        "killed by SIGKILL while no stop was in progress, and its log names no error; the "
        f"kernel log names no out-of-memory kill of pid {pid}: another process killed it"
    )


def _read_kernel_log() -> list[str] | None:
    """The kernel's log lines (`dmesg`), or None where it cannot be read (dmesg_restrict)."""
    try:
        result = subprocess.run(
            ["dmesg"], capture_output=True, text=True, errors="replace", timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.splitlines()


def format_exit_report(node: NodeExit, tail_lines: int = TAIL_LINES, stopping: bool = False) -> str:
    """A report on a node that died: which node, how, why (the line of its log that says
    so, when one does), and the last lines of its log."""
    header = f"node {node.name} (group {node.group!r}, pid {node.pid}) died: {node.status}"
    cause = death_cause(node, stopping=stopping)
    if cause is not None:
        header += f"\ncause: {cause}"
    tail = read_tail(node.log_path, tail_lines)
    if not tail:
        return f"{header}\n(its log {node.log_path} is empty)"
    body = "\n".join(f"    {line}" for line in tail)
    return f"{header}\nlast {len(tail)} lines of its log {node.log_path}:\n{body}"


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
      status: an optional `magi_lp.launch.status.StatusMonitor`-like object with
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
    log_path = _prepared_log_dir(log_dir)
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "magi_lp.launch.local.launch() must run in the main thread: it handles SIGINT and "
            "SIGTERM for the program (and lp.launch installs signal handlers)."
        )
    report = _reporter(report_stream, log_path / LAUNCHER_LOG)
    _sweep_stale_run_folders(tempfile.gettempdir())
    kept = _keep_earlier_logs(log_path)
    if kept:
        report(f"logs of the earlier launch kept as {log_path}/<group>/<index>.{kept}")

    launch_id = uuid.uuid4().hex
    run_tmp = tempfile.mkdtemp(prefix=_RUN_TMP_PREFIX)
    Path(run_tmp, _OWNER_FILE).write_text(str(os.getpid()))
    node_envs = {
        group: {
            **_NODE_ENV_DEFAULTS,
            node_process.STOP_SECS_VAR: f"{node_stop_secs(notice_secs):g}",
            "TMPDIR": run_tmp,
            **env,
            LAUNCH_ID_VAR: launch_id,
            node_process.LAUNCHER_PID_VAR: str(os.getpid()),
            node_process.RUN_TMP_VAR: run_tmp,
        }
        for group, env in group_envs.items()
    }
    init_file = Path(run_tmp, "node_init.pkl")
    init_file.write_bytes(cloudpickle.dumps(node_process.enter_node))
    signals = _StopSignals()
    signals.install()
    supervisor = None
    try:
        manager = _start_nodes(program, node_envs, log_path, run_tmp, init_file, signals)
        nodes = _node_processes(manager, log_path)
        report(
            f"started {len(nodes)} nodes ({_count_by_group(nodes)}); "
            f"logs in {log_path}/<group>/<index>"
        )
        supervisor = _Supervisor(
            nodes,
            signals,
            notice_secs,
            launch_id,
            report,
            stages=_stage_of(stop_stages),
            saves_at_stop=frozenset(saves_at_stop),
            before_stop=None if status is None else status.final_sample,
        )
        if status is not None:
            status.start([(n.group, n.index, n.process) for n in nodes])
        return supervisor.run()
    finally:
        if status is not None:
            status.stop()
        # Normally nothing is left here; after an error anywhere above this is the
        # cleanup of whatever was already spawned.
        strays = processes.kill_marked(LAUNCH_ID_VAR, launch_id, wait_s=_KILL_WAIT_SECS)
        if strays:
            report(f"killed {len(strays)} leftover processes: {', '.join(strays)}")
        shutil.rmtree(run_tmp, ignore_errors=True)
        signals.restore()


def node_stop_secs(notice_secs: float) -> float:
    """Each node's own stop budget (MAGI_LP_NODE_STOP_SECS, `node_process.watch_for_stop`):
    1 s, or half the launcher's notice when that is shorter, so that a node blocked in C++
    leaves by itself well before the launcher's SIGKILL."""
    return min(node_process.DEFAULT_STOP_SECS, notice_secs / 2)


def _stage_of(stop_stages: Sequence[Collection[str]]) -> Callable[[str], int]:
    """Group label -> stop stage: groups named in no stage stop first (stage 0)."""
    where = {}
    for number, groups in enumerate(stop_stages, start=1):
        for group in groups:
            where.setdefault(group, number)
    return lambda group: where.get(group, 0)


LAUNCHER_LOG = "launcher.log"
"""The launcher's own lines, appended beside the node logs (`<log_dir>/launcher.log`)."""


def _reporter(stream: TextIO | None, path: Path) -> Callable[[str], None]:
    """The launcher's lines: on its terminal, and appended to `path` with the date, so that
    what a run's launcher said (a dead node's cause, a stop's stages, a SIGKILL) stays in the
    workdir after the terminal is gone. A line that cannot be written there is only shown."""

    def report(text: str) -> None:
        console.say(text, source="launcher", stream=stream)
        with contextlib.suppress(OSError), open(path, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    return report


def _keep_earlier_logs(log_dir: Path) -> int | None:
    """Renames the node logs of an earlier launch `<index>` -> `<index>.<n>`; returns n."""
    current = [p for p in log_dir.glob("*/*") if p.is_file() and p.name.isdigit()]
    if not current:
        return None
    numbers = [
        int(suffix)
        for p in log_dir.glob("*/*.*")
        if (suffix := p.name.rpartition(".")[2]).isdigit()
    ]
    launch_number = max(numbers, default=0) + 1
    for path in current:
        path.rename(path.with_name(f"{path.name}.{launch_number}"))
    return launch_number


def _sweep_stale_run_folders(temp_dir: str) -> None:
    """Removes run temp folders whose launcher is gone (one that was SIGKILLed)."""
    for folder in Path(temp_dir).glob(f"{_RUN_TMP_PREFIX}*"):
        try:
            owner = int(Path(folder, _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if not psutil.pid_exists(owner) or owner == os.getpid():
            shutil.rmtree(folder, ignore_errors=True)


def _validated_envs(
    program: lp.Program, envs: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """Checks `envs` against the program's groups; returns an env for every group."""
    groups = list(program.groups)
    if not isinstance(envs, Mapping):
        raise ConfigError(
            f"envs must map each group label to a dict of environment variables, "
            f"got {type(envs).__name__}."
        )
    result: dict[str, dict[str, str]] = {group: {} for group in groups}
    for group, env in envs.items():
        if group not in program.groups:
            raise ConfigError(
                f"envs[{group!r}]: the program has no node group {group!r}; its groups are "
                f"{sorted(groups)}. Fix the label or drop the entry."
            )
        if not isinstance(env, Mapping):
            raise ConfigError(
                f"envs[{group!r}] must be a dict of environment variables, "
                f"got {type(env).__name__}."
            )
        for name, value in env.items():
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ConfigError(
                    f"envs[{group!r}] has an invalid variable name {name!r}: it must be a "
                    f"non-empty string without '=' or NUL."
                )
            if name in _LAUNCHER_VARS:
                raise ConfigError(
                    f"envs[{group!r}][{name!r}]: this variable is set by the launcher "
                    f"itself; remove it."
                )
            if not isinstance(value, str):
                raise ConfigError(
                    f"envs[{group!r}][{name!r}] = {value!r} is a {type(value).__name__}; "
                    f"environment values must be strings, e.g. {str(value)!r}."
                )
            if "\0" in value:
                raise ConfigError(f"envs[{group!r}][{name!r}] contains a NUL character.")
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
            f"termination_notice_secs={termination_notice_secs!r}: give a number of "
            f"seconds >= 0 (0 kills nodes without notice)."
        )
    return float(termination_notice_secs)


def _prepared_log_dir(log_dir: str | os.PathLike) -> Path:
    path = Path(log_dir).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"log_dir={str(log_dir)!r} cannot be created: {e}.") from e
    return path


class _StopSignals:
    """Records stop / kill signals sent to the launcher; the supervisor acts on them.

    A signal the launcher inherited as ignored (e.g. SIGHUP under nohup) stays ignored.
    """

    def __init__(self):
        self.received: list[int] = []
        self._last_at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Installs (or re-installs, after Launchpad replaced them) the handlers."""
        for sig in _STOP_SIGNALS + _KILL_SIGNALS:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
            ignored = self._previous[sig] == signal.SIG_IGN
            signal.signal(sig, signal.SIG_IGN if ignored else self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        del frame
        now = time.monotonic()
        if self.received and self.received[-1] == signum and now - self._last_at < _ECHO_SECS:
            # The same signal twice within milliseconds is one stop sent to a whole process
            # group (`kill -INT -PGID`), reaching this launcher directly and again through
            # the isolation parent, which forwards what it cannot tell from a terminal's.
            return
        self._last_at = now
        self.received.append(signum)

    def restore(self) -> None:
        """Puts back the handlers that were there before `install()`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)


def _start_nodes(
    program: lp.Program,
    node_envs: Mapping[str, Mapping[str, str]],
    log_dir: Path,
    job_dir: str,
    init_file: Path,
    signals: _StopSignals,
) -> Any:
    """Runs `lp.launch` with our log and job folders; returns its WorkerManager.

    Every node runs `init_file` (Launchpad's `--init_file`) first, and starts in a session
    of its own, so the terminal's Ctrl-C (sent to the foreground process group) reaches
    only the launcher, which stops the nodes in order; a node can neither be interrupted
    mid-stop nor re-arm an inherited-ignored SIGINT into a crash.
    """
    for owner, name in (
        (launch_local_output_to_files, "_LOGGING_DIR"),
        (worker_manager.WorkerManager, "process_worker"),
    ):
        if not hasattr(owner, name):
            raise RuntimeError(
                f"launchpad's {owner.__name__} no longer has {name}; magi_lp.launch.local "
                "supports Launchpad 0.5.0 as pinned in requirements.txt."
            )
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
        # not apply here; launch() reports the log folder itself.
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
        signals.install()
        signal.signal(signal.SIGALRM, signal.SIG_DFL if saved_alarm is None else saved_alarm)
    # The manager would otherwise wait for (and raise about) the nodes at interpreter exit.
    atexit.unregister(manager.wait)
    if manager.wait_for_stop(0):
        # A Ctrl-C reached Launchpad's SIGINT handler during lp.launch: it SIGTERMed the
        # nodes started so far and armed SIGALRM to escalate; we take over from here.
        signal.alarm(0)
        signals.received.append(signal.SIGINT)
    return manager


@dataclasses.dataclass
class _Node:
    group: str
    index: int
    process: subprocess.Popen
    log_path: Path

    @property
    def name(self) -> str:
        return f"{self.group}/{self.index}"

    def ended(self, returncode: int) -> NodeExit:
        return NodeExit(self.group, self.index, self.process.pid, returncode, self.log_path)


def _node_processes(manager: Any, log_dir: Path) -> list[_Node]:
    """The node processes the WorkerManager started, keyed by Launchpad's `group/index`."""
    workers = getattr(manager, "_active_workers", None)
    if not isinstance(workers, Mapping):
        raise RuntimeError(
            "launchpad's WorkerManager no longer keeps _active_workers; magi_lp.launch.local "
            "supports Launchpad 0.5.0 as pinned in requirements.txt."
        )
    nodes = []
    for title, popens in workers.items():
        group, _, index = title.rpartition("/")
        for process in popens:
            if not isinstance(process, subprocess.Popen):
                raise RuntimeError(f"unexpected Launchpad worker {process!r} for {title}")
            nodes.append(_Node(group, int(index), process, log_dir / title))
    return nodes


def _count_by_group(nodes: list[_Node]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.group] = counts.get(node.group, 0) + 1
    return ", ".join(f"{group} x{count}" for group, count in counts.items())


class _Supervisor:
    """Watches the node processes; stops the program, stage by stage, on a crash or a signal.

    A stop SIGTERMs the running nodes of the first stage that has any, waits until they
    ended (SIGKILL after the notice), then goes on with the next stage. A second stop
    signal kills every stage before the first one that `saves_at_stop` (and waits for that
    one as usual); one more, or SIGQUIT, kills everything left.
    """

    def __init__(
        self,
        nodes: list[_Node],
        signals: _StopSignals,
        notice_secs: float,
        launch_id: str,
        report: Callable[[str], None],
        *,
        stages: Callable[[str], int] = lambda group: 0,
        saves_at_stop: frozenset[str] = frozenset(),
        before_stop: Callable[[], None] | None = None,
    ):
        self._running = list(nodes)
        self._before_stop = before_stop
        self._total = len(nodes)
        self._signals = signals
        self._notice_secs = notice_secs
        self._launch_id = launch_id
        self._report = report
        self._stage_of = stages
        self._saves_at_stop = saves_at_stop
        self._failure: NodeExit | None = None
        self._failed_while_stopping: list[NodeExit] = []
        self._unsaved: list[NodeExit] = []
        self._killed_at_notice: list[str] = []
        self._stage_killed: int | None = None
        self._stage_starts: list[float] = []
        self._stop_started: float | None = None
        self._signals_handled = 0
        self._stage: int | None = None
        self._stage_started = 0.0
        self._kill_sent: float | None = None
        self._kill_all = False

    def run(self) -> int:
        while self._running:
            self._reap()
            if not self._running:
                break
            new_signals = self._signals.received[self._signals_handled :]
            self._signals_handled = len(self._signals.received)
            for sig in new_signals:
                self._on_signal(sig)
            if self._stop_started is not None:
                self._advance_stop()
                if (
                    self._kill_sent is not None
                    and time.monotonic() - self._kill_sent > _KILL_WAIT_SECS
                ):
                    self._report(
                        "giving up on processes that survived SIGKILL for "
                        f"{_KILL_WAIT_SECS:.0f} s: {', '.join(n.name for n in self._running)}"
                    )
                    break
            time.sleep(_POLL_SECS)
        return self._finish()

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if sig in _KILL_SIGNALS:
            self._report(f"received {name}: killing the remaining nodes now")
            self._kill(self._running, everything=True)
        elif self._stop_started is None:
            self._begin_stop(f"received {name}")
        elif sig == signal.SIGINT:
            self._hurry()

    def _hurry(self) -> None:
        """A second (or later) Ctrl-C: skip the waiting, except for a node's final save."""
        savers = [n for n in self._running if n.group in self._saves_at_stop]
        if self._kill_all or not savers:
            self._report("asked again to stop: killing the remaining nodes now")
            self._kill(self._running, everything=True)
            return
        save_stage = min(self._stage_of(n.group) for n in savers)
        early = [n for n in self._running if self._stage_of(n.group) < save_stage]
        self._kill_all = True
        names = ", ".join(n.name for n in savers)
        self._report(
            f"asked again to stop: killing the nodes that do not save; waiting up to "
            f"{self._notice_secs:g} s for {names} to write its final checkpoint "
            "(Ctrl-C once more kills it without saving)"
        )
        self._kill(early, everything=False)

    def _reap(self) -> None:
        for node in list(self._running):
            returncode = node.process.poll()
            if returncode is None:
                continue
            self._running.remove(node)
            ended = node.ended(returncode)
            if self._stop_started is not None:
                if returncode > 0:
                    self._failed_while_stopping.append(ended)
                    report = format_exit_report(ended, stopping=True)
                    self._report(report.replace(" died:", " failed at stop:", 1))
                elif returncode < 0 and node.group in self._saves_at_stop:
                    self._unsaved.append(ended)
                continue
            if returncode != 0:
                self._failure = ended
                self._report(format_exit_report(ended))
                self._begin_stop(f"node {ended.name} died")
            else:
                self._report(f"node {ended.name} finished ({ended.status})")

    def _begin_stop(self, reason: str) -> None:
        if self._before_stop is not None:
            with contextlib.suppress(Exception):  # the status view must never block a stop
                self._before_stop()
        self._stop_started = time.monotonic()
        if not self._running:
            return
        order = sorted({self._stage_of(n.group) for n in self._running})
        staged = len(order) > 1
        self._report(
            f"{reason}: stopping {len(self._running)} nodes "
            + (
                f"in {len(order)} stages (each: SIGTERM, SIGKILL after {self._notice_secs:g} s)"
                if staged
                else f"(SIGTERM now, SIGKILL after {self._notice_secs:g} s)"
            )
        )
        self._next_stage()

    def _next_stage(self) -> None:
        stages = [self._stage_of(n.group) for n in self._running]
        if not stages:
            return
        self._stage = min(stages)
        self._stage_started = time.monotonic()
        self._stage_starts.append(self._stage_started)
        for node in self._running:
            if self._stage_of(node.group) == self._stage:
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)

    def _advance_stop(self) -> None:
        in_stage = [n for n in self._running if self._stage_of(n.group) == self._stage]
        if not in_stage:
            self._next_stage()
            return
        if (
            self._kill_sent is None
            and self._stage_killed != self._stage
            and time.monotonic() - self._stage_started >= self._notice_secs
        ):
            # Once per stage: a killed node can take a moment to be reaped.
            self._stage_killed = self._stage
            self._report(
                f"nodes still running after {self._notice_secs:g} s: "
                f"{', '.join(n.name for n in in_stage)}; killing them (a fault: a node "
                "should end by itself within its stop budget; see the end of its log)"
            )
            self._killed_at_notice += [n.name for n in in_stage]
            self._kill(in_stage, everything=False)

    def _kill(self, nodes: list[_Node], *, everything: bool) -> None:
        for node in nodes:
            _kill_tree(node.process)
        if not everything:
            return
        self._kill_sent = time.monotonic()
        # Grandchildren whose node already exited are no longer in any node's tree. The
        # nodes themselves are left to poll(), which keeps their real exit status.
        node_pids = {node.process.pid for node in self._running}
        strays = [
            p
            for p in processes.processes_marked(LAUNCH_ID_VAR, self._launch_id)
            if p.pid not in node_pids
        ]
        killed = processes.kill_processes(strays)
        if killed:
            self._report(f"also killed processes that nodes had left running: {', '.join(killed)}")

    def _finish(self) -> int:
        now = time.monotonic()
        elapsed = (
            ""
            if self._stop_started is None
            else (f" {now - self._stop_started:.1f} s after the stop began")
        )
        if len(self._stage_starts) > 1:
            # Where a stop's time goes: each stage from its SIGTERM to its last node's end.
            ends = [*self._stage_starts[1:], now]
            spans = " + ".join(
                f"{e - s:.1f}" for s, e in zip(self._stage_starts, ends, strict=True)
            )
            elapsed += f" (stages: {spans} s)"
        strays = processes.kill_marked(LAUNCH_ID_VAR, self._launch_id, wait_s=_KILL_WAIT_SECS)
        if strays:
            self._report(
                f"killed {len(strays)} processes that nodes had started and left running: "
                f"{', '.join(strays)}"
            )
        for node in self._unsaved:
            self._report(
                f"node {node.name} was {node.status} before it finished its final save: "
                "what it had not saved is lost; a relaunch resumes from its last checkpoint"
            )
        killed = self._killed_at_notice
        code = 0 if self._failure is None and not self._failed_while_stopping and not killed else 1
        if self._failure is not None:
            cause = f" (node {self._failure.name} died)"
        elif self._failed_while_stopping:
            names = ", ".join(n.name for n in self._failed_while_stopping)
            cause = f" ({names} failed while stopping; see above)"
        elif killed:
            cause = f" ({', '.join(killed)} SIGKILLed after the {self._notice_secs:g} s notice)"
        else:
            cause = ""
        self._report(f"all {self._total} nodes ended{elapsed}; exit code {code}{cause}")
        return code


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILLs a node and every process below it."""
    if process.poll() is not None:
        # Already gone (and reaped: its pid may be reused); the marker sweep finds what
        # it left behind.
        return
    processes.kill_tree(process.pid)
