"""Stopping a program whose nodes run on several hosts: the coordinator is the authority.

On one machine `lp.stop()` SIGTERMs the launcher, which stops every node. Across hosts
there is no launcher, so the coordinator's process serves a stop board on a fixed port
(`serve`), and every other node's process polls it (`StopWatcher`, a thread). The stop's
rules are the one-machine engines' (`magi_lp.launch.stop_machine`: the stages, here the
tiers of `magi_lp.runtime.config.stop_tiers`, the notice, who is told when, when the stop
is over, the outcome and the lines); `StopBoard` feeds that machine what it learns from the
polls and carries out its actions with a board's verbs:
- 'stop these nodes' is the answer to their polls: `stopped(node)` answers True from then on;
- 'kill' is the node's own exit at its notice (`StopWatcher`): a coordinator cannot kill a
  process on another host. A node seen polling past that exit is given up on, named, as
  failed while stopping;
- a node has ended when it says so as its process exits (`left`, `say_left`, with its exit
  code: before the stop, 0 is a node that finished, any other code a death that stops the
  program at once), or when it falls silent: polls are heartbeats. Before the stop, silence for
  `heartbeat_timeout_seconds`, or no poll within `start_timeout_seconds`, is a death, named
  by the board (the engine on its host reports the node's own exit code); during the stop,
  silence for max(3 x poll, 1 s) is a node that has left.
- `lp.stop()` in the coordinator (its step limit) runs `ProgramStopper`, which starts the
  stop and returns once it is over; in any other node it asks the board to stop
  (`request_stop`). The coordinator's own end is fed too (`coordinator_ended`).

A node told to stop gets Launchpad's stop event set (so `lp.wait_for_stop()` returns, as
after a SIGTERM on one machine) and exits by itself; one still running `notice_seconds`
later exits anyway (its exit code 0; the coordinator's outcome names it, a fault as on one
machine).

Pure Python apart from Courier (imported when serving or polling).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

from magi_lp.cluster.job import AddressRef, StopSettings
from magi_lp.launch.exit_report import describe_returncode
from magi_lp.launch.stop_machine import (
    Action,
    Done,
    Event,
    Node,
    NodeEnded,
    StopAsked,
    StopMachine,
    StopWords,
    Tick,
    carry_out,
)

Clock = Callable[[], float]
Report = Callable[[str], None]

_BOARD: StopBoard | None = None  # the board of this process, when it is the coordinator
_THIS_NODE = ""  # this process's node name (set by the node runner)

HOST_WORDS = StopWords(
    stop="stop",
    kill="exit",
    killing="their own notice makes them exit now",
    killed="made to exit",
)
"""The board's verbs in the stop machine's lines."""

_GIVEN_UP = 1  # the code fed for a node the board gives up on (its host's engine has the real one)


class StopBoard:
    """The coordinator's record of who is alive and who has been told to stop: the adapter
    of the stop machine to nodes that poll (see the module's docstring).

    Args:
      tiers: node name -> stop tier, for every node except the coordinator.
      settings: timings.
      on_stop: called once when the stop begins (sets the coordinator's own stop event).
      report: where lines for a person go (the coordinator's log).
      clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        tiers: Mapping[str, int],
        settings: StopSettings,
        *,
        on_stop: Callable[[], None] = lambda: None,
        report: Report = print,
        clock: Clock = time.monotonic,
    ):
        self._tiers = dict(tiers)
        self._settings = settings
        self._on_stop = on_stop
        self._report = report
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._machine = StopMachine(
            [Node(name, tier) for name, tier in self._tiers.items()],
            settings.notice_seconds,
            self._started,
            HOST_WORDS,
        )
        self._last_seen: dict[str, float] = {}
        self._acked: dict[str, float] = {}  # told nodes: their first poll answered True
        self._told: set[str] = set()
        self._why: dict[str, str] = {}  # what the board knows of a node's end
        self._unknown: set[str] = set()
        self._done = threading.Event()
        self._outcome: Done | None = None
        # A node that stopped polling this long ago has left (or died): what tells a node
        # that could not say so (`left`) from one that is still running.
        self._gone_after = max(3 * settings.poll_seconds, 1.0)

    # Called through the control server, from Courier's threads.
    def poll(self, node: str) -> bool:
        """Heartbeat of `node`; True once it should stop."""
        with self._lock:
            now = self._clock()
            stopping = self._machine.stopping
            if node not in self._tiers:
                if node not in self._unknown:
                    self._unknown.add(node)
                    self._report(f"stop board: ignoring polls from unknown node {node!r}")
                return stopping
            self._last_seen[node] = now
            if stopping and (node in self._told or node not in self._machine.running):
                self._acked.setdefault(node, now)
                return True
            return False

    def left(self, node: str, code: int = 0) -> bool:
        """`node` has ended with exit code `code` and leaves now (its process's last call),
        rather than after `_gone_after` of silence."""
        with self._lock:
            if node in self._tiers:
                self._feed(NodeEnded(node, code))
        return True

    def request_stop(self, node: str, reason: str = "") -> bool:
        """A node asks for the program to stop (`lp.stop()` outside the coordinator)."""
        self.begin_stop(f"{node} asked to stop the program{': ' + reason if reason else ''}")
        return True

    def begin_stop(self, reason: str) -> None:
        """Starts the stop (once: later calls change nothing)."""
        with self._lock:
            self._feed(StopAsked(reason))

    def coordinator_ended(self, name: str, code: int) -> None:
        """The coordinator's own node ended with `code`: the stop begins, if it has not, and
        a code other than 0 fails it (named as a node that died)."""
        with self._lock:
            if code:
                self._feed(StopAsked(f"node {name} failed ({describe_returncode(code)})", name))
            else:
                self._feed(StopAsked(f"the coordinator {name} ended"))

    @property
    def stopping(self) -> bool:
        """Whether the stop has begun."""
        return self._machine.stopping

    @property
    def done(self) -> bool:
        """Whether every node has left (or been given up on)."""
        return self._done.is_set()

    @property
    def failed(self) -> bool:
        """Whether the stop is over with an exit code other than 0."""
        return self._outcome is not None and self._outcome.code != 0

    @property
    def cause(self) -> str:
        """Why the exit code is not 0, once the stop is over ('' otherwise)."""
        return "" if self._outcome is None else self._outcome.cause

    def wait_done(self, timeout: float | None = None) -> bool:
        """Blocks until `done`; returns it."""
        return self._done.wait(timeout)

    def check(self) -> None:
        """One look at the heartbeats: time passes for the machine, and the nodes gone
        silent (or polling past their own exit) are reported to it as ended."""
        with self._lock:
            if self._done.is_set():
                return
            self._feed(None)
            now = self._clock()
            if not self._machine.stopping:
                dead = self._dead_node(now)
                if dead:
                    self._feed(NodeEnded(dead, _GIVEN_UP))
                return
            for node in self._machine.running:
                if self._gone(node, now):
                    self._feed(NodeEnded(node, 0))
                elif self._overstayed(node):
                    self._feed(NodeEnded(node, _GIVEN_UP))

    def run_monitor(self, should_end: Callable[[], bool] = lambda: False) -> None:
        """Calls `check()` every poll interval until the stop is done (a thread's body)."""
        while not self._done.is_set() and not should_end():
            self.check()
            self._done.wait(self._settings.poll_seconds)

    # -- the stop machine's verbs (`stop_machine.StopVerbs`), called with the lock held ----
    def say(self, line: str) -> None:
        self._report(line)

    def report_exit(self, name: str, code: int, *, stopping: bool) -> None:
        when = "while the program stopped" if stopping else "before the program was stopped"
        self._report(
            self._why.pop(name, f"node {name} failed ({describe_returncode(code)}) {when}")
        )

    def before_stop(self) -> None:
        self._on_stop()

    def stop_nodes(self, names: tuple[str, ...]) -> None:
        """Their polls answer True from now on."""
        if not self._told:
            self._report(f"stop board: the nodes are told in the order {self._tier_summary()}")
        self._told.update(names)

    def kill_nodes(self, names: tuple[str, ...], *, sweep: bool) -> list[Action]:
        """Nothing to do here: each of them exits by itself at its notice (`StopWatcher`),
        and its silence tells the board (`check`)."""
        del names, sweep
        return []

    # Internals (called with the lock held).
    def _feed(self, event: Event | None) -> None:
        """Time passes for the machine, then `event` (if any); the actions are carried out,
        and the stop ends once every node has."""
        now = self._clock()
        carry_out(self._machine.handle(Tick(now)), self)
        if event is not None:
            carry_out(self._machine.handle(event), self)
        if self._outcome is None and self._machine.stopping and self._machine.over:
            never = sorted(self._told - set(self._acked))
            if never:
                self._report(f"stop board: never acknowledged the stop: {', '.join(never)}")
            self._outcome = self._machine.finish(now)
            for line in self._outcome.lines:
                self._report(line)
            self._done.set()

    def _gone(self, node: str, now: float) -> bool:
        seen = self._last_seen.get(node)
        return seen is None or now - seen > self._gone_after

    def _overstayed(self, node: str) -> bool:
        """Whether `node` polled past its own exit at the notice (its watcher's), which
        ends it at most two polls after the notice counted from its first told poll."""
        acked = self._acked.get(node)
        if acked is None:
            return False
        staying = self._last_seen[node] - acked
        if staying <= self._settings.notice_seconds + 2 * self._settings.poll_seconds:
            return False
        self._why[node] = (
            f"stop board: {node} still running {staying:.0f} s after being told to stop (its "
            "own exit at the notice did not come); going on without it"
        )
        return True

    def _dead_node(self, now: float) -> str:
        """A node silent past the heartbeat timeout, or that never polled within the start
        timeout ('' if none), with what to say of it."""
        for node in self._machine.running:
            seen = self._last_seen.get(node)
            if seen is None:
                if now - self._started > self._settings.start_timeout_seconds:
                    self._why[node] = (
                        f"node {node} has not reached the coordinator "
                        f"{self._settings.start_timeout_seconds:.0f} s after it started"
                    )
                    return node
            elif now - seen > self._settings.heartbeat_timeout_seconds:
                self._why[node] = (
                    f"node {node} stopped answering the coordinator {now - seen:.0f} s ago: "
                    "presumed dead (the engine on its host reports its exit code)"
                )
                return node
        return ""

    def _tier_summary(self) -> str:
        by_tier: dict[int, list[str]] = {}
        for node, tier in self._tiers.items():
            by_tier.setdefault(tier, []).append(node.rpartition("/")[0])
        return " < ".join(", ".join(dict.fromkeys(groups)) for _, groups in sorted(by_tier.items()))


def serve(board: StopBoard, port: int) -> object:
    """Starts the Courier server of the stop board on `port`; returns it (call `Stop()`)."""
    import courier

    server = courier.Server(port=port)
    server.Bind("stopped", board.poll)
    server.Bind("request_stop", board.request_stop)
    server.Bind("left", board.left)
    server.Start()
    return server


def install(board: StopBoard | None, node: str) -> None:
    """Records this process's node name and, in the coordinator, its board."""
    global _BOARD, _THIS_NODE
    _BOARD = board
    _THIS_NODE = node


@dataclasses.dataclass(frozen=True)
class ProgramStopper:
    """What `lp.stop()` does in a node of a multi-host program (pickled with every node)."""

    control: AddressRef
    port: int

    def __call__(self) -> None:
        if _BOARD is not None:
            _BOARD.begin_stop(f"lp.stop() in {_THIS_NODE or 'the coordinator'}")
            _BOARD.wait_done()
            return
        import courier

        client = courier.Client(self.control.resolve(self.port), call_timeout=30.0)
        client.request_stop(_THIS_NODE, "lp.stop()")


def say_left(address: str, node: str, code: int, timeout_s: float = 2.0) -> None:
    """Tells the board at `address` that `node` leaves now with exit code `code` (best
    effort: a board that does not answer learns it from the node's silence)."""
    try:
        import courier

        courier.Client(address, call_timeout=timeout_s).left(node, int(code))
    except Exception:  # the silence says it anyway
        pass


@dataclasses.dataclass
class StopWatcher:
    """A node's thread that polls the stop board and stops the node when told.

    Attributes:
      node: this node's name.
      address: "host:port" of the stop board.
      settings: timings.
      stop_event: Launchpad's stop event of this process (set when told to stop).
      report: where lines go (the node's log).
      exit: how to leave when the node overstays the notice (os._exit in a node).
      clock: monotonic seconds.
      told_at: when the board (or its silence) told this node to stop.
    """

    node: str
    address: str
    settings: StopSettings
    stop_event: threading.Event
    _: dataclasses.KW_ONLY
    report: Report = print
    exit: Callable[[int], None] = os._exit
    clock: Clock = time.monotonic
    told_at: float | None = dataclasses.field(default=None, init=False)

    def start(self) -> threading.Thread:
        """Runs the watcher on a daemon thread."""
        thread = threading.Thread(target=self.run, name="magi_lp-stop-watcher", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Polls until the process ends (or it ends the process)."""
        import courier

        settings = self.settings
        client = courier.Client(self.address, call_timeout=max(2.0, 4 * settings.poll_seconds))
        started = last_ok = self.clock()
        reached = False
        while True:
            try:
                stop = bool(client.stopped(self.node))
                last_ok, reached = self.clock(), True
            except Exception as error:  # an unreachable board: counted below
                stop = False
                silent = self.clock() - (last_ok if reached else started)
                limit = (
                    settings.heartbeat_timeout_seconds
                    if reached
                    else settings.start_timeout_seconds
                )
                if self.told_at is None and silent > limit:
                    self.report(
                        f"node {self.node}: no answer from the coordinator at {self.address} "
                        f"for {silent:.0f} s ({type(error).__name__}); stopping this node"
                    )
                    stop = True
            now = self.clock()
            if stop and self.told_at is None:
                self.told_at = now
                self.stop_event.set()
            if self.told_at is not None and now - self.told_at > settings.notice_seconds:
                self.report(
                    f"node {self.node}: still running {settings.notice_seconds:g} s after the "
                    "stop; exiting"
                )
                sys.stdout.flush()
                sys.stderr.flush()
                self.exit(0)
                return
            time.sleep(settings.poll_seconds)
