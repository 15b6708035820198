"""Supervising a local launch: the node processes, stop signals, and the stop in stages.

`Supervisor.run()` watches the nodes until the program ends: a node that dies is reported
(`magi_lp.launch.exit_report`) and stops the rest; SIGINT / SIGTERM / SIGHUP to the launcher
(`StopSignals`) start a stop in stages (each: SIGTERM, SIGKILL only after the notice, which
is reported as a fault); a second Ctrl-C hurries it, except for a node's final save. The
rules are `magi_lp.launch.stop_machine`'s, shared with the Ray engine; this module polls the
processes and carries out what it decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from magi_lp.launch import interrupts, node_lifetime, processes
from magi_lp.launch.exit_report import NodeExit, format_exit_report
from magi_lp.launch.launchpad_seam import active_workers
from magi_lp.launch.stop_machine import (
    KILL_SIGNALS,
    STOP_SIGNALS,
    Action,
    Node,
    NodeEnded,
    StopMachine,
    StopSignal,
    Tick,
    carry_out,
)

LAUNCH_ID_VAR = "MAGI_LP_LAUNCH_ID"
"""Environment variable that marks every process started for one launch."""

_POLL_SECS = 0.1
# After SIGKILL a process should be gone at once; one stuck in uninterruptible sleep is
# reported instead of hanging the launcher forever.
KILL_WAIT_SECS = 10.0


def node_stop_secs(notice_secs: float) -> float:
    """Each node's own stop budget (MAGI_LP_NODE_STOP_SECS, `node_lifetime.watch_for_stop`):
    1 s, or half the launcher's notice when that is shorter, so that a node blocked in C++
    leaves by itself well before the launcher's SIGKILL."""
    return min(node_lifetime.DEFAULT_STOP_SECS, notice_secs / 2)


def stage_of(stop_stages: Sequence[Collection[str]]) -> Callable[[str], int]:
    """Group label -> stop stage: groups named in no stage stop first (stage 0)."""
    where = {}
    for number, groups in enumerate(stop_stages, start=1):
        for group in groups:
            where.setdefault(group, number)
    return lambda group: where.get(group, 0)


class StopSignals:
    """Records stop / kill signals sent to the launcher; the supervisor acts on them.

    A signal the launcher inherited as ignored (e.g. SIGHUP under nohup) stays ignored.
    """

    def __init__(self):
        self.received: list[int] = []
        self._last_at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Installs (or re-installs, after Launchpad replaced them) the handlers."""
        for sig in STOP_SIGNALS + KILL_SIGNALS:
            if sig not in self._previous:
                self._previous[sig] = signal.getsignal(sig)
            ignored = self._previous[sig] == signal.SIG_IGN
            signal.signal(sig, signal.SIG_IGN if ignored else self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        del frame
        now = time.monotonic()
        echo = now - self._last_at < interrupts.ECHO_SECS
        if self.received and self.received[-1] == signum and echo:
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


@dataclasses.dataclass
class NodeProcess:
    """One node process of the launch, as the supervisor tracks it."""

    group: str
    index: int
    process: subprocess.Popen
    log_path: Path

    @property
    def name(self) -> str:
        return f"{self.group}/{self.index}"

    def ended(self, returncode: int) -> NodeExit:
        return NodeExit(self.group, self.index, self.process.pid, returncode, self.log_path)


def node_processes(manager: Any, log_dir: Path) -> list[NodeProcess]:
    """The node processes Launchpad's WorkerManager started, by its `group/index` titles."""
    nodes = []
    for title, popens in active_workers(manager).items():
        group, _, index = title.rpartition("/")
        nodes.extend(NodeProcess(group, int(index), p, log_dir / title) for p in popens)
    return nodes


def count_by_group(nodes: list[NodeProcess]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.group] = counts.get(node.group, 0) + 1
    return ", ".join(f"{group} x{count}" for group, count in counts.items())


