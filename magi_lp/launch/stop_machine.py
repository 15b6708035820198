"""The tiered stop of a program, every engine's, as a pure state machine.

Every engine stops its nodes by the same rules; only the verbs differ (SIGTERM and a
process tree's SIGKILL on Launchpad, an actor's `stop()` and `ray.kill` on Ray; on several
hosts the coordinator's stop board, `magi_lp.cluster.stop_board`, tells a node through its
poll and the node exits by itself at its notice). So the rules live here, with no process,
signal handler or clock of their own: an engine feeds `StopMachine.handle` what happened
(`Tick`, `StopSignal`, `NodeEnded`, `StopAsked`, `Fault`) and carries out what it answers
(`StopBegun`, `StopNodes`, `KillNodes`, `Say`, `ReportExit`) with its verbs (`carry_out`,
`StopVerbs`; `StopWords` names them in the lines), then reads the end from `finish` (`Done`).

The rules:
- a stop (a stop signal, the program's request, a node that died) tells the nodes in stages,
  lowest first: a stage is told once every node of the earlier ones has ended, and its nodes
  still running `notice_secs` after it was told are killed and named once, a fault;
- a second SIGINT hurries it: the nodes of the stages before the first saving node's are
  killed, the savers keep their notice; one more SIGINT, or SIGQUIT at any time, kills every
  node left, and a saver among them has lost its final save (exit code 1);
- before a stop, a node that ends by itself with 0 is reported as finished (the program
  goes on); with any other code it died: named, and the program stops;
- while stopping, a node that leaves with a positive code failed at its stop, and a saving
  node SIGKILLed by someone else lost its final save: both fail the stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
from collections.abc import Sequence
from typing import Protocol

from magi_lp.launch.exit_report import describe_returncode

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that start a stop in stages (a second SIGINT hurries it)."""
KILL_SIGNALS = (signal.SIGQUIT,)
"""Signals that kill every node at once."""


@dataclasses.dataclass(frozen=True)
class Node:
    """One node as the stop sees it: its name in reports, its stage, whether it saves."""

    name: str
    stage: int = 0
    saves: bool = False  # writes something at its stop (the learner's final save)


@dataclasses.dataclass(frozen=True)
class StopWords:
    """What the engine's verbs are called in its lines: `stop` and `kill` in the stop's first
    line, `killing` what befalls the nodes past their notice, `killed` in the outcome."""

    stop: str = "SIGTERM"
    kill: str = "SIGKILL"
    killing: str = "killing them"
    killed: str = "SIGKILLed"


# Events: what happened.


@dataclasses.dataclass(frozen=True)
class Tick:
    """Time passed: `now` is the monotonic clock. Feed one before the other events of a poll."""

    now: float


@dataclasses.dataclass(frozen=True)
class StopSignal:
    """A signal reached the engine; `asked` is why the program asked for it, where it did
    (a SIGTERM from `lp.stop()`)."""

    signum: int
    asked: str | None = None


@dataclasses.dataclass(frozen=True)
class NodeEnded:
    """A node ended: `code` is its exit code, or minus the signal that killed it."""

    name: str
    code: int


@dataclasses.dataclass(frozen=True)
class StopAsked:
    """The program asked for a stop (the step limit), or the engine did: `died` names a node
    that died out of the machine's sight (one whose start failed), the outcome's cause."""

    reason: str
    died: str | None = None


@dataclasses.dataclass(frozen=True)
class Fault:
    """The program cannot go on (Ray's daemon died): it stops, and exits 1 with this cause
    whatever else happened. A later fault replaces an earlier one. `reason`: what the stop's
    first line says, where it says more than the cause."""

    cause: str
    reason: str | None = None


Event = Tick | StopSignal | NodeEnded | StopAsked | Fault


# Actions: what the engine does, in order.


@dataclasses.dataclass(frozen=True)
class StopBegun:
    """The stop begins: the last look at the program while its nodes still answer."""

    reason: str


@dataclasses.dataclass(frozen=True)
class StopNodes:
    """Ask these nodes to stop (SIGTERM, an actor's `stop()`)."""

    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class KillNodes:
    """Kill these nodes now; `sweep`: also what nodes started and left running."""

    names: tuple[str, ...]
    sweep: bool = False


@dataclasses.dataclass(frozen=True)
class Say:
    """A line for the user."""

    line: str


@dataclasses.dataclass(frozen=True)
class ReportExit:
    """Report how a node ended, with its log's last lines: it died (`stopping` False) or
    failed at its stop."""

    name: str
    code: int
    stopping: bool


@dataclasses.dataclass(frozen=True)
class Done:
    """The program ended: the closing lines (the last says the exit code), the code and,
    where it is not 0, why (`cause`: what the last line says in brackets)."""

    code: int
    lines: tuple[str, ...]
    cause: str = ""


Action = StopBegun | StopNodes | KillNodes | Say | ReportExit


