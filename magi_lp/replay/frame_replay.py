"""Frame-efficient n-step transition replay for stacked pixel observations, on Reverb.

A pixel agent observes the last `frame_stack` rendered frames stacked along the channel
axis and learns from n-step transitions (o_t, a_t, R_t, discount_t, o_{t+n}). Stored as
such, each rendered frame sits in replay 2 * frame_stack times (in three stacks of
o_t and three of o_{t+n}): about 127 KB per 84x84 transition before compression, 64-128 GB
for a million transitions. Here every rendered frame is stored once:

- `FrameStackAdder` appends one step per environment step to a Reverb `TrajectoryWriter`
  holding only the NEWEST frame of the stacked observation, and creates one item per
  transition that references the window of `frame_stack + n_step` consecutive frames
  covering both stacks, plus the action and the n rewards and discounts. Overlapping items
  reference the same chunks, so the frame data is shared, not copied.
- The dataset computes the n-step return and the bootstrap discount from the window at
  sample time, in the tf.data pipeline, and either stacks both observations there
  (`stack_on_host=True`: `acme.types.Transition`s) or hands the learner the window itself
  (`stack_on_host=False`: `magi_lp.replay.frame_window.FrameTransition`s, stacked on the
  learner's device by `window_observations`). Stacking is a channels-last transpose of the
  whole batch: on the host it costs more CPU than Reverb's reading (96 vs 40 CPU ms per
  256-item batch at 84x84, 2 readers), on a device it is one fused copy in the update.

Layout of one episode in the writer (P = frame_stack - 1 padding steps):

    writer step   0 .. P-1         P          P+1   ...   P+T
    frame         f_0 (padding)    f_0        f_1   ...   f_T
    action/reward/discount         -          a_0, r_0, d_0 ... a_{T-1}, r_{T-1}, d_{T-1}

`r_k` and `d_k` are the reward and discount of the timestep that `a_k` led to. The item of
transition t references frames at writer steps t .. t+P+n (f_{t-P} .. f_{t+n}, where
frames before f_0 are f_0) and action/reward/discount at steps t+P+1 .. t+P+n.

Design choices:
- Episode starts: the frame-stacking wrapper pads a fresh episode by repeating its first
  frame, so the adder writes P extra copies of f_0 before it. They cost P frames per
  episode (2 of 1001 for a 1000-step episode at frame_stack 3) and keep every item the same
  length, which the fixed-shape dataset needs.
- Episode ends: like DrQ-v2's own replay, a transition is stored only when its full n-step
  window lies inside the episode: an episode of T steps gives max(T - n + 1, 0) items, and
  the last n - 1 steps of an episode never start a transition (their rewards are still
  used by earlier ones). dm_control episodes end by time limit with discount 1, so nothing
  is lost there; agents for tasks with frequent true terminations should account for
  the missing truncated tail.
- Compression and chunking: Reverb 0.7.0 compresses every chunk with Snappy; there is
  no switch, and the trajectory writer has no delta encoding. Snappy compresses in
  independent 64 KiB blocks, so consecutive frames share their (mostly static)
  background only within a block: one-frame chunks store about 6.6 KB per 84x84 reacher
  frame, chunks of 3 or more frames about 3.4 KB. Fewer, larger chunks also cut the
  replay server's per-chunk memory overhead (resident memory per transition: 10.4 KB
  with 3-frame chunks, 5.7 KB with 6, 5.5 KB with 12), but every sample decompresses
  the whole chunks its window touches (Reverb reader CPU per batch of 256: 25-30 ms at
  3 and 6 frames, 35 ms at 12, 64 ms at 24). The default is about two Snappy blocks of raw
  frames per chunk: 6 frames at 84x84x3.
"""

from __future__ import annotations

import collections.abc
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import dm_env
import jax
import numpy as np
import reverb
import tensorflow as tf
import tree
from absl import logging

