"""A state agent's n-step transitions served by the replay node, with a Reverb table's rules.

Where the engine carries the replay without Reverb (transport 'served'), a replay node holds
a `TransitionTable`: a `magi_lp.replay.transition_replay.TransitionReplay` (the batches
Acme's `NStepTransitionAdder` and `make_reverb_dataset` give) behind the rules the agent's
Reverb table keeps on the Launchpad path:

- no batch before the table holds `min_replay_size` transitions (Reverb's
  `min_size_to_sample`);
- the samples-per-insert limiter with its error buffer, by the one rule of
  `magi_lp.replay.schedule.RatioGate`: an insert waits while the inserted transitions are
  `error_buffer` past what the batches sampled so far allow, and a batch waits until the
  schedule makes it due (never ahead of the inserted transitions);
- inserts and samples wait at most a short timeout (`BLOCK_S`) and say what they did, so a
  writer re-checks whether the program stops and the learner whether it is closed, and
  `close()` ends every wait at once: a stop never leaves a writer or the learner blocked;
- `save()` / `restore()` of the whole table (`checkpoint.replay`);
- an insert asked twice (an engine that lost its answer asks it again) takes its transitions
  once: it names its sender and offset (`magi_lp.replay.asked_again`). A batch sampled twice
  is only one more batch, as a learner may sample anything.

Its public methods are what an engine serves (plain Python calls, thread-safe). Each actor's
`ServedTransitionAdder` (the n-step arithmetic of `TransitionAdder`) sends its transitions
to `insert`, the learner's `TransitionSampler` iterates over `sample`'s batches, both through
a handle with those methods (a Ray or Courier client, or the table itself in one process).

Imports no Reverb, no Launchpad, no Ray and no JAX.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tree

from magi_lp.acme_api import specs, types
from magi_lp.replay import asked_again
from magi_lp.replay.schedule import RatioGate, ReplaySchedule
from magi_lp.replay.spec import TransitionReplaySpec, WriteAbandonedError
from magi_lp.replay.transition_replay import TransitionAdder, TransitionReplay

BLOCK_S = 0.25
"""The longest one `TransitionTable` call waits (for the limiter, or for the other side)."""


def never() -> bool:
    return False


class TransitionTable:
    """n-step transitions in the replay node's memory, with a minimum size, the
    samples-per-insert limiter and short waits (see the module docstring)."""

    def __init__(
        self,
        spec: TransitionReplaySpec,
        environment_spec: specs.EnvironmentSpec,
        schedule: ReplaySchedule,
        *,
        extras_spec: Any = (),
        seed: int = 0,
        error_buffer: int | None = None,
        block_s: float = BLOCK_S,
    ):
        """Creates an empty table.

        Args:
          spec: what is stored (capacity, batch size, n-step, discount).
          environment_spec: the observations' and actions' specs.
          schedule: the replay ratio (`AgentBuilder.replay_schedule`).
          extras_spec: what the actor stores with the action (often nothing).
          seed: the seed of the uniform sampling.
          error_buffer: transitions inserts may run ahead of the exact ratio (default: the
            schedule's, as `RatioGate` takes it: the slack of the Reverb limiter).
          block_s: the longest one call waits.
        """
        self.spec = spec
        self.schedule = schedule
        self.block_s = float(block_s)
        self._replay = TransitionReplay(spec, environment_spec, extras_spec=extras_spec, seed=seed)
        self._gate = RatioGate(schedule, error_buffer=error_buffer)
        # The replay's data and the samplers' waits; each insert and batch takes it briefly.
        self._condition = threading.Condition()
        # One inserter and one sampler at a time: the limiter's counts move one by one.
        self._insert_lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._closed = False
        self._senders = asked_again.SenderPlaces("TransitionTable")  # under `_insert_lock`

    @property
    def gate(self) -> RatioGate:
        """The limiter (its counts: `inserted` transitions, `sampled` batches)."""
        return self._gate

    def _wait_s(self, timeout: float | None) -> float:
        return self.block_s if timeout is None else min(max(0.0, float(timeout)), self.block_s)

    def _may_sample(self) -> bool:
        # Reverb's min_size_to_sample counts what the table holds now.
        held = self._replay.size >= max(1, self.schedule.min_replay_size)
        return held and self._gate.may_sample()

    def insert(
        self,
        transitions: Sequence[types.Transition],
        timeout: float | None = None,
        *,
        sender: str | None = None,
        offset: int = 0,
    ) -> int:
        """Inserts `transitions` in order while the limiter allows, waiting at most `timeout`
        seconds in all (at most `block_s`; default `block_s`). Returns how many it took: the
        first that many (0 once closed).

        Args:
          sender: the writer's own name, for an insert that may be asked twice: with it, the
            transitions the table already took from `sender` (a call asked again) count as
            taken and are not inserted again.
          offset: the transitions of `sender` the table took before these (the sum of its
            earlier answers).
        """
        deadline = time.monotonic() + self._wait_s(timeout)
        count, offset = len(transitions), int(offset)
        if not self._insert_lock.acquire(timeout=self._wait_s(timeout)):
            return 0  # taken none of them (the lock's holder may be this call asked again)
        try:
            taken = 0 if sender is None else self._senders.taken_of(sender, offset, count)
            for transition in transitions[taken:]:
                if self._closed:
                    break
                if not self._gate.wait_to_insert(max(0.0, deadline - time.monotonic())):
                    break  # held back by the limiter (or closed)
                with self._condition:
                    self._replay.insert(transition)
                    self._gate.add_inserted(1)
                    self._condition.notify_all()
                taken += 1
                if sender is not None:
                    self._senders.took(sender, offset, taken)
            return taken
        finally:
            self._insert_lock.release()

    def sample(self, timeout: float | None = None) -> types.Transition | None:
        """One uniform batch of `spec.batch_size` transitions once the limiter makes it due,
        waiting at most `timeout` seconds (at most `block_s`; default `block_s`); None if none
        was due by then (or closed)."""
        deadline = time.monotonic() + self._wait_s(timeout)
        if not self._sample_lock.acquire(timeout=self._wait_s(timeout)):
            return None
        try:
            with self._condition:
                due = self._condition.wait_for(
                    lambda: self._closed or self._may_sample(),
                    max(0.0, deadline - time.monotonic()),
                )
                # Due now, and only this sampler counts batches: the gate counts it at once
                # (and wakes an insert it held back).
                if not due or self._closed or not self._gate.wait_to_sample():
                    return None
                return self._replay.sample()
        finally:
            self._sample_lock.release()

    def info(self) -> dict[str, Any]:
        """The table's numbers: transitions held and inserted, batches sampled, the limiter's
        insert limit, the minimum size, and whether it is closed."""
        with self._condition:
            return {
                "size": self._replay.size,
                "inserted": self._replay.inserted,
                "sampled_batches": self._replay.sampled_batches,
                "batch_size": int(self.spec.batch_size),
                "capacity": int(self.spec.capacity),
                "min_size": int(self.schedule.min_replay_size),
                "insert_limit": self._gate.insert_limit(),
                "closed": self._closed,
            }

    def close(self) -> None:
        """Ends every wait at once, and every later one before it starts."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._gate.close()

    def save(self) -> dict[str, Any]:
        """The whole table as arrays (a copy: inserts go on meanwhile), with its counts;
        `TransitionReplay.save`'s structure."""
        with self._condition:
            return tree.map_structure(np.copy, self._replay.save())

    def restore(self, saved: dict[str, Any]) -> None:
        """Holds what `save()` gave (same spec and environment) instead of what it holds now,
        with the limiter's counts."""
        with self._condition:
            self._replay.restore(saved)
            self._gate.restore(self._replay.inserted, self._replay.sampled_batches)
            self._condition.notify_all()


class _Outbox:
    """What a `TransitionAdder` inserts into here: the transitions of one step, to send."""

    def __init__(self) -> None:
        self.transitions: list[types.Transition] = []

    def insert(self, transition: types.Transition) -> None:
        self.transitions.append(transition)


class ServedTransitionAdder(TransitionAdder):
    """`TransitionAdder`'s n-step transitions, sent to a served `TransitionTable` through
    `table`, a handle with its `insert(transitions)` and `info()`: one call per step that
    completes any (at an episode's end, all it completes)."""

    def __init__(
        self,
        table: Any,
        n_step: int,
        discount: float,
        *,
        should_stop: Callable[[], bool] = never,
    ):
        """Creates the adder. `should_stop`: whether the program is stopping: a write the
        table holds back is then given up (`WriteAbandonedError`) instead of tried again."""
        self._outbox = _Outbox()
        super().__init__(self._outbox, n_step, discount)  # type: ignore[arg-type]
        self._table = table
        self._should_stop = should_stop
        self._name = asked_again.caller_name("adder")  # this adder's, across every insert
        self._offset = 0  # transitions the table took from this adder

    def add(self, action: Any, next_timestep: Any, extras: Any = ()) -> None:
        super().add(action, next_timestep, extras)
        self._send()

    def _send(self) -> None:
        pending = self._outbox.transitions
        while pending:
            taken = int(self._table.insert(pending, sender=self._name, offset=self._offset))
            self._offset += taken
            del pending[:taken]
            if not pending:
                return
            # Nothing taken from a closed table ever will be: the replay node is stopping.
            if self._should_stop() or (taken == 0 and self._table.info()["closed"]):
                pending.clear()
                raise WriteAbandonedError("the program is stopping")


class TransitionSampler:
    """The learner's batches from a served `TransitionTable`, through `table`, a handle with
    its `sample(timeout)` and `info()`: each `next()` waits until the table hands out a batch,
    and ends (StopIteration) once this sampler or the table is closed."""

    def __init__(self, table: Any, *, timeout_s: float = BLOCK_S):
        self._table = table
        self._timeout_s = float(timeout_s)
        self._closed = threading.Event()

    def __iter__(self) -> TransitionSampler:
        return self

    def __next__(self) -> types.Transition:
        while not self._closed.is_set():
            batch = self._table.sample(self._timeout_s)
            if batch is not None:
                return batch
            if self._table.info()["closed"]:
                break
        raise StopIteration

    def close(self) -> None:
        """Ends the wait of `next()` within one call's timeout."""
        self._closed.set()