class StopVerbs(Protocol):
    """An engine's verbs for the machine's actions (`carry_out` calls them)."""

    def say(self, line: str) -> None:
        """Tells the user `line` (`Say`)."""

    def report_exit(self, name: str, code: int, *, stopping: bool) -> None:
        """Reports how node `name` ended, with its log's last lines (`ReportExit`)."""

    def before_stop(self) -> None:
        """The last look at the program while its nodes still answer (`StopBegun`)."""

    def stop_nodes(self, names: tuple[str, ...]) -> None:
        """Asks these nodes to stop (`StopNodes`)."""

    def kill_nodes(self, names: tuple[str, ...], *, sweep: bool) -> list[Action]:
        """Kills these nodes (`KillNodes`); returns what follows from their ends where the
        engine knows them at once (the machine's answer to each `NodeEnded`), else []."""


def carry_out(actions: Sequence[Action], verbs: StopVerbs) -> None:
    """Carries out `actions` in order with an engine's verbs, and after them what its kills
    led to."""
    pending = list(actions)
    while pending:
        action = pending.pop(0)
        if isinstance(action, Say):
            verbs.say(action.line)
        elif isinstance(action, ReportExit):
            verbs.report_exit(action.name, action.code, stopping=action.stopping)
        elif isinstance(action, StopBegun):
            with contextlib.suppress(Exception):  # the status view must never block
                verbs.before_stop()
        elif isinstance(action, StopNodes):
            verbs.stop_nodes(action.names)
        elif isinstance(action, KillNodes):
            pending += verbs.kill_nodes(action.names, sweep=action.sweep)


def stop_outcome(
    died: str | None,
    failed: Sequence[str],
    killed: Sequence[str],
    notice_secs: float,
    killed_word: str = "SIGKILLed",
) -> tuple[int, str]:
    """A stopped program's exit code and, for its last line, why it is not 0: a node died
    first (`died`), nodes failed while stopping, or nodes were killed at the notice (what
    befell them: `killed_word`)."""
    code = 0 if died is None and not failed and not killed else 1
    if died is not None:
        return code, f" (node {died} died)"
    if failed:
        return code, f" ({', '.join(failed)} failed while stopping; see above)"
    if killed:
        return code, f" ({', '.join(killed)} {killed_word} after the {notice_secs:g} s notice)"
    return code, ""