class Supervisor:
    """Watches the node processes and carries out the stop in stages (`StopMachine`: its
    rules) with Launchpad's verbs: SIGTERM to a node, SIGKILL to its process tree, and a
    sweep of what the launch's processes left running (`LAUNCH_ID_VAR`)."""

    def __init__(
        self,
        nodes: list[NodeProcess],
        signals: StopSignals,
        notice_secs: float,
        launch_id: str,
        report: Callable[[str], None],
        *,
        stages: Callable[[str], int] = lambda group: 0,
        saves_at_stop: frozenset[str] = frozenset(),
        before_stop: Callable[[], None] | None = None,
        requested_stop: Callable[[], str | None] = lambda: None,
    ):
        self._nodes = {node.name: node for node in nodes}
        self._running = list(nodes)
        self._requested_stop = requested_stop
        self._before_stop = before_stop
        self._signals = signals
        self._launch_id = launch_id
        self._report = report
        self._signals_handled = 0
        self._kill_sent: float | None = None  # when every node was killed
        self._machine = StopMachine(
            [Node(n.name, stages(n.group), n.group in saves_at_stop) for n in nodes],
            notice_secs,
            time.monotonic(),
        )

    def run(self) -> int:
        machine = self._machine
        while not machine.over:
            carry_out(machine.handle(Tick(time.monotonic())), self)
            for node in list(self._running):
                returncode = node.process.poll()
                if returncode is not None:
                    self._running.remove(node)
                    carry_out(machine.handle(NodeEnded(node.name, returncode)), self)
            if machine.over:
                break
            new_signals = self._signals.received[self._signals_handled :]
            self._signals_handled = len(self._signals.received)
            for sig in new_signals:
                asked = None
                if sig == signal.SIGTERM and not machine.stopping:
                    asked = self._requested_stop()  # lp.stop() from a node: it said why
                carry_out(machine.handle(StopSignal(sig, asked)), self)
            if self._kill_sent is not None and time.monotonic() - self._kill_sent > KILL_WAIT_SECS:
                self._report(
                    "giving up on processes that survived SIGKILL for "
                    f"{KILL_WAIT_SECS:.0f} s: {', '.join(n.name for n in self._running)}"
                )
                break
            time.sleep(_POLL_SECS)
        return self._finish()

    # -- the stop machine's verbs (`stop_machine.StopVerbs`) -----------------------------
    def say(self, line: str) -> None:
        self._report(line)

    def report_exit(self, name: str, code: int, *, stopping: bool) -> None:
        self._report(describe_node_end(self._nodes[name].ended(code), stopping=stopping))

    def before_stop(self) -> None:
        if self._before_stop is not None:
            self._before_stop()

    def stop_nodes(self, names: tuple[str, ...]) -> None:
        for name in names:
            with contextlib.suppress(ProcessLookupError):
                self._nodes[name].process.send_signal(signal.SIGTERM)

    def kill_nodes(self, names: tuple[str, ...], *, sweep: bool) -> list[Action]:
        """Kills the nodes' process trees (`sweep`: and the strays); `run` polls their ends."""
        for name in names:
            _kill_tree(self._nodes[name].process)
        if sweep:
            self._sweep()
        return []

    def _sweep(self) -> None:
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
        done = self._machine.finish(time.monotonic())
        strays = processes.kill_marked(LAUNCH_ID_VAR, self._launch_id, wait_s=KILL_WAIT_SECS)
        if strays:
            self._report(
                f"killed {len(strays)} processes that nodes had started and left running: "
                f"{', '.join(strays)}"
            )
        for line in done.lines:
            self._report(line)
        return done.code


def describe_node_end(ended: NodeExit, *, stopping: bool) -> str:
    """The report on a node that died, or (`stopping`) that failed at its stop: which node,
    how, why, and its log's last lines (`format_exit_report`)."""
    report = format_exit_report(ended, stopping=stopping)
    return report.replace(" died:", " failed at stop:", 1) if stopping else report


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILLs a node and every process below it."""
    if process.poll() is not None:
        # Already gone (and reaped: its pid may be reused); the marker sweep finds what
        # it left behind.
        return
    processes.kill_tree(process.pid)
