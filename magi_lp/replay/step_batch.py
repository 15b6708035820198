"""Step items in columns: how batches of steps travel on the served path, as pure functions.

A step item (`step_queue.step_example`) is a small dict: the newest frame, the action, the
reward and discount, episode flags and the writer's index. A batch of them travels as one
dict of the same structure whose arrays have a leading axis (oldest step first): one array of
frames instead of one per step. That is what an actor's `StepSender` sends, what the replay
node's `StepQueue` holds, and what the learner's drain takes: a remote call then carries a
few arrays instead of a few hundred small objects (BENCHMARKS.md, "Served acting": about
half the serialization CPU on each side of a call), and a `StepQueue.save` is its batches
joined.

No JAX, Reverb or Ray: plain NumPy, so any node process can use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tree

StepBatch = Mapping[str, Any]
"""Step items in columns: `step_example`'s structure, each leaf with a leading step axis."""


def stack(items: Sequence[Mapping[str, Any]]) -> StepBatch:
    """The batch of `items` (at least one, all of one structure), in their order."""
    if not items:
        raise ValueError("stack needs at least one step item")
    return tree.map_structure(lambda *column: np.stack(column), *items)


def length(batch: StepBatch) -> int:
    """How many steps `batch` holds."""
    return len(batch["first"])


def part(batch: StepBatch, start: int, stop: int | None = None) -> StepBatch:
    """Steps `start` to `stop` of `batch` (views, not copies)."""
    return tree.map_structure(lambda column: column[start:stop], batch)


def join(batches: Sequence[StepBatch]) -> StepBatch:
    """One batch of `batches` (at least one) in their order; a single one as it is."""
    if len(batches) == 1:
        return batches[0]
    return tree.map_structure(lambda *columns: np.concatenate(columns), *batches)


def rows(batch: StepBatch) -> list[dict[str, Any]]:
    """The step items of `batch`, oldest first (each leaf a view of its column)."""
    flat = tree.flatten(batch)
    return [tree.unflatten_as(batch, [column[i] for column in flat]) for i in range(length(batch))]


def environment_steps(batch: StepBatch) -> int:
    """The environment steps in `batch`: its items but the episodes' first frames."""
    return int(np.count_nonzero(~np.asarray(batch["first"], bool)))
