"""`ReplaySchedule`: the replay ratio, stated once for both runners and for the agent.

The distributed program enforces it with the replay table's rate limiter (with the device
frame store, the learner's `RatioGate`); the single-process
runner interleaves learner steps with acting by the same numbers; and an agent whose
exploration depends on the global step (DrQ-v2) converts learner updates to actor steps with
`actor_steps_after_updates`, on the learner and on the actors alike.

Pure Python (Reverb is imported only to build a rate limiter), so an agent's jitted update can
use the schedule on a machine without Reverb.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class ReplaySchedule:
    """When the learner may update, in actor (agent) steps summed over all actors.

    Attributes:
      min_replay_size: items in replay before the first learner step.
      actor_steps_per_update: actor steps per learner step (DrQ-v2: 2).
      batch_size: items per learner step; with the above it fixes samples per insert.
      error_buffer_factor: how far the distributed rate limiter may drift from the exact
        ratio, in learner steps' worth of samples, before it blocks one side.
    """

    min_replay_size: int
    actor_steps_per_update: float
    batch_size: int
    error_buffer_factor: float = 100.0

    @property
    def samples_per_insert(self) -> float:
        """Samples drawn per item inserted when the schedule is exact."""
        return self.batch_size / self.actor_steps_per_update

    def rate_limiter(self) -> Any:
        """A Reverb rate limiter that enforces this schedule across processes."""
        import reverb  # here: the schedule itself must not need Reverb

        error_buffer = max(self.error_buffer_factor * self.batch_size, self.samples_per_insert)
        return reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=self.samples_per_insert,
            min_size_to_sample=self.min_replay_size,
            error_buffer=error_buffer,
        )

    def updates_due(self, actor_steps: int) -> int:
        """Learner steps the single-process runner owes after `actor_steps` actor steps."""
        if actor_steps < self.min_replay_size:
            return 0
        elapsed = actor_steps - self.min_replay_size
        return int(elapsed // self.actor_steps_per_update) + 1

    def actor_steps_after_updates(self, updates: Any) -> Any:
        """A lower bound on the actor steps taken once the learner has made `updates` updates.

        The inverse of `updates_due`: the first update needs `min_replay_size` steps and each
        further one `actor_steps_per_update` more. 0 before the first update. Works on Python
        numbers and on JAX arrays (no branch), so a jitted update can use it.
        """
        started = updates >= 1
        return started * (self.min_replay_size + (updates - 1) * self.actor_steps_per_update)


class RatioGate:
    """The schedule enforced by a learner that owns its replay (the device frame store).

    With Reverb, the table's `SampleToInsertRatio` limiter holds the learner or the actors
    back. A store on the learner's device has no limiter between the two, so the learner
    enforces the same numbers itself: it samples batch k only once `updates_due(inserted)`
    exceeds k (never ahead of the inserted steps), and its drain thread takes a step from the
    actors' queue only while `inserted` stays below what the samples so far allow plus
    `error_buffer` transitions. Once the drain waits, the actors' queue fills and their
    writes block: a slow learner slows the actors, and a slow actor pool stalls the learner.

    Counts are transitions (items), as the Reverb limiter counts them. Thread-safe; every wait
    ends at `close()`, so a stop never waits for data.
    """

    def __init__(self, schedule: ReplaySchedule, *, error_buffer: int | None = None):
        """Creates the gate.

        Args:
          schedule: the replay ratio.
          error_buffer: transitions the drain may run ahead of the exact ratio; default
            `schedule.error_buffer_factor` updates' worth (100 x actor_steps_per_update), the
            slack the Reverb limiter allows.
        """
        self.schedule = schedule
        if error_buffer is None:
            error_buffer = int(schedule.error_buffer_factor * schedule.actor_steps_per_update)
        self.error_buffer = max(1, int(error_buffer))
        self.inserted = 0
        self.sampled = 0
        self._condition = threading.Condition()
        self._closed = False

    def insert_limit(self) -> int:
        """Transitions the samples so far allow in (the drain waits at this many)."""
        schedule = self.schedule
        allowed = schedule.min_replay_size + self.sampled * schedule.actor_steps_per_update
        return int(allowed) + self.error_buffer

    def may_sample(self) -> bool:
        """Whether the next batch is due by the schedule."""
        return self.sampled < self.schedule.updates_due(self.inserted)

    def add_inserted(self, count: int) -> None:
        """Counts transitions written into the store."""
        if count:
            with self._condition:
                self.inserted += count
                self._condition.notify_all()

    def wait_to_insert(self, timeout: float | None = None, room: int = 1) -> bool:
        """Waits until `room` more transitions may go in (one by default; at most half the
        error buffer, as more may never fit while the learner waits for data, and with half
        the learner still has half the buffer's updates in hand); False once closed (or on
        timeout)."""
        wanted = max(1, min(int(room), self.error_buffer // 2))
        with self._condition:
            return (
                self._condition.wait_for(
                    lambda: self._closed or self.insert_limit() - self.inserted >= wanted,
                    timeout,
                )
                and not self._closed
            )

    def wait_to_sample(
        self, ready: Callable[[], bool] = lambda: True, poll_s: float = 0.05
    ) -> bool:
        """Waits until the next batch is due and `ready()` (the store has data to sample),
        then counts it as sampled; False once closed."""
        while True:
            # ready() outside the lock: it may flush the store or raise the writer side's
            # failure, and inserts must go on counting meanwhile.
            is_ready = ready()
            with self._condition:
                if self._closed:
                    return False
                if is_ready and self.may_sample():
                    self.sampled += 1
                    self._condition.notify_all()
                    return True
                self._condition.wait(poll_s)

    def restore(self, inserted: int, sampled: int) -> None:
        """Counts restored with a replay checkpoint."""
        with self._condition:
            self.inserted, self.sampled = int(inserted), int(sampled)
            self._condition.notify_all()

    def close(self) -> None:
        """Ends every wait, now and later."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
