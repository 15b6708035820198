"""Batches of n-step transitions as windows of unique frames, stacked on the learner's device.

A pixel transition (o_t, a_t, R_t, d_t, o_{t+n}) with observations of `frame_stack` frames
needs the `frame_stack + n_step` consecutive frames f_{t-S+1} .. f_{t+n} (S = frame_stack):
o_t is the first S of them and o_{t+n} the last S. The frame replay
(`magi_lp.replay.frame_replay`) stores each frame once and can hand the learner either
stacked observations or that window. Stacking on the host is a channels-last transpose of
every batch ([B, S, H, W, C] -> [B, H, W, S*C]), the costliest step of host-side sampling
(about 56 of 96 CPU ms per 256-item batch at 84x84); on the learner's device, inside the
jitted update, it is one fused copy. So the replay yields `FrameTransition`s and the update
calls `window_observations`.

No framework import here: the functions use only array methods (`transpose`, `reshape`,
slicing), so they work on numpy arrays (tests, references) and on jax arrays inside `jit`,
and a GPU box without TensorFlow or Reverb can import them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from magi_lp.config_schema import refusal
from magi_lp.errors import ConfigError


class FrameTransition(NamedTuple):
    """A batch of n-step transitions whose observations are still a window of frames.

    Attributes:
      frames: uint8 [B, frame_stack + n_step, H, W, C], oldest first: the unique frames of
        the observation and the next observation (`window_observations` stacks them).
      action: [B, ...] the action taken at the observation.
      reward: float32 [B], the n-step return sum_k gamma^k prod_{j<k} d_j r_k.
      discount: float32 [B], gamma^n prod_k d_k: multiplies the bootstrapped value as is.
      extras: what the actor stored with the action (often empty).
    """

    frames: Any
    action: Any
    reward: Any
    discount: Any
    extras: Any = ()


def stack_frames(frames: Any) -> Any:
    """[B, S, H, W, C] frames, oldest first -> [B, H, W, S * C], oldest first."""
    batch, stack, height, width, channels = frames.shape
    return frames.transpose(0, 2, 3, 1, 4).reshape(batch, height, width, stack * channels)


def window_observations(frames: Any, n_step: int) -> tuple[Any, Any]:
    """(observation, next observation), each [B, H, W, S * C], from a [B, S + n, ...] window.

    The frame stack S is the window length minus `n_step`: the observation is the first S
    frames, the next observation the last S (they share frames when n_step < S).
    """
    window = frames.shape[1]
    frame_stack = window - n_step
    if n_step < 1 or frame_stack < 1:
        raise ValueError(
            f"a window of {window} frames cannot hold n_step={n_step} plus a frame stack >= 1"
        )
    return stack_frames(frames[:, :frame_stack]), stack_frames(frames[:, n_step:])


def frame_shape_from_observation(observation_shape: Any, frame_stack: int) -> tuple:
    """Returns the shape [H, W, C] of one frame of a stacked [H, W, C * frame_stack] one."""
    integer = not isinstance(frame_stack, bool) and isinstance(frame_stack, (int, np.integer))
    if not integer or frame_stack < 1:
        raise ConfigError(refusal("frame_stack", "an integer >= 1", frame_stack))
    if len(observation_shape) != 3 or observation_shape[-1] % frame_stack:
        raise ConfigError(
            refusal(
                "the stacked pixel observation's shape",
                f"[H, W, C * frame_stack] with frame_stack={frame_stack}",
                tuple(observation_shape),
                "check the environment's frame stacking against the config's frame_stack",
            )
        )
    height, width, channels = observation_shape
    return (int(height), int(width), int(channels) // frame_stack)


CHECK_ROW_STRIDE = 8
"""`NewestFrames` checks every this many rows of an episode's later observations."""


def last_channels(observation: np.ndarray, channels: int) -> np.ndarray:
    """A contiguous copy of `observation[..., -channels:]`, made one channel at a time: each
    is a copy of one byte every `observation.shape[-1]`, which NumPy does faster than a copy
    of `channels` bytes every so many (9 against 21 us for 84x84x9 uint8 taking the last 3,
    where a record view took 21 and a plain slice's copy 35-53)."""
    *pixels, stacked = observation.shape
    if not observation.flags.c_contiguous or stacked < channels:
        return np.ascontiguousarray(observation[..., -channels:])
    rows = observation.reshape(-1, stacked)
    newest = np.empty((rows.shape[0], channels), observation.dtype)
    for channel in range(channels):
        newest[:, channel] = rows[:, stacked - channels + channel]
    return newest.reshape(*pixels, channels)


class NewestFrames:
    """The newest frame of each stacked observation of one environment, checked.

    A frame-efficient replay stores only the newest `channels` of each stacked observation
    [H, W, channels * frame_stack] (oldest frame first). `first()` takes an episode's first
    observation, which the frame-stacking wrapper pads by repeating its first frame; `next()`
    each later one, which must be the previous one shifted by one frame. With `check`, a
    wrapper that stacks differently fails loudly instead of corrupting replay: an episode's
    first two observations are checked whole, each later one on every `CHECK_ROW_STRIDE`-th
    row (a whole check of an 84x84x9 observation took 70 us a step, a strided compare).
    """

    def __init__(self, *, frame_stack: int, channels: int = 3, check: bool = True):
        self._frame_stack = frame_stack
        self._channels = channels
        self._check = check
        self._previous: Any = None
        self._checked_whole = False  # this episode's first shift was checked on every row

    def _newest(self, observation: Any) -> Any:
        observation = np.asarray(observation)
        expected = self._channels * self._frame_stack
        if observation.ndim != 3 or observation.shape[-1] != expected:
            raise ValueError(
                f"expected stacked observations [H, W, {expected}] (channels={self._channels} "
                f"x frame_stack={self._frame_stack}), got shape {observation.shape}."
            )
        return observation, last_channels(observation, self._channels)

    def first(self, observation: Any) -> Any:
        """The frame of an episode's first observation (checked to repeat it)."""
        observation, frame = self._newest(observation)
        if self._check and not np.array_equal(
            observation, np.concatenate([frame] * self._frame_stack, axis=-1)
        ):
            raise ValueError(
                "The first observation of an episode must repeat its first frame "
                f"{self._frame_stack} times along the channel axis (the frame-stacking "
                "wrapper's padding); this one does not."
            )
        self._previous = observation.copy()
        self._checked_whole = False
        return frame

    def next(self, observation: Any) -> Any:
        """The newest frame of the episode's next observation (checked to follow on)."""
        if self._previous is None:
            raise ValueError("add_first must be called before add.")
        observation, frame = self._newest(observation)
        channels = self._channels
        rows = slice(None, None, CHECK_ROW_STRIDE if self._checked_whole else 1)
        if self._check and not np.array_equal(
            observation[rows, ..., :-channels], self._previous[rows, ..., channels:]
        ):
            raise ValueError(
                "Each observation must be the previous one shifted by one frame "
                "(oldest frame first along the channel axis); this one is not."
            )
        self._previous = observation.copy()
        self._checked_whole = True
        return frame

    def reset(self) -> None:
        """Forgets the episode (the next call must be `first`)."""
        self._previous = None

    @property
    def in_episode(self) -> bool:
        """Whether an episode is open."""
        return self._previous is not None
