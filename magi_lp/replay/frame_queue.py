"""Reverb as the actors' transport to a learner that keeps its replay on its own device.

Actors write each step once (`QueueFrameAdder`: the newest frame, the action, reward and
discount, and episode flags: `step_queue.step_example`) as one item of a Reverb queue table
(`make_step_queue_table`: FIFO, each item read once). A thread in the learner
(`step_queue.StepDrainer`, reading through `ReverbStepSource`; `QueueDrainer` makes the two)
takes the items in order and writes them into the `DeviceFrameStore`, which builds the n-step
transitions: each frame crosses Reverb once and is decompressed once, instead of at every
sample. Where Reverb is not the transport, the same drain reads a served queue instead
(`magi_lp.replay.step_queue`); this module is Reverb's part only.

Back-pressure: the queue holds at most `max_steps` items; a full queue blocks the actors'
writes. The drain takes a step only while the learner's `RatioGate` allows, so the replay
ratio holds in both directions without a Reverb rate limiter between the two.

Steps of one writer arrive in the order it wrote them (one gRPC stream per writer); steps
of different writers interleave, and the store keeps each writer's episode apart by the
writer index every item carries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import reverb
import tree

from magi_lp.replay import reverb_seam
from magi_lp.replay.frame_replay import flush_or_stop
from magi_lp.replay.frame_store import DeviceFrameStore
from magi_lp.replay.schedule import RatioGate
from magi_lp.replay.spec import FrameReplaySpec
from magi_lp.replay.step_queue import (
    DRAIN_FLUSH_STEPS,
    StepAdder,
    StepDrainer,
    failure_of,
    step_example,
)

__all__ = [
    "DRAIN_FLUSH_STEPS",
    "QueueDrainer",
    "QueueFrameAdder",
    "ReverbStepSource",
    "failure_of",
    "make_step_queue_table",
    "step_example",
]


def make_step_queue_table(name: str, max_steps: int) -> reverb.Table:
    """The queue actors write steps to: FIFO, each item sampled once, inserts block when it
    holds `max_steps` items, samples when it is empty."""
    return reverb.Table.queue(name, max_size=int(max_steps))


class QueueFrameAdder(StepAdder):
    """Writes one environment's steps to the Reverb step queue, each step once, as its own
    item."""

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
            then raises `spec.WriteAbandonedError` instead of blocking on.
        """
        super().__init__(writer, spec, check_stacking=check_stacking)
        self._client = client
        self._table = table
        self._max_in_flight_items = max_in_flight_items
        self._writer: reverb.TrajectoryWriter | None = None
        self._should_stop = should_stop

    def _send(self, item: dict[str, Any]) -> None:
        if self._writer is None:
            self._writer = self._client.trajectory_writer(num_keep_alive_refs=1)
        self._writer.append(item)
        self._writer.create_item(
            self._table, 1.0, tree.map_structure(lambda column: column[-1], self._writer.history)
        )
        flush_or_stop(
            self._writer.flush,
            self._should_stop,
            block_until_num_items=self._max_in_flight_items,
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class ReverbStepSource:
    """The drain's reading end of the Reverb step queue (a `step_queue.StepSource`).

    Reads through a cancellable sampler (`reverb_seam.open_sampler`), opened at the first
    read: the public `Client.sample` generator cannot be cancelled from another thread, and a
    stop must not wait for an actor to write. A read waits until an item comes or `close()`.
    """

    def __init__(
        self, client: reverb.Client, table: str, spec: FrameReplaySpec, *, in_flight: int = 4
    ):
        self._client = client
        self._table = table
        self._in_flight = in_flight
        self.name = repr(table)
        self._structure = step_example(spec)
        # Without extras every column is a top-level key: the item maps onto them directly.
        paths = [path for path, _ in tree.flatten_with_path(self._structure)]
        flat = all(len(path) == 1 for path in paths)
        self._paths = [path[0] for path in paths] if flat else None
        self._closed = False
        self._sampler: Any = None
        self._sampler_lock = threading.Lock()

    def _open(self) -> Any:
        with self._sampler_lock:
            if self._closed:
                return None
            if self._sampler is None:
                # The server may still be starting in a fresh program: NewSampler connects
                # lazily.
                self._sampler = reverb_seam.open_sampler(self._client, self._table, self._in_flight)
            return self._sampler

    def take(self, max_steps: int) -> list[dict[str, Any]]:
        del max_steps  # Reverb's sampler hands out one item per read
        sampler = self._open()
        if sampler is None:
            return []
        try:
            columns = sampler.GetNextTrajectory()
        except RuntimeError:
            if self._closed:
                return []  # cancelled by close()
            raise
        return [self._unflatten(columns[reverb_seam.SAMPLER_KEY_COLUMNS :])]

    def _unflatten(self, columns: list) -> dict[str, Any]:
        """A queue item's columns as a step (the writer's flattening order: sorted keys)."""
        if self._paths is None:
            return tree.unflatten_as(self._structure, [np.asarray(c) for c in columns])
        return {path: np.asarray(c) for path, c in zip(self._paths, columns, strict=True)}

    def hurry(self) -> None:
        """Nothing to do: `close()` cancels a blocked read."""

    def close(self) -> None:
        """Cancels a blocked read; later reads return []."""
        with self._sampler_lock:
            self._closed = True
            if self._sampler is not None:
                self._sampler.Close()


class QueueDrainer(StepDrainer):
    """The learner's drain of the Reverb step queue `table` into its device store: a
    `step_queue.StepDrainer` reading through a `ReverbStepSource`."""

    def __init__(
        self,
        client: reverb.Client,
        table: str,
        store: DeviceFrameStore,
        gate: RatioGate,
        *,
        in_flight: int = 4,
    ):
        super().__init__(
            ReverbStepSource(client, table, store.spec, in_flight=in_flight), store, gate
        )
