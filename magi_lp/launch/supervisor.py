"""Supervising a local launch: the node processes, stop signals, and the stop in stages.

`Supervisor.run()` watches the nodes until the program ends: a node that dies is reported
(`magi_lp.launch.exit_report`) and stops the rest; SIGINT / SIGTERM / SIGHUP to the launcher
(`StopSignals`) start a stop in stages (each: SIGTERM, SIGKILL only after the notice, which
is reported as a fault); a second Ctrl-C hurries it, except for a node's final save.
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

LAUNCH_ID_VAR = "MAGI_LP_LAUNCH_ID"
"""Environment variable that marks every process started for one launch."""

_POLL_SECS = 0.1
# After SIGKILL a process should be gone at once; one stuck in uninterruptible sleep is
# reported instead of hanging the launcher forever.
KILL_WAIT_SECS = 10.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KILL_SIGNALS = (signal.SIGQUIT,)


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
        for sig in _STOP_SIGNALS + _KILL_SIGNALS:
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
    """Watches the node processes; stops the program, stage by stage, on a crash or a signal.

    A stop SIGTERMs the running nodes of the first stage that has any, waits until they
    ended (SIGKILL after the notice), then goes on with the next stage. A second stop
    signal kills every stage before the first one that `saves_at_stop` (and waits for that
    one as usual); one more, or SIGQUIT, kills everything left.
    """

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
        self._running = list(nodes)
        self._requested_stop = requested_stop
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
        self._sigkilled: set[str] = set()  # the nodes this supervisor sent SIGKILL
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
                    and time.monotonic() - self._kill_sent > KILL_WAIT_SECS
                ):
                    self._report(
                        "giving up on processes that survived SIGKILL for "
                        f"{KILL_WAIT_SECS:.0f} s: {', '.join(n.name for n in self._running)}"
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
            # lp.stop() from a node is a SIGTERM too: the node may have said why.
            asked = self._requested_stop() if sig == signal.SIGTERM else None
            self._begin_stop(asked or f"received {name}")
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

    def _kill(self, nodes: list[NodeProcess], *, everything: bool) -> None:
        for node in nodes:
            self._sigkilled.add(node.name)
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
        strays = processes.kill_marked(LAUNCH_ID_VAR, self._launch_id, wait_s=KILL_WAIT_SECS)
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
        # A saving node SIGKILLed by someone else (not at the notice, nor by a Ctrl-C that
        # asked for it) lost what it had not saved: a fault of the stop, as a failure is.
        lost_save = [
            n.name
            for n in self._unsaved
            if n.returncode == -signal.SIGKILL and n.name not in self._sigkilled
        ]
        code, cause = stop_outcome(
            None if self._failure is None else self._failure.name,
            [n.name for n in self._failed_while_stopping] + lost_save,
            self._killed_at_notice,
            self._notice_secs,
        )
        self._report(f"all {self._total} nodes ended{elapsed}; exit code {code}{cause}")
        return code


def stop_outcome(
    died: str | None, failed: Sequence[str], killed: Sequence[str], notice_secs: float
) -> tuple[int, str]:
    """A stopped program's exit code and, for its last line, why it is not 0: a node died
    first (`died`), nodes failed while stopping, or nodes were killed at the notice. The one
    rule of every engine's supervisor."""
    code = 0 if died is None and not failed and not killed else 1
    if died is not None:
        return code, f" (node {died} died)"
    if failed:
        return code, f" ({', '.join(failed)} failed while stopping; see above)"
    if killed:
        return code, f" ({', '.join(killed)} SIGKILLed after the {notice_secs:g} s notice)"
    return code, ""


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILLs a node and every process below it."""
    if process.poll() is not None:
        # Already gone (and reaped: its pid may be reused); the marker sweep finds what
        # it left behind.
        return
    processes.kill_tree(process.pid)
