"""Stopping a program whose nodes run on several hosts: the coordinator is the authority.

On one machine `lp.stop()` SIGTERMs the launcher, which stops every node. Across hosts
there is no launcher, so the coordinator's process serves a stop board on a fixed port
(`serve`), and every other node's process polls it (`StopWatcher`, a thread):
- `stopped(node)` answers whether that node should stop now. Polls are also heartbeats:
  a node silent for `heartbeat_timeout_seconds` is reported by name as presumed dead and
  the program is stopped (the coordinator then exits 1); a node that never polls within
  `start_timeout_seconds` is reported too.
- Nodes are told in tiers, so that nobody is left calling a server that is gone
  (`magi_lp.runtime.config.stop_tiers`): actors and evaluators first, while the learner
  still samples and serves; then the learner, which saves a final checkpoint while replay
  and counter still answer; then replay and counter. A tier is told once every node of the
  earlier tiers has left (stopped polling), or after the notice time has passed.
- `lp.stop()` in the coordinator (its step limit) runs `ProgramStopper`, which starts the
  stop and returns once every node has left; in any other node it asks the board to stop.
- A node whose work has ended says so (`left`, `say_left`) before its process exits, so the
  next tier is told at once; silence (a killed node) counts after max(3 x poll, 1 s). One
  that ends before the stop (its exception) stops the program at once, named with its code.

A node told to stop gets Launchpad's stop event set (so `lp.wait_for_stop()` returns, as
after a SIGTERM on one machine) and exits by itself; one still running `notice_seconds`
later exits anyway (exit code 0: the stop was asked for, and the learner has saved).

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

Clock = Callable[[], float]
Report = Callable[[str], None]

_BOARD: StopBoard | None = None  # the board of this process, when it is the coordinator
_THIS_NODE = ""  # this process's node name (set by the node runner)


class StopBoard:
    """The coordinator's record of who is alive and who has been told to stop.

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
        self._last_seen: dict[str, float] = {}
        self._acked: dict[str, float] = {}
        self._left: set[str] = set()  # nodes that said they leave (`left`)
        self._unknown: set[str] = set()
        self._stop_started: float | None = None
        self._released = -1
        self._released_at = 0.0
        self._done = threading.Event()
        self.failed = False
        self.reason = ""
        # A node that stopped polling this long ago has left (or died): what tells a node
        # that could not say so (`left`) from one that is still running.
        self._gone_after = max(3 * settings.poll_seconds, 1.0)

    # Called through the control server, from Courier's threads.
    def poll(self, node: str) -> bool:
        """Heartbeat of `node`; True once it should stop."""
        with self._lock:
            now = self._clock()
            if node not in self._tiers:
                if node not in self._unknown:
                    self._unknown.add(node)
                    self._report(f"stop board: ignoring polls from unknown node {node!r}")
                return self._stop_started is not None
            self._last_seen[node] = now
            if self._stop_started is not None and self._tiers[node] <= self._released:
                self._acked.setdefault(node, now)
                return True
            return False

    def left(self, node: str, code: int = 0) -> bool:
        """`node` has ended with exit code `code` and leaves now (its process's last call):
        its tier's wait for it ends at once instead of after `_gone_after` of silence. A
        node that ends before the stop (it failed, or returned when it should not have)
        stops the program as failed at once, named with its code, instead of being presumed
        dead `heartbeat_timeout_seconds` later."""
        with self._lock:
            if node not in self._tiers:
                return True
            self._left.add(node)
            self._last_seen.setdefault(node, self._clock())
            early = self._stop_started is None
        if early:
            how = f"failed (exit code {code})" if code else "ended (exit code 0)"
            self.begin_stop(f"node {node} {how} before the program was stopped", failed=True)
        return True

    def request_stop(self, node: str, reason: str = "") -> bool:
        """A node asks for the program to stop (`lp.stop()` outside the coordinator)."""
        self.begin_stop(f"{node} asked to stop the program{': ' + reason if reason else ''}")
        return True

    def begin_stop(self, reason: str, *, failed: bool = False) -> None:
        """Starts telling nodes to stop (once; later calls only add a failure)."""
        with self._lock:
            if self._stop_started is not None:
                self.failed = self.failed or failed
                return
            self._stop_started = self._clock()
            self.failed = failed
            self.reason = reason
            self._release_next(self._stop_started)
        self._report(
            f"stopping the program ({reason}): {len(self._tiers)} nodes, told in the order "
            f"{self._tier_summary()}"
        )
        self._on_stop()

    @property
    def stopping(self) -> bool:
        """Whether the stop has begun."""
        return self._stop_started is not None

    @property
    def done(self) -> bool:
        """Whether every node has left (or the stop gave up waiting for them)."""
        return self._done.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Blocks until `done`; returns it."""
        return self._done.wait(timeout)

    def check(self) -> None:
        """One look at the heartbeats: detects dead nodes, or moves the stop along."""
        now = self._clock()
        if self._stop_started is None:
            dead = self._dead_node(now)
            if dead:
                self.begin_stop(dead, failed=True)
            return
        with self._lock:
            if self._done.is_set():
                return
            patience = self._settings.notice_seconds + self._gone_after
            while self._released < self._max_tier:
                told = [n for n, t in self._tiers.items() if t <= self._released]
                staying = [n for n in told if not self._gone(n, now)]
                if staying and now - self._released_at < patience:
                    break
                if staying:
                    self._report(
                        f"stop board: {', '.join(staying)} still running {patience:.0f} s after "
                        "being told to stop; telling the next nodes anyway"
                    )
                self._release_next(now)
            if self._released < self._max_tier:
                return
            staying = [n for n in self._tiers if not self._gone(n, now)]
            elapsed = now - self._stop_started
            if staying and now - self._released_at < patience:
                return
            if staying:
                self._report(
                    f"stop board: {', '.join(staying)} did not leave; giving up waiting "
                    f"{elapsed:.1f} s after the stop began"
                )
            never = [n for n in self._tiers if n not in self._acked]
            if never:
                self._report(f"stop board: never acknowledged the stop: {', '.join(never)}")
            self._report(f"all {len(self._tiers)} other nodes left {elapsed:.1f} s after the stop")
            self._done.set()

    def run_monitor(self, should_end: Callable[[], bool] = lambda: False) -> None:
        """Calls `check()` every poll interval until the stop is done (a thread's body)."""
        while not self._done.is_set() and not should_end():
            self.check()
            self._done.wait(self._settings.poll_seconds)

    # Internals (called with the lock held where they touch state).
    @property
    def _max_tier(self) -> int:
        return max(self._tiers.values(), default=0)

    def _release_next(self, now: float) -> None:
        pending = sorted({t for t in self._tiers.values() if t > self._released})
        self._released = pending[0] if pending else self._max_tier
        self._released_at = now

    def _gone(self, node: str, now: float) -> bool:
        if node in self._left:
            return True
        seen = self._last_seen.get(node)
        return seen is None or now - seen > self._gone_after

    def _dead_node(self, now: float) -> str:
        with self._lock:
            for node in self._tiers:
                seen = self._last_seen.get(node)
                if seen is None:
                    if now - self._started > self._settings.start_timeout_seconds:
                        return (
                            f"node {node} has not reached the coordinator "
                            f"{self._settings.start_timeout_seconds:.0f} s after it started"
                        )
                elif now - seen > self._settings.heartbeat_timeout_seconds:
                    return (
                        f"node {node} stopped answering the coordinator {now - seen:.0f} s ago: "
                        "presumed dead (the engine on its host reports its exit code)"
                    )
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
