"""`ReplaySchedule`: the replay ratio, stated once for both runners and for the agent.

The distributed program enforces it with the replay table's rate limiter; the single-process
runner interleaves learner steps with acting by the same numbers; and an agent whose
exploration depends on the global step (DrQ-v2) converts learner updates to actor steps with
`actor_steps_after_updates`, on the learner and on the actors alike.

Pure Python (Reverb is imported only to build a rate limiter), so an agent's jitted update can
use the schedule on a machine without Reverb.
"""

from __future__ import annotations

import dataclasses
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