from magi_lp.acme_api import adders, specs, types
from magi_lp.config_schema import refusal
from magi_lp.errors import ConfigError
from magi_lp.replay.frame_window import FrameTransition, NewestFrames
from magi_lp.replay.spec import WriteAbandonedError

CHUNK_TARGET_BYTES = 2 * 65536
"""Raw frame bytes per chunk by default: two of Snappy's independent 64 KiB blocks."""

MAX_DEFAULT_CHUNK_LENGTH = 32
"""Cap for tiny frames, so an item never waits long for its chunk to fill."""


FLUSH_POLL_MS = 200
"""How long a blocked write waits before it checks whether the program is stopping."""


def flush_or_stop(
    flush: Callable[..., Any], should_stop: Callable[[], bool], **flush_args: Any
) -> None:
    """Calls a Reverb writer's `flush`/`end_episode` until it returns, checking
    `should_stop()` every `FLUSH_POLL_MS`: a write blocked in C++ otherwise holds the node
    until the launcher's SIGKILL (Python runs no signal handler there)."""
    while True:
        try:
            flush(**flush_args, timeout_ms=FLUSH_POLL_MS)
            return
        except reverb.errors.DeadlineExceededError:
            if should_stop():
                raise WriteAbandonedError("the program is stopping") from None


