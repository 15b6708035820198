"""The served step queue: a bounded FIFO of step items in the replay node's process.

An engine serves its public methods as remote calls (`magi_lp.replay.step_queue` tells how the
actors' `StepSender` writes it and the learner's `ServedStepSource` reads it). Steps move in
columns (`magi_lp.replay.step_batch`): the queue holds the batches as they came and hands out
batches, split or joined to the size asked.

Imports no Reverb, no Launchpad, no Ray and no JAX: the served queue runs in any node process.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np
import tree

from magi_lp.replay import asked_again, step_batch
from magi_lp.replay.spec import FrameReplaySpec
from magi_lp.replay.step_queue import BLOCK_S, TAKE_WAIT_S, step_example


class StepQueue:
    """The served step queue: a bounded FIFO of step items in the replay node's process, held
    as the batches they came in (`step_batch`).

    Its public methods are what an engine serves (plain Python calls, thread-safe: writers,
    the drain and the engine call them from their own threads at once). Every wait ends after
    at most `block_s` (an insert) or `take_s` (a take), or at `close()`. `insert_batch` and
    `take_batch` move steps in columns (what the actors' senders and the learner's drain
    call).

    A call asked twice takes and hands out its steps once (`magi_lp.replay.asked_again`): an
    insert that names its `sender` and `offset` skips the steps the queue already has from
    it, a take that names its `taker` and `ask` number is answered the same batch again.
    Without them, an insert asked again would put a batch in twice and a take asked again
    would drop one; either breaks the frames' order, and so every transition across it.
    """

    def __init__(self, spec: FrameReplaySpec, max_steps: int, *, block_s: float = BLOCK_S):
        """Creates an empty queue holding at most `max_steps` items (`replay.queue_steps`)."""
        if int(max_steps) < 1:
            raise ValueError(f"StepQueue needs max_steps >= 1, got {max_steps}")
        self.spec = spec
        self.max_steps = int(max_steps)
        self.block_s = float(block_s)
        self.take_s = max(TAKE_WAIT_S, self.block_s)
        self._batches: collections.deque[step_batch.StepBatch] = collections.deque()
        self._size = 0  # items in `_batches`
        self._condition = threading.Condition()
        self._closed = False
        self.inserted = 0
        """Items taken in by `insert_batch` (and `restore`)."""
        self.taken = 0
        """Items handed out by `take_batch`."""
        self._senders = asked_again.SenderPlaces("StepQueue")
        self._takers = asked_again.LastAnswers()

    @staticmethod
    def _wait_s(timeout: float | None, cap: float) -> float:
        return cap if timeout is None else min(max(0.0, float(timeout)), cap)

    def insert_batch(
        self,
        batch: step_batch.StepBatch,
        timeout: float | None = None,
        *,
        sender: str | None = None,
        offset: int = 0,
    ) -> int:
        """Appends the steps of `batch` in order while there is room, waiting for room at most
        `timeout` seconds (at most `block_s`; default `block_s`). Returns how many it took:
        the first that many of `batch` (0 once closed).

        Args:
          sender: the writer's own name, for an insert that may be asked twice: with it, the
            steps of `batch` the queue already took from `sender` (a call asked again) count
            as taken and are not appended again.
          offset: the items of `sender` the queue took before `batch` (the sum of its
            earlier answers).

        Raises:
          ValueError: `offset` is past what the queue took from `sender` (steps went missing).
        """
        count = step_batch.length(batch)
        deadline = time.monotonic() + self._wait_s(timeout, self.block_s)
        offset = int(offset)
        taken = 0
        with self._condition:
            while not self._closed:
                if sender is not None:  # the same call asked again may be taking them too
                    taken = self._senders.taken_of(sender, offset, count)
                if taken >= count:
                    break
                room = min(self.max_steps - self._size, count - taken)
                if room > 0:
                    self._batches.append(step_batch.part(batch, taken, taken + room))
                    self._size += room
                    taken += room
                    self.inserted += room
                    if sender is not None:
                        self._senders.took(sender, offset, taken)
                    self._condition.notify_all()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            if sender is not None:
                taken = self._senders.taken_of(sender, offset, count)
        return taken

    def wait_for_room(self, steps: int, timeout: float | None = None) -> int:
        """Waits at most `timeout` seconds (at most `block_s`; default `block_s`) until
        `steps` fit (or as many as the bound holds); returns the room then, or -1 once closed.
        A writer the queue held back asks this (a small call) before its batch travels
        again, rather than sending the batch to wait each time."""
        wanted = min(max(1, int(steps)), self.max_steps)
        with self._condition:
            self._condition.wait_for(
                lambda: self._closed or self.max_steps - self._size >= wanted,
                self._wait_s(timeout, self.block_s),
            )
            return -1 if self._closed else self.max_steps - self._size

    def take_batch(
        self,
        max_items: int,
        timeout: float | None = None,
        *,
        taker: str | None = None,
        ask: int = 1,
    ) -> step_batch.StepBatch | None:
        """Up to `max_items` steps, oldest first, in one batch, waiting for the first at most
        `timeout` seconds (at most `take_s`; default `take_s`). None: none came (or closed).

        Args:
          taker: the reader's own name, for a take that may be asked twice: the queue keeps
            its last answer until its next take.
          ask: the take's number among `taker`'s (from 1): the same number as its last take
            (a call asked again) is answered that take's batch again, once it has one.
        """
        if taker is None:
            with self._condition:
                return self._take(max_items, timeout)
        self._takers.check(ask)
        with self._condition:
            # The same take asked again: its answer, once the first asking has one (within
            # that asking's wait).
            self._condition.wait_for(lambda: not self._takers.in_flight(taker, ask))
            answered, answer = self._takers.answered(taker, ask)
            if answered:
                return answer
            self._takers.begin(taker, ask)
            batch = None
            try:
                batch = self._take(max_items, timeout)
            finally:  # never left in flight: a take asked again would wait for it
                self._takers.end(taker, ask, batch)
                self._condition.notify_all()
            return batch

    def _take(self, max_items: int, timeout: float | None) -> step_batch.StepBatch | None:
        """`take_batch` with no taker, under the queue's lock."""
        self._condition.wait_for(
            lambda: self._size or self._closed, self._wait_s(timeout, self.take_s)
        )
        if self._closed or not self._size:
            return None
        count = min(max(1, int(max_items)), self._size)
        parts, got = [], 0
        while got < count:
            head = self._batches[0]
            size = step_batch.length(head)
            if size <= count - got:
                parts.append(self._batches.popleft())
                got += size
            else:  # the head batch is split: its first steps go, the rest stays first
                parts.append(step_batch.part(head, 0, count - got))
                self._batches[0] = step_batch.part(head, count - got)
                got = count
        self._size -= count
        self.taken += count
        self._condition.notify_all()  # room for the writers
        return step_batch.join(parts)

    def info(self) -> dict[str, Any]:
        """The queue's numbers: items held, inserted and taken, its bound, and whether closed."""
        with self._condition:
            return {
                "size": self._size,
                "inserted": self.inserted,
                "taken": self.taken,
                "max_steps": self.max_steps,
                "closed": self._closed,
            }

    def close(self) -> None:
        """Ends every wait at once, and every later one before it starts: inserts take
        nothing more and takes hand out nothing more."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def save(self) -> dict[str, Any]:
        """What the queue holds, as arrays: `steps`, the step item's structure with a leading
        axis (oldest first), and `counts` (inserted, taken)."""
        with self._condition:
            batches = list(self._batches)
            counts = np.asarray([self.inserted, self.taken], np.int64)
        if batches:
            steps = step_batch.join(batches)
        else:
            steps = tree.map_structure(
                lambda x: np.zeros((0, *np.shape(x)), np.asarray(x).dtype),
                step_example(self.spec),
            )
        return {"steps": steps, "counts": counts}

    def restore(self, saved: dict[str, Any]) -> None:
        """Holds what `save()` gave (same spec) instead of what it holds now."""
        steps = tree.map_structure(np.asarray, saved["steps"])
        count = step_batch.length(steps)
        with self._condition:
            self._batches = collections.deque([steps] if count else [])
            self._size = count
            self.inserted, self.taken = (int(v) for v in np.asarray(saved["counts"]))
            self._condition.notify_all()
