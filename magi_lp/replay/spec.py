"""The replay's contract with an agent: what it stores, and the one error a write can end in.

An agent says what it stores (`AgentBuilder.frame_replay` / `transition_replay`); the toolkit
chooses the store (`magi_lp.replay.stores`) and the agent never learns which one serves it.
This module is all the agent interface (`magi_lp.agent.builder`) imports of the replay, so
it imports no JAX, no Reverb and no TensorFlow: the stores are the implementations, this is
the contract both keep. Its checks refuse a bad spec in the toolkit's one form ("<key> must
be <allowed>, got <value>.", `magi_lp.config_schema`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tree

from magi_lp.config_schema import fail_unless, is_int

FRAME_SLACK_DIVISOR = 32
"""Frame rows beyond the transition capacity: N / 32 (`magi_lp.replay.frame_store`)."""


@dataclasses.dataclass(frozen=True)
class FrameReplaySpec:
    """What a pixel agent stores: all the toolkit needs to serve it batches.

    An agent gives this (`AgentBuilder.frame_replay`); the toolkit picks the store (the
    device store or the Reverb frame replay) and hands the learner
    `magi_lp.replay.frame_window.FrameTransition` batches either way.

    Attributes:
      frame_shape: one rendered frame, (H, W, C), uint8.
      frame_stack: frames per observation (stacked along channels, oldest first).
      n_step: agent steps per transition.
      discount: gamma of the n-step return.
      capacity: transitions kept (oldest removed first).
      batch_size: transitions per learner batch.
      action_shape, action_dtype: the environment's action spec.
      extras: what the actor passes as `extras` with its action: a pytree of leaves with
        `shape` and `dtype` (`jax.ShapeDtypeStruct`s; often empty).
    """

    frame_shape: tuple[int, ...]
    frame_stack: int
    n_step: int
    discount: float
    capacity: int
    batch_size: int
    action_shape: tuple[int, ...] = ()
    action_dtype: str = "float32"
    extras: Any = ()

    def __post_init__(self) -> None:
        where = type(self).__name__
        fail_unless(
            len(self.frame_shape) == 3, f"{where}.frame_shape", "(H, W, C)", self.frame_shape
        )
        for name in ("frame_stack", "n_step", "capacity", "batch_size"):
            value = getattr(self, name)
            fail_unless(is_int(value) and value >= 1, f"{where}.{name}", "an integer >= 1", value)
        fail_unless(0.0 < self.discount <= 1.0, f"{where}.discount", "in (0, 1]", self.discount)

    @property
    def window(self) -> int:
        """Frames one transition needs: frame_stack + n_step."""
        return self.frame_stack + self.n_step

    @property
    def frame_nbytes(self) -> int:
        """Bytes of one frame."""
        return math.prod(self.frame_shape)

    def frame_capacity(self, writers_per_shard: int = 1) -> int:
        """Frame rows of one shard of `capacity` transitions (`magi_lp.replay.frame_store`)."""
        return (
            self.capacity
            + -(-self.capacity // FRAME_SLACK_DIVISOR)
            + max(1, writers_per_shard) * self.window
        )

    def index_nbytes(self) -> int:
        """Bytes of one transition's index row (frame slots, action, reward, discount, extras)."""
        action = math.prod(self.action_shape) * np.dtype(self.action_dtype).itemsize
        extras = sum(
            math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
            for leaf in tree.flatten(self.extras)
        )
        return 4 * self.window + 4 + 4 + action + extras

    def nbytes(self, writers: int = 1, shards: int = 1) -> int:
        """Bytes the device store of this spec takes over all shards (each shard holds
        `capacity` transitions of its own writers)."""
        per_shard = -(-max(1, writers) // shards)
        frames = self.frame_capacity(per_shard) * self.frame_nbytes
        return shards * (frames + self.capacity * self.index_nbytes())


@dataclasses.dataclass(frozen=True)
class TransitionReplaySpec:
    """What a state-based agent stores: its builder's `transition_replay` answer.

    Attributes:
      capacity: transitions kept (FIFO).
      batch_size: transitions per sampled batch.
      n_step: steps summed into each transition's reward.
      discount: the agent's per-step discount g.
    """

    capacity: int
    batch_size: int
    n_step: int
    discount: float

    def __post_init__(self) -> None:
        for name in ("capacity", "batch_size", "n_step"):
            value = getattr(self, name)
            fail_unless(
                is_int(value) and value >= 1,
                f"{type(self).__name__}.{name}",
                "an integer >= 1",
                value,
            )


class WriteAbandonedError(Exception):
    """A replay write held back (a rate limiter, a full queue) was given up because the
    program is stopping: the acting loop ends and the node exits without being killed."""