def default_chunk_length(frame_nbytes: int) -> int:
    """Frames per chunk for frames of `frame_nbytes` bytes (see the module docstring)."""
    return max(1, min(MAX_DEFAULT_CHUNK_LENGTH, CHUNK_TARGET_BYTES // max(1, frame_nbytes)))


class FrameWindow(NamedTuple):
    """What one replay item holds: the frames and step data of one n-step transition.

    Attributes:
      frames: uint8 [frame_stack + n_step, H, W, C], oldest first; the first frame_stack
        frames make the observation, the last frame_stack the next observation.
      action: the action taken at the observation, shaped like the action spec.
      reward: float32 [n_step], the rewards of the n steps after the observation.
      discount: float32 [n_step], the environment discounts of those steps.
      extras: what the actor passed as `extras` with the action (often empty).
    """

    frames: Any
    action: Any
    reward: Any
    discount: Any
    extras: Any = ()


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(refusal(name, "an integer >= 1", value))


def frame_replay_signature(
    frame_shape: Sequence[int],
    action_spec: specs.Array,
    *,
    frame_stack: int,
    n_step: int,
    extras_spec: types.NestedSpec = (),
) -> FrameWindow:
    """The Reverb table signature of the items `FrameStackAdder` writes.

    Args:
      frame_shape: shape of ONE rendered frame, [H, W, C].
      action_spec: the environment's action spec.
      frame_stack: frames per observation.
      n_step: environment steps per transition.
      extras_spec: spec of the `extras` the actor passes to `add` (often empty).
    """
    _check_positive("frame_stack", frame_stack)
    _check_positive("n_step", n_step)
    window = frame_stack + n_step
    return FrameWindow(
        frames=tf.TensorSpec([window, *frame_shape], tf.uint8, name="frames"),
        action=tf.TensorSpec(action_spec.shape, tf.as_dtype(action_spec.dtype), name="action"),
        reward=tf.TensorSpec([n_step], tf.float32, name="reward"),
        discount=tf.TensorSpec([n_step], tf.float32, name="discount"),
        extras=tree.map_structure_with_path(
            lambda path, s: tf.TensorSpec(
                s.shape, tf.as_dtype(s.dtype), name="/".join(["extras", *map(str, path)])
            ),
            extras_spec,
        ),
    )


def frame_transition_shape(
    batch_size: int,
    frame_shape: Sequence[int],
    action_spec: specs.Array,
    *,
    frame_stack: int,
    n_step: int,
    extras_spec: types.NestedSpec = (),
) -> FrameTransition:
    """What `make_frame_replay_dataset(..., stack_on_host=False)` yields, as a pytree of
    `jax.ShapeDtypeStruct`: lets a learner compile its update before the first batch."""
    signature = frame_replay_signature(
        frame_shape, action_spec, frame_stack=frame_stack, n_step=n_step, extras_spec=extras_spec
    )

    def batched(spec: tf.TensorSpec) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((batch_size, *spec.shape), spec.dtype.as_numpy_dtype)

    scalar = jax.ShapeDtypeStruct((batch_size,), np.float32)
    return FrameTransition(
        frames=batched(signature.frames),
        action=batched(signature.action),
        reward=scalar,
        discount=scalar,
        extras=tree.map_structure(batched, signature.extras),
    )


def make_frame_replay_table(
    name: str,
    max_size: int,
    *,
    frame_shape: Sequence[int],
    action_spec: specs.Array,
    frame_stack: int,
    n_step: int,
    extras_spec: types.NestedSpec = (),
    rate_limiter: reverb.rate_limiters.RateLimiter | None = None,
    sampler: reverb.item_selectors.ItemSelector | None = None,
    remover: reverb.item_selectors.ItemSelector | None = None,
) -> reverb.Table:
    """A Reverb table of n-step transitions stored frame by frame.

    Args:
      name: table name; the adder and dataset refer to it.
      max_size: transitions kept (the oldest are removed first by default).
      frame_shape, action_spec, frame_stack, n_step, extras_spec: see
        `frame_replay_signature`.
      rate_limiter: defaults to `MinSize(1)` (sample as soon as there is an item).
      sampler: defaults to uniform sampling.
      remover: defaults to FIFO removal.
    """
    _check_positive("max_size", max_size)
    return reverb.Table(
        name=name,
        sampler=sampler if sampler is not None else reverb.selectors.Uniform(),
        remover=remover if remover is not None else reverb.selectors.Fifo(),
        max_size=int(max_size),
        rate_limiter=rate_limiter if rate_limiter is not None else reverb.rate_limiters.MinSize(1),
        signature=frame_replay_signature(
            frame_shape,
            action_spec,
            frame_stack=frame_stack,
            n_step=n_step,
            extras_spec=extras_spec,
        ),
    )


class FrameStackAdder(adders.Adder):
    """Writes n-step transitions of stacked pixel observations, each frame once.

    Takes the stacked observations [H, W, C * frame_stack] the environment gives (oldest
    frame first along the channel axis, a fresh episode padded by repeating its first
    frame) and stores only the newest C channels of each. See the module docstring for
    the layout and for which transitions are stored.
    """

    def __init__(
        self,
        client: reverb.Client,
        table: str,
        *,
        frame_stack: int,
        n_step: int,
        channels: int = 3,
        priority: float = 1.0,
        chunk_length: int | None = None,
        max_in_flight_items: int = 5,
        check_stacking: bool = True,
        get_signature_timeout_ms: int = 300_000,
        eager_items: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        """Creates the adder; the Reverb writer is opened on the first `add_first`.

        Args:
          client: client of the Reverb server holding `table` (in a Launchpad node, the
            dereferenced ReverbNode handle).
          table: a table made by `make_frame_replay_table` with the same frame_stack
            and n_step.
          frame_stack: frames per observation.
          n_step: environment steps per transition.
          channels: channels of one frame (3 for RGB).
          priority: priority of every item.
          chunk_length: steps per Reverb chunk (the unit of compression); None picks
            `default_chunk_length` from the first frame's size.
          max_in_flight_items: items sent but not yet confirmed by the server before
            `add` blocks (this is where the table's rate limiter holds an actor back);
            items still waiting for their chunk to fill do not count.
          check_stacking: verify that each observation is the previous one shifted by
            one frame (and, at an episode start, the first frame repeated), so a
            wrapper that stacks differently fails loudly instead of corrupting replay.
          get_signature_timeout_ms: how long the writer waits for the table signature.
          eager_items: the first `eager_items` items this adder creates are sent (and
            confirmed) at once instead of waiting for their chunk to fill, so a fresh
            replay reaches the size learning starts at sooner (give this adder's share of
            the replay schedule's `min_replay_size`: divided by the adders writing at once).
            Their chunks are cut short: less compression for those items only, and one
            server round trip per step until then.
          should_stop: whether the program is stopping; a write the replay holds back
            then raises `WriteAbandonedError` instead of blocking on.
        """
        _check_positive("frame_stack", frame_stack)
        _check_positive("n_step", n_step)
        _check_positive("channels", channels)
        if chunk_length is not None:
            _check_positive("chunk_length", chunk_length)
        _check_positive("max_in_flight_items", max_in_flight_items)
        self._client = client
        self._table = table
        self._frame_stack = frame_stack
        self._n_step = n_step
        self._channels = channels
        self._priority = float(priority)
        self._chunk_length = chunk_length
        self._max_in_flight_items = max_in_flight_items
        self._check_stacking = check_stacking
        self._get_signature_timeout_ms = get_signature_timeout_ms
        if eager_items < 0:
            raise ConfigError(refusal("eager_items", "an integer >= 0", eager_items))
        self._eager_items = eager_items
        self._should_stop = should_stop
        self._items_created = 0
        self._writer: reverb.TrajectoryWriter | None = None
        self._configured_paths: set = set()
        self._frames = NewestFrames(
            frame_stack=frame_stack, channels=channels, check=check_stacking
        )
        self._env_steps = 0  # environment steps taken in the current episode

    @property
    def _window(self) -> int:
        return self._frame_stack + self._n_step

    def _get_writer(self, frame: np.ndarray) -> reverb.TrajectoryWriter:
        if self._writer is None:
            if self._chunk_length is None:
                self._chunk_length = default_chunk_length(frame.nbytes)
            self._writer = self._client.trajectory_writer(
                num_keep_alive_refs=max(self._window, self._chunk_length),
                get_signature_timeout_ms=self._get_signature_timeout_ms,
            )
        return self._writer

    def _append(self, step: dict) -> None:
        writer = self._get_writer(step["frame"])
        # Every column gets the same constant chunk length: the auto-tuned default may
        # pick one-step chunks, and a chunk's overhead then dwarfs a float's payload.
        for path, _ in tree.flatten_with_path(step):
            if path not in self._configured_paths:
                writer.configure(
                    path,
                    num_keep_alive_refs=max(self._window, self._chunk_length),
                    max_chunk_length=self._chunk_length,
                )
                self._configured_paths.add(path)
        writer.append(step)

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        """Starts an episode with its first (padded) stacked observation."""
        if not timestep.first():
            raise ValueError("add_first needs the first timestep of an episode.")
        if self._env_steps or self._frames.in_episode:
            # The previous episode was cut short without reset(); close it first.
            self.reset()
        frame = self._frames.first(timestep.observation)
        for _ in range(self._frame_stack):
            self._append({"frame": frame})
        self._env_steps = 0

    def add(
        self,
        action: types.NestedArray,
        next_timestep: dm_env.TimeStep,
        extras: types.NestedArray = (),
    ) -> None:
        """Records a_t and the timestep it led to; writes the transition now complete."""
        frame = self._frames.next(next_timestep.observation)
        step = {
            "frame": frame,
            "action": action,
            "reward": np.float32(next_timestep.reward),
            "discount": np.float32(next_timestep.discount),
        }
        has_extras = (
            len(extras) > 0 if isinstance(extras, collections.abc.Sized) else extras is not None
        )
        if has_extras:
            step["extras"] = extras
        self._append(step)
        self._env_steps += 1

        if self._env_steps >= self._n_step:
            self._create_item(has_extras)
        if next_timestep.last():
            self.reset()

    def _create_item(self, has_extras: bool) -> None:
        # Transition t = env_steps - n: its frames are the last window steps, its action
        # (and extras) sit at the first of the last n steps, its rewards and discounts
        # at the last n steps.
        n = self._n_step
        history = self._writer.history
        trajectory = FrameWindow(
            frames=history["frame"][-self._window :],
            action=tree.map_structure(lambda column: column[-n], history["action"]),
            reward=history["reward"][-n:],
            discount=history["discount"][-n:],
            extras=(
                tree.map_structure(lambda column: column[-n], history["extras"])
                if has_extras
                else ()
            ),
        )
        self._writer.create_item(self._table, self._priority, trajectory)
        self._items_created += 1
        if self._items_created <= self._eager_items:
            flush_or_stop(self._writer.flush, self._should_stop)
            if self._items_created == 1:
                logging.info("FrameStackAdder: first item sent to table %r", self._table)
            return
        # The last chunk_length items wait for the open chunk to fill; flushing them
        # would cut chunks short (and undo the compression), so only the items beyond
        # them are held to max_in_flight_items.
        flush_or_stop(
            self._writer.flush,
            self._should_stop,
            block_until_num_items=self._max_in_flight_items + self._chunk_length,
        )

    def reset(self, timeout_ms: int | None = None) -> None:
        """Ends the episode: sends its pending items and clears the writer's history."""
        if self._writer is not None:
            if timeout_ms is None:
                flush_or_stop(self._writer.end_episode, self._should_stop, clear_buffers=True)
            else:
                self._writer.end_episode(clear_buffers=True, timeout_ms=timeout_ms)
        self._frames.reset()
        self._env_steps = 0

    def close(self) -> None:
        """Sends pending items and closes the writer."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
            self._configured_paths = set()


def _stack_frames(frames: tf.Tensor) -> tf.Tensor:
    """[B, S, H, W, C] frames, oldest first -> [B, H, W, S * C], oldest first."""
    _, stack, height, width, channels = frames.shape
    # The same permutation as [0, 2, 3, 1, 4] on the 5-D tensor, but TF's 4-D transpose
    # is about a quarter faster on CPU; this copy is the dataset's main per-batch cost.
    pixels = tf.reshape(frames, [-1, stack, height * width, channels])
    stacked = tf.transpose(pixels, [0, 2, 1, 3])
    return tf.reshape(stacked, [-1, height, width, stack * channels])


def window_to_transition(
    window: FrameWindow, *, frame_stack: int, n_step: int, discount: float
) -> types.Transition:
    """Builds a batch of n-step transitions from a batch of sampled `FrameWindow`s.

    reward = sum_{k<n} gamma^k * prod_{j<k} d_j * r_k, discount = gamma^n * prod_k d_k,
    observation = frames[:frame_stack], next_observation = frames[n_step:], stacked
    along the channel axis oldest first.
    """
    frames = window.frames
    step_discounts = discount * tf.cast(window.discount, tf.float32)
    reward_weights = tf.math.cumprod(step_discounts, axis=1, exclusive=True)
    return types.Transition(
        observation=_stack_frames(frames[:, :frame_stack]),
        action=window.action,
        reward=tf.reduce_sum(reward_weights * tf.cast(window.reward, tf.float32), axis=1),
        discount=tf.reduce_prod(step_discounts, axis=1),
        next_observation=_stack_frames(frames[:, n_step : n_step + frame_stack]),
        extras=window.extras,
    )


def window_to_frame_transition(
    window: FrameWindow, *, n_step: int, discount: float
) -> FrameTransition:
    """Like `window_to_transition`, but leaves the frames unstacked: a `FrameTransition`."""
    del n_step  # the window's length already says it
    step_discounts = discount * tf.cast(window.discount, tf.float32)
    reward_weights = tf.math.cumprod(step_discounts, axis=1, exclusive=True)
    return FrameTransition(
        frames=window.frames,
        action=window.action,
        reward=tf.reduce_sum(reward_weights * tf.cast(window.reward, tf.float32), axis=1),
        discount=tf.reduce_prod(step_discounts, axis=1),
        extras=window.extras,
    )


def _check_dataset_arguments(
    batch_size: int, num_parallel_calls: int, frame_stack: int, n_step: int, discount: float
) -> None:
    _check_positive("batch_size", batch_size)
    _check_positive("num_parallel_calls", num_parallel_calls)
    _check_positive("frame_stack", frame_stack)
    _check_positive("n_step", n_step)
    if not 0.0 < discount <= 1.0:
        raise ConfigError(refusal("discount", "a number in (0, 1]", discount))


def make_frame_replay_dataset(
    server_address: str,
    table: str,
    *,
    batch_size: int,
    frame_stack: int,
    n_step: int,
    discount: float,
    stack_on_host: bool = True,
    prefetch: int = 4,
    num_parallel_calls: int = 2,
    max_in_flight_samples_per_worker: int | None = None,
    rate_limiter_timeout_ms: int = -1,
) -> Iterator[types.Transition | FrameTransition]:
    """Iterator of numpy batches sampled from a frame replay table.

    Nothing connects to the server and nothing is sampled before the first `next()`: a
    learner can be built (and serve its parameters) before the replay answers, and in one
    process no batch is drawn from a table that learning will not read yet.

    Args:
      server_address: the Reverb server, e.g. `client.server_address` (works for a server
        in this process and across processes).
      table: the table `FrameStackAdder` writes to.
      batch_size: transitions per batch; observations are uint8 [B, H, W, C*stack],
        action [B, ...], reward and discount float32 [B].
      frame_stack, n_step: as given to the adder.
      discount: gamma of the n-step return.
      stack_on_host: True: `acme.types.Transition`s with stacked observations; False:
        `FrameTransition`s holding the uint8 window [B, frame_stack + n_step, H, W, C],
        for a learner that stacks on its device (`frame_window.window_observations`).
      prefetch: batches prepared ahead (0 for none).
      num_parallel_calls: parallel Reverb readers and transform workers.
      max_in_flight_samples_per_worker: samples each reader requests at once
        (default 2 * batch_size).
      rate_limiter_timeout_ms: how long a reader waits for the table's rate limiter
        before the iterator ends; -1 (default) waits forever.
    """
    # Argument mistakes surface here, not at the first batch.
    _check_dataset_arguments(batch_size, num_parallel_calls, frame_stack, n_step, discount)
    if max_in_flight_samples_per_worker is None:
        max_in_flight_samples_per_worker = 2 * batch_size

    def make_dataset() -> tf.data.Dataset:
        # No autograph: these functions have no tensor-dependent Python control flow, and
        # converting them took seconds of the learner's start (2.2 s on a loaded 2-core box).
        @tf.autograph.experimental.do_not_convert
        def read(_: tf.Tensor) -> tf.data.Dataset:
            dataset = reverb.TrajectoryDataset.from_table_signature(
                server_address=server_address,
                table=table,
                max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
                rate_limiter_timeout_ms=rate_limiter_timeout_ms,
            )
            return dataset.batch(batch_size, drop_remainder=True)

        dataset = tf.data.Dataset.range(num_parallel_calls).interleave(
            read,
            cycle_length=num_parallel_calls,
            num_parallel_calls=num_parallel_calls,
            deterministic=False,
        )
        if stack_on_host:
            transform = functools.partial(
                window_to_transition, frame_stack=frame_stack, n_step=n_step, discount=discount
            )
        else:
            transform = functools.partial(
                window_to_frame_transition, n_step=n_step, discount=discount
            )
        dataset = dataset.map(
            tf.autograph.experimental.do_not_convert(lambda sample: transform(sample.data)),
            num_parallel_calls=num_parallel_calls,
        )
        return dataset.prefetch(prefetch) if prefetch else dataset

    return LazyIterator(lambda: make_dataset().as_numpy_iterator(), name="frame replay dataset")


class LazyIterator(collections.abc.Iterator):
    """An iterator made by `make()` on the first `next()`."""

    def __init__(self, make: Callable[[], Iterator[Any]], name: str = "iterator"):
        self._make = make
        self._name = name
        self._iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self._iterator is None:
            start = time.monotonic()
            self._iterator = self._make()
            logging.info("%s built in %.1f s", self._name, time.monotonic() - start)
        return next(self._iterator)
