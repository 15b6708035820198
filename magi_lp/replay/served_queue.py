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
from collections.abc import Sequence
from typing import Any

import numpy as np
import tree

from magi_lp.replay import step_batch
from magi_lp.replay.spec import FrameReplaySpec
from magi_lp.replay.step_queue import BLOCK_S, TAKE_WAIT_S, step_example


class StepQueue:
    """The served step queue: a bounded FIFO of step items in the replay node's process, held
    as the batches they came in (`step_batch`).

    Its public methods are what an engine serves (plain Python calls, thread-safe: writers,
    the drain and the engine call them from their own threads at once). Every wait ends after
    at most `block_s` (an insert) or `take_s` (a take), or at `close()`. `insert_batch` and
    `take_batch` move steps in columns (what the actors' senders and the learner's drain
    call); `insert_steps` and `take_steps` do the same with a list of step items.
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

    @staticmethod
    def _wait_s(timeout: float | None, cap: float) -> float:
        return cap if timeout is None else min(max(0.0, float(timeout)), cap)

    def insert_batch(self, batch: step_batch.StepBatch, timeout: float | None = None) -> int:
        """Appends the steps of `batch` in order while there is room, waiting for room at most
        `timeout` seconds (at most `block_s`; default `block_s`). Returns how many it took:
        the first that many of `batch` (0 once closed)."""
        count = step_batch.length(batch)
        deadline = time.monotonic() + self._wait_s(timeout, self.block_s)
        taken = 0
        with self._condition:
            while taken < count and not self._closed:
                room = min(self.max_steps - self._size, count - taken)
                if room > 0:
                    self._batches.append(step_batch.part(batch, taken, taken + room))
                    self._size += room
                    taken += room
                    self.inserted += room
                    self._condition.notify_all()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
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

    def insert_steps(self, items: Sequence[dict[str, Any]], timeout: float | None = None) -> int:
        """`insert_batch` of a list of step items."""
        return self.insert_batch(step_batch.stack(items), timeout) if items else 0

    def take_batch(
        self, max_items: int, timeout: float | None = None
    ) -> step_batch.StepBatch | None:
        """Up to `max_items` steps, oldest first, in one batch, waiting for the first at most
        `timeout` seconds (at most `take_s`; default `take_s`). None: none came (or closed)."""
        with self._condition:
            wait_s = self._wait_s(timeout, self.take_s)
            self._condition.wait_for(lambda: self._size or self._closed, wait_s)
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

    def take_steps(self, max_items: int, timeout: float | None = None) -> list[dict[str, Any]]:
        """`take_batch` as a list of step items ([]: none came, or closed)."""
        batch = self.take_batch(max_items, timeout)
        return [] if batch is None else step_batch.rows(batch)

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
