"""The program's control nodes, the counter and the coordinator: no ML framework in them.

They count steps and stop the program; they never touch a network, a frame or a device. So
their module imports neither JAX nor TensorFlow nor Reverb, and neither does the process of
either node: an engine unpickles a node's constructor (and its arguments' classes) in the
node's own process, and a constructor from `magi_lp.runtime.nodes` would import JAX there
(and a Reverb handle, TensorFlow), about 300 MiB of memory and a few CPU seconds each for
nothing (`make lint` keeps this module free of them; tests/test_runtime.py checks the
processes).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from absl import logging

from magi_lp.acme_api import counting
from magi_lp.replay.asked_again import caller_name
from magi_lp.runtime.graph import NodeLifetime


@dataclasses.dataclass
class CoordinatorNode:
    """Stops the program once actors have taken `max_actor_steps` steps.

    Before stopping it asks Reverb to checkpoint when configured (a replay sharing the
    learner's process, which the learner checkpoints at any other stop; a replay node of its
    own checkpoints itself at its stop). The
    learner's final checkpoint is the learner's own save at stop: the launcher stops it after
    the actors and before the counter, so that save holds the final counts (and a learner
    blocked waiting for replay saves the state of its last completed step).

    At the limit it first waits for each evaluator's evaluation at the limit (the actors
    wait there meanwhile), so a run's last evaluation is of its final parameters, as in
    `main.py`; a stop asked for meanwhile (Ctrl-C) ends the wait.

    Attributes (private ones are handles, which an engine must not serve):
      _counter: the counter node.
      _replay: the replay node (a Reverb client under Launchpad) when `checkpoint_replay`,
        else None: a Reverb handle would bring Reverb and TensorFlow into this process.
      _max_actor_steps: the limit.
      _evaluators: the evaluator nodes.
      checkpoint_replay: checkpoint Reverb before the stop.
      poll_seconds: how often the counts are read.
      lifetime: the engine's `NodeLifetime`.
    """

    _counter: Any
    _replay: Any
    _max_actor_steps: int
    _evaluators: tuple[Any, ...] = ()
    checkpoint_replay: bool = False
    poll_seconds: float = 0.2
    lifetime: NodeLifetime = dataclasses.field(kw_only=True, repr=False)

    def run(self) -> None:
        while not self.lifetime.wait_for_stop(self.poll_seconds):
            if self.limit_reached():
                logging.info("Reached %d actor steps: stopping.", self._max_actor_steps)
                if not self.wait_for_final_evaluations():
                    return  # a stop was asked for meanwhile: the launcher stops the program
                self.finish()
                self.lifetime.stop_program()
                return

    def wait_for_final_evaluations(self) -> bool:
        """Waits until every evaluator has evaluated at the limit; False if a stop came first."""
        start = time.monotonic()
        waiting = list(self._evaluators)
        while waiting:
            waiting = [e for e in waiting if not e.evaluated_at_limit()]
            if waiting and self.lifetime.wait_for_stop(self.poll_seconds):
                return False
        if self._evaluators:
            logging.info("Final evaluations took %.1fs", time.monotonic() - start)
        return True

    def limit_reached(self) -> bool:
        """Whether the actors have taken `max_actor_steps` steps."""
        return self._counter.get_counts().get("actor_steps", 0) >= self._max_actor_steps

    def finish(self) -> None:
        """The replay checkpoint (when configured) before the stop."""
        start = time.monotonic()
        if self.checkpoint_replay:
            try:
                path = self._replay.checkpoint()
                logging.info("Replay checkpoint written to %s", path)
            except Exception as error:
                logging.warning("Replay checkpoint failed: %s", error)
        logging.info("Final replay checkpoint took %.1fs", time.monotonic() - start)


def new_counter() -> counting.Counter:
    """The program's step counter (the single-process runner's)."""
    return counting.Counter(time_delta=0.0)


RECENT_CALLS = 64
"""Per sender, how many of its latest increments `CounterNode.increment_once` remembers."""


class CounterNode(counting.Counter):
    """The program's step counter as a node of its own (serves `increment`, `increment_once`
    and `get_counts`)."""

    def __init__(self, *, lifetime: NodeLifetime | None = None):
        del lifetime  # it only answers calls
        super().__init__(time_delta=0.0)
        self._once = threading.Lock()
        self._counted: dict[str, set[int]] = {}  # sender -> its latest calls counted

    def increment_once(self, sender: str, call: int, counts: dict[str, Any]) -> dict[str, Any]:
        """`increment(**counts)`, unless `sender`'s increment number `call` was counted
        already (an engine asked the call again after losing its answer: Ray's "may or may
        not have been executed"); the counts either way."""
        with self._once:
            counted = self._counted.setdefault(sender, set())
            if call not in counted:
                self.increment(**counts)
                counted.add(call)
                if len(counted) > RECENT_CALLS:
                    counted.discard(min(counted))
        return self.get_counts()


class OnceCounterClient:
    """A node's handle to the counter node as the parent of Acme's `Counter`: each increment
    is numbered (`CounterNode.increment_once`), so one that an engine asks twice counts once."""

    def __init__(self, counter: Any):
        self._counter = counter
        self._sender = caller_name("counts")
        self._calls = 0
        self._lock = threading.Lock()

    def increment(self, **counts: Any) -> dict[str, Any]:
        with self._lock:
            self._calls += 1
            call = self._calls
        return self._counter.increment_once(self._sender, call, counts)

    def get_counts(self) -> dict[str, Any]:
        return self._counter.get_counts()


def counter_parent(counter: Any) -> Any:
    """What a node's own counters sync with: `counter` itself where it is in this process
    (the single-process runner's), else the counter node's handle with numbered increments
    (`OnceCounterClient`)."""
    return counter if isinstance(counter, counting.Counter) else OnceCounterClient(counter)
