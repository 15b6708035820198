"""Reverb as the actors' transport to a learner that keeps its replay on its own device.

Actors write each step once (`QueueFrameAdder`: the newest frame, the action, reward and
discount, and episode flags) as one item of a Reverb queue table (`make_step_queue_table`:
FIFO, each item read once). A thread in the learner (`QueueDrainer`) takes the items in
order and writes them into the `DeviceFrameStore`, which builds the n-step transitions: each
frame crosses Reverb once and is decompressed once, instead of at every sample.

Back-pressure: the queue holds at most `max_steps` items; a full queue blocks the actors'
writes. The drain takes a step only while the learner's `RatioGate` allows, so the replay
ratio holds in both directions without a Reverb rate limiter between the two.

Steps of one writer arrive in the order it wrote them (one gRPC stream per writer); steps
of different writers interleave, and the store keeps each writer's episode apart by the
writer index every item carries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dm_env
import numpy as np
import reverb
import tree
from absl import logging

from magi_lp.acme_api import adders
from magi_lp.replay import reverb_seam
from magi_lp.replay.frame_replay import flush_or_stop
from magi_lp.replay.frame_store import DeviceFrameStore
from magi_lp.replay.frame_window import NewestFrames
from magi_lp.replay.schedule import RatioGate
from magi_lp.replay.spec import FrameReplaySpec

DRAIN_FLUSH_STEPS = 64
"""Steps the drain writes before it applies them on the device (the learner also flushes
before each batch, so nothing waits on this)."""


def step_example(spec: FrameReplaySpec) -> dict[str, Any]:
    """The structure of one queue item (also what the drain unflattens items into)."""
    return {
        "writer": np.int32(0),
        "first": np.bool_(False),
        "last": np.bool_(False),
        "frame": np.zeros(spec.frame_shape, np.uint8),
        "action": np.zeros(spec.action_shape, spec.action_dtype),
        "reward": np.float32(0),
        "discount": np.float32(0),
        "extras": tree.map_structure(lambda s: np.zeros(s.shape, s.dtype), spec.extras),
    }


def make_step_queue_table(name: str, max_steps: int) -> reverb.Table:
    """The queue actors write steps to: FIFO, each item sampled once, inserts block when it
    holds `max_steps` items, samples when it is empty."""
    return reverb.Table.queue(name, max_size=int(max_steps))


class QueueFrameAdder(adders.Adder):
    """Writes one environment's steps to the step queue, each step once, as its own item."""

    def __init__(
        self,
        client: reverb.Client,
        table: str,
        writer: int,
        spec: FrameReplaySpec,
        *,
        max_in_flight_items: int = 8,
        check_stacking: bool = True,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        """Creates the adder; the Reverb writer opens on the first step.

        Args:
          client: the replay server's client (in a node, the dereferenced ReverbNode handle).
          table: the step queue (`make_step_queue_table`).
          writer: this adder's index among all writers of the program (actor x environment);
            the learner keeps its episodes apart by it, and its shard is writer % devices.
          spec: what the learner stores.
          max_in_flight_items: steps sent but not yet in the queue before `add` blocks (a
            full queue holds the actor back here).
          check_stacking: see `frame_window.NewestFrames`.
          should_stop: whether the program is stopping: a write blocked by a full queue
            then raises `frame_replay.WriteAbandonedError` instead of blocking on.
        """
        self._client = client
        self._table = table
        self._writer_index = np.int32(writer)
        self._spec = spec
        self._max_in_flight_items = max_in_flight_items
        self._frames = NewestFrames(
            frame_stack=spec.frame_stack, channels=spec.frame_shape[-1], check=check_stacking
        )
        self._example = step_example(spec)
        self._writer: reverb.TrajectoryWriter | None = None
        self._should_stop = should_stop

    def _write(self, **step: Any) -> None:
        if self._writer is None:
            self._writer = self._client.trajectory_writer(num_keep_alive_refs=1)
        item = {**self._example, **step, "writer": self._writer_index}
        self._writer.append(item)
        self._writer.create_item(
            self._table, 1.0, tree.map_structure(lambda column: column[-1], self._writer.history)
        )
        flush_or_stop(
            self._writer.flush,
            self._should_stop,
            block_until_num_items=self._max_in_flight_items,
        )

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        if not timestep.first():
            raise ValueError("add_first needs the first timestep of an episode.")
        self._write(first=np.bool_(True), frame=self._frames.first(timestep.observation))

    def add(self, action: Any, next_timestep: dm_env.TimeStep, extras: Any = ()) -> None:
        step = {
            "frame": self._frames.next(next_timestep.observation),
            "action": np.asarray(action, self._spec.action_dtype),
            "reward": np.float32(next_timestep.reward),
            "discount": np.float32(next_timestep.discount),
            "last": np.bool_(next_timestep.last()),
        }
        if self._spec.extras != ():
            step["extras"] = extras
        self._write(**step)
        if next_timestep.last():
            self._frames.reset()

    def reset(self) -> None:
        self._frames.reset()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class QueueDrainer:
    """The learner's thread that moves steps from the queue into its device store.

    Each item is written into the store as it arrives (`add_first` / `add`), at most as many
    as the `RatioGate` allows. An error on this thread is kept and raised by the learner's
    next batch (`error`). `close()` cancels a read blocked on an empty queue.

    Reads through a cancellable sampler (`reverb_seam.open_sampler`): the public
    `Client.sample` generator cannot be cancelled from another thread, and a stop must not
    wait for an actor to write.
    """

    def __init__(
        self,
        client: reverb.Client,
        table: str,
        store: DeviceFrameStore,
        gate: RatioGate,
        *,
        in_flight: int = 4,
    ):
        self._client = client
        self._table = table
        self._store = store
        self._gate = gate
        self._in_flight = in_flight
        self._structure = step_example(store.spec)
        # Without extras every column is a top-level key: the item maps onto them directly.
        paths = [path for path, _ in tree.flatten_with_path(self._structure)]
        flat = all(len(path) == 1 for path in paths)
        self._paths = [path[0] for path in paths] if flat else None
        self._closed = threading.Event()
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.steps = 0
        """Steps taken from the queue."""
        self.skipped_steps = 0
        """Steps of episodes whose start this store never saw (dropped)."""
        self.started_at: float | None = None

    def start(self) -> None:
        """Starts draining (on a daemon thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="magi_lp-drain", daemon=True)
            self._thread.start()

    def _open(self) -> Any:
        with self._sampler_lock:
            if self._closed.is_set():
                return None
            # The server may still be starting in a fresh program: NewSampler connects lazily.
            self._sampler = reverb_seam.open_sampler(self._client, self._table, self._in_flight)
            return self._sampler

    def _run(self) -> None:
        try:
            sampler = self._open()
            self.started_at = time.monotonic()
            staged = 0
            while sampler is not None and not self._closed.is_set():
                if not self._gate.wait_to_insert(timeout=0.1):
                    if staged:  # held back by the ratio: apply what waits meanwhile
                        self._store.flush()
                        staged = 0
                    continue  # not allowed yet (or closed: the loop ends)
                try:
                    columns = sampler.GetNextTrajectory()
                except RuntimeError:
                    if self._closed.is_set():
                        return  # cancelled by close()
                    raise
                step = self._unflatten(columns[reverb_seam.SAMPLER_KEY_COLUMNS :])
                self._gate.add_inserted(self._write(step))
                self.steps += 1
                staged += 1
                if staged >= DRAIN_FLUSH_STEPS:
                    self._store.flush()
                    staged = 0
                if self.steps == 1:
                    logging.info("QueueDrainer: first step taken from %r", self._table)
        except BaseException as error:  # raised by the learner's next batch
            self.error = error
            logging.error("QueueDrainer failed: %s", error)

    def _unflatten(self, columns: list) -> dict[str, Any]:
        """A queue item's columns as a step (the writer's flattening order: sorted keys)."""
        if self._paths is None:
            return tree.unflatten_as(self._structure, [np.asarray(c) for c in columns])
        return {path: np.asarray(c) for path, c in zip(self._paths, columns, strict=True)}

    def _write(self, step: dict[str, Any]) -> int:
        writer = int(step["writer"])
        if step["first"]:
            self._store.add_first(writer, step["frame"])
            return 0
        if not self._store.in_episode(writer):
            # The rest of an episode begun before this store existed (a relaunched or
            # restored learner): its transitions would lack their first frames.
            self.skipped_steps += 1
            return 0
        return self._store.add(
            writer,
            step["frame"],
            step["action"],
            step["reward"],
            step["discount"],
            last=bool(step["last"]),
            extras=step.get("extras", ()),
        )

    def close(self) -> None:
        """Stops draining: ends the gate's waits and cancels a blocked read."""
        self._closed.set()
        self._gate.close()
        with self._sampler_lock:
            if self._sampler is not None:
                self._sampler.Close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def failure_of(drainer: QueueDrainer) -> Callable[[], BaseException | None]:
    """What `DeviceReplayIterator` checks before waiting: the drain thread's error."""
    return lambda: drainer.error