class StopMachine:
    """The stop in stages of `nodes`, driven by events (see the module's docstring)."""

    def __init__(
        self,
        nodes: Sequence[Node],
        notice_secs: float,
        now: float,
        words: StopWords = StopWords(),
    ):
        self._nodes = {node.name: node for node in nodes}
        self._running = [node.name for node in nodes]
        self._notice = notice_secs
        self._words = words
        self._now = now
        self._stop_started: float | None = None
        self._stage: int | None = None  # the stage told last
        self._stage_starts: list[float] = []
        self._notice_spent: int | None = None  # the stage whose notice kill was sent
        self._hurried = False  # a second SIGINT killed the nodes that do not save
        self._killed_all = False
        self._killed: set[str] = set()  # the nodes this stop killed
        self._died: str | None = None
        self._fault: str | None = None
        self._failed: list[str] = []  # left with a positive code while stopping
        self._lost: list[str] = []  # savers killed before their final save
        self._killed_at_notice: list[str] = []
        self._unsaved: list[tuple[str, int]] = []  # savers that ended by a signal

    @property
    def running(self) -> tuple[str, ...]:
        return tuple(self._running)

    @property
    def stopping(self) -> bool:
        return self._stop_started is not None

    @property
    def over(self) -> bool:
        """Whether every node ended."""
        return not self._running

    def handle(self, event: Event) -> list[Action]:
        """What to do about `event`."""
        if isinstance(event, Tick):
            self._now = event.now
            return self._on_tick()
        if isinstance(event, NodeEnded):
            return self._on_ended(event.name, event.code)
        if isinstance(event, StopSignal):
            return self._on_signal(event.signum, event.asked)
        if isinstance(event, StopAsked):
            if event.died is not None and self._died is None:
                self._died = event.died
            return [] if self.stopping else self._begin(event.reason)
        if isinstance(event, Fault):
            self._fault = event.cause
            return [] if self.stopping else self._begin(event.reason or event.cause)
        raise TypeError(f"not a stop event: {event!r}")

    def _on_signal(self, signum: int, asked: str | None) -> list[Action]:
        name = signal.Signals(signum).name
        if signum in KILL_SIGNALS:
            actions = self._kill_all(f"received {name}")
            if not self.stopping:
                self._stop_started = self._now
                actions.append(StopBegun(f"received {name}"))
            return actions
        if not self.stopping:
            # lp.stop() from a node is a SIGTERM too: the node may have said why.
            return self._begin((asked if signum == signal.SIGTERM else None) or f"received {name}")
        if signum == signal.SIGINT:
            return self._hurry()
        return []

    def _on_ended(self, name: str, code: int) -> list[Action]:
        if name not in self._running:
            return []
        self._running.remove(name)
        if not self.stopping:
            if code == 0:
                return [Say(f"node {name} finished ({describe_returncode(code)})")]
            self._died = name
            return [ReportExit(name, code, stopping=False), *self._begin(f"node {name} died")]
        actions: list[Action] = []
        if code > 0:
            self._failed.append(name)
            actions.append(ReportExit(name, code, stopping=True))
        elif code < 0 and self._nodes[name].saves:
            self._unsaved.append((name, code))
            # SIGKILLed by someone else (not at the notice, nor by a kill asked for): what it
            # had not saved is lost, a fault of the stop as a failure is.
            if code == -signal.SIGKILL and name not in self._killed:
                self._lost.append(name)
        return actions + self._advance()

    def _on_tick(self) -> list[Action]:
        if not self.stopping or self._killed_all or self._stage is None:
            return []
        in_stage = [n for n in self._running if self._nodes[n].stage == self._stage]
        if not in_stage:
            return self._advance()
        if self._notice_spent == self._stage or self._now - self._stage_starts[-1] < self._notice:
            return []
        # Once a stage: a killed node can take a moment to be seen ended.
        self._notice_spent = self._stage
        self._killed_at_notice += in_stage
        self._killed.update(in_stage)
        return [
            Say(
                f"nodes still running after {self._notice:g} s: {', '.join(in_stage)}; "
                f"{self._words.killing} (a fault: a node should end by itself; see the end of "
                "its log)"
            ),
            KillNodes(tuple(in_stage)),
        ]

    def _begin(self, reason: str) -> list[Action]:
        self._stop_started = self._now
        actions: list[Action] = [StopBegun(reason)]
        if not self._running:
            return actions
        stages = {self._nodes[n].stage for n in self._running}
        notice, words = f"{self._notice:g} s", self._words
        how = (
            f"in {len(stages)} stages (each: {words.stop}, {words.kill} after {notice})"
            if len(stages) > 1
            else f"({words.stop} now, {words.kill} after {notice})"
        )
        actions.append(Say(f"{reason}: stopping {len(self._running)} nodes {how}"))
        return actions + self._advance()

    def _advance(self) -> list[Action]:
        """Tells the next stage once the one told last has ended."""
        if not self.stopping or self._killed_all or not self._running:
            return []
        if any(self._nodes[n].stage == self._stage for n in self._running):
            return []
        self._stage = min(self._nodes[n].stage for n in self._running)
        self._stage_starts.append(self._now)
        return [StopNodes(tuple(n for n in self._running if self._nodes[n].stage == self._stage))]

    def _hurry(self) -> list[Action]:
        """A second (or later) SIGINT: skip the waiting, except for a node's final save."""
        savers = [n for n in self._running if self._nodes[n].saves]
        if self._hurried or self._killed_all or not savers:
            return self._kill_all("asked again to stop")
        self._hurried = True
        first = min(self._nodes[n].stage for n in savers)
        early = [n for n in self._running if self._nodes[n].stage < first]
        self._killed.update(early)
        actions: list[Action] = [
            Say(
                "asked again to stop: killing the nodes that do not save; waiting up to "
                f"{self._notice:g} s for {', '.join(savers)} to write its final checkpoint "
                "(Ctrl-C once more kills it without saving)"
            )
        ]
        return actions + ([KillNodes(tuple(early))] if early else [])

    def _kill_all(self, why: str) -> list[Action]:
        self._killed_all = True
        names = list(self._running)
        self._killed.update(names)
        savers = [n for n in names if self._nodes[n].saves]
        self._lost += [n for n in savers if n not in self._lost]
        lost = f" ({', '.join(savers)}: its final save is lost)" if savers else ""
        return [Say(f"{why}: killing the remaining nodes now{lost}"), KillNodes(tuple(names), True)]

    def finish(self, now: float) -> Done:
        """The end: what to say last and the exit code (also with nodes left running, when
        the engine gave up on them)."""
        elapsed = ""
        if self._stop_started is not None:
            elapsed = f" {now - self._stop_started:.1f} s after the stop began"
        if len(self._stage_starts) > 1:
            # Where a stop's time goes: each stage from its stop to its last node's end.
            starts = self._stage_starts
            ends = [*starts[1:], now]
            spans = " + ".join(f"{e - s:.1f}" for s, e in zip(starts, ends, strict=True))
            elapsed += f" (stages: {spans} s)"
        lines = [
            f"node {name} was {describe_returncode(code)} before it finished its final save: "
            "what it had not saved is lost; a relaunch resumes from its last checkpoint"
            for name, code in self._unsaved
        ]
        code, cause = stop_outcome(
            self._died,
            self._failed + self._lost,
            self._killed_at_notice,
            self._notice,
            self._words.killed,
        )
        if self._fault is not None:
            code, cause = 1, f" ({self._fault})"
        lines.append(f"all {len(self._nodes)} nodes ended{elapsed}; exit code {code}{cause}")
        return Done(code, tuple(lines), cause.strip().removeprefix("(").removesuffix(")"))
