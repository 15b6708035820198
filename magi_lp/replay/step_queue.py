"""Actors' steps to the learner's device store over any transport: adders, sender, drain.

The device store (`magi_lp.replay.frame_store.DeviceFrameStore`) lives in the learner's
process. Each actor's adder writes every step once, as one step item (`step_example`: the
newest frame, the action, reward and discount, episode flags and the writer's index;
`StepAdder`), and a thread of the learner (`StepDrainer`) takes the items in order from a
`StepSource` and writes them into the store, no faster than the learner's `RatioGate` lets
transitions in. Two transports carry the items:

- Reverb (`magi_lp.replay.frame_queue`): a Reverb queue table in the replay node, written by
  `QueueFrameAdder` and read by `ReverbStepSource` (what the Launchpad engine uses);
- served: `magi_lp.replay.served_queue.StepQueue`, a bounded FIFO held in the replay node's
  process, whose methods an engine exposes as remote calls; `ServedFrameAdder` writes to it
  and `ServedStepSource` reads it (here), both through a handle with those methods (a Ray or
  Courier client, or the `StepQueue` itself in one process).

Steps move in batches (issue 67): an actor's k adders share one `StepSender`, which sends
their items in one `insert_batch` call once `replay.send_steps` wait or the oldest waited
`replay.send_secs` (and near the step limit whenever the acting loop reports its counts); the
loop counts what the queue took (`StepSender.take_sent`), so nothing waiting in an actor is
ever counted. A full queue holds a batch back: the sender asks `wait_for_room` (a small call)
before the batch travels again. The drain takes up to `SERVED_TAKE_STEPS` a call, and where
the replay ratio holds it back it waits for room for that many (at most half the ratio's error
buffer) rather than taking a step or two per sampled batch. A batch travels in columns
(`magi_lp.replay.step_batch`: one array of frames, not one object per step), which halves what
a call costs to serialize.

The relay hop stays: actors -> the replay node's `StepQueue` -> the learner's drain. Batched,
it costs the replay node little per step (BENCHMARKS.md, "Served acting"), and it keeps every
rule as it was: the queue, its bound and its close live outside the learner's process (whose
update thread the actors' calls would otherwise share a GIL with), and at a stop the actors
go first, the learner's drain takes what the queue holds (`take_the_rest`), the replay node
last. Handing Ray references through the replay node instead would spare one copy, but an
object belongs to the process that put it: an actor that ends at the stop takes its
unconsumed batches with it, and the learner's `take_the_rest` would find them gone.

No call waits for long: `StepQueue.insert_batch` and `take_batch` wait at most a short
timeout (`BLOCK_S`, `TAKE_WAIT_S`) and say what they did, so an adder re-checks whether the
program stops (then gives its write up with `WriteAbandonedError`) and the drain whether it
is closed; `StepQueue.close()` wakes every waiter at once. Back-pressure is the Reverb
queue's: a full queue holds the actors' writes back, and the drain takes steps only while
the `RatioGate` allows, so the replay ratio holds in both directions.

Imports no Reverb, no Launchpad, no Ray and no JAX: it runs in any node process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import dm_env
import numpy as np
import tree
from absl import logging

from magi_lp.acme_api import adders
from magi_lp.replay import asked_again, step_batch
from magi_lp.replay.frame_window import NewestFrames
from magi_lp.replay.schedule import RatioGate
from magi_lp.replay.spec import FrameReplaySpec, WriteAbandonedError

if TYPE_CHECKING:
    from magi_lp.replay.frame_store import DeviceFrameStore

DRAIN_FLUSH_STEPS = 64
"""Steps the drain writes before it applies them on the device (the learner also flushes
before each batch, so nothing waits on this); also the most steps one take from Reverb's queue
asks for."""

SERVED_TAKE_STEPS = 256
"""The most steps one served take of the drain asks for (`StepDrainer`'s `max_take` on the
served path): a remote call costs the processes on both ends and Ray's own about as much as
100 steps' frames, so the drain takes them as the actors send them, a batch a call."""

BLOCK_S = 0.25
"""The longest one `StepQueue` insert waits for room: a writer then re-checks whether it
should stop."""

TAKE_WAIT_S = 1.0
"""The longest one served take of the drain waits for steps (the queue's `close()` ends it at
once). Each take that finds none is a remote call: four a second (0.25 s each) cost the
replay and learner processes and Ray's own 52 ms of CPU a second at rest, one a second 36
(measured on this repository's 2-core box, Ray 2.60)."""

SEND_STEPS = 256
"""Step items an actor's `StepSender` gathers before it sends them in one call (the default
of `replay.send_steps`). A call of n steps of 84x84x3 frames cost the actor, the replay node,
the learner's drain and Ray's daemons together 9-12 ms of CPU plus 0.08 ms a step (embedded
Ray 2.60 on this repository's 2-core box, `benchmarks/served_batches.py`, five runs):
0.22-0.28 ms a step at n = 64, 0.07-0.12 at n = 256."""

SEND_SECS = 2.0
"""The longest a step waits in an actor's `StepSender` once another comes (the default of
`replay.send_secs`): a slow actor (one environment at 55 steps a second on a 2-core box)
still sends batches of about 100, and no step waits long for the learner. Near the step
limit the acting loop also sends at each report of its counts."""

REST_QUIET_S = 0.5
"""At a stop, `StepDrainer.take_the_rest` ends once no step has come for this long (the
writers are gone: a Reverb read waits on; a served take says so after `TAKE_WAIT_S`)."""

REST_WITHIN_S = 3.0
"""The longest `StepDrainer.take_the_rest` takes: the final save follows it within the
launcher's notice."""


def step_example(spec: FrameReplaySpec) -> dict[str, Any]:
    """The structure of one step item (also what the drain unflattens Reverb items into)."""
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


def never() -> bool:
    return False


# -- the actor's side ---------------------------------------------------------------------


class StepAdder(adders.Adder):
    """Writes one environment's steps as step items, each step once (its observation's
    newest frame, `frame_window.NewestFrames`); a transport's subclass sends them (`_send`)."""

    def __init__(self, writer: int, spec: FrameReplaySpec, *, check_stacking: bool = True):
        """Creates the adder.

        Args:
          writer: this adder's index among all writers of the program (actor x environment);
            the learner keeps its episodes apart by it, and its shard is writer % devices.
          spec: what the learner stores.
          check_stacking: see `frame_window.NewestFrames`.
        """
        self._writer_index = np.int32(writer)
        self._spec = spec
        self._frames = NewestFrames(
            frame_stack=spec.frame_stack, channels=spec.frame_shape[-1], check=check_stacking
        )
        self._example = step_example(spec)

    def _send(self, item: dict[str, Any]) -> None:
        """Sends one step item (in the order written)."""
        raise NotImplementedError

    def _write(self, **step: Any) -> None:
        self._send({**self._example, **step, "writer": self._writer_index})

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


class StepSender:
    """What one actor's adders send to a served `StepQueue`, in batches: the steps of its k
    environments (each `ServedFrameAdder` of the actor adds its items here) go in one
    `insert_batch` call once `send_steps` items wait, or once the oldest has waited
    `send_secs` (checked as each item comes: a slow environment still sends, one step late
    at most), and whenever the acting loop asks it to (`take_sent`: near the step limit, at
    each report of the counts; at a stop).

    The counts stay exact: `take_sent` sends what waits first and answers the environment
    steps the queue took, so an actor counts only steps the replay has (a kill loses only
    steps never counted, a stop drops only what the replay would not take, uncounted). Each
    insert names the sender and how many of its steps the queue took before it, so a call
    that an engine asks twice (its answer lost) puts them in once (`StepQueue.insert_batch`).
    """

    def __init__(
        self,
        queue: Any,
        *,
        send_steps: int = 1,
        send_secs: float = SEND_SECS,
        should_stop: Callable[[], bool] = never,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Creates the sender.

        Args:
          queue: the handle of the replay node's `StepQueue` (`insert_batch`, `info`).
          send_steps: items that wait before a send (1: each as it comes).
          send_secs: the longest the oldest waiting item waits for a send, once another
            item comes.
          should_stop: whether the program is stopping: a send a full queue holds back is
            then given up (`WriteAbandonedError`) instead of tried again.
          clock: seconds, for `send_secs` (tests give their own).
        """
        if int(send_steps) < 1 or not float(send_secs) >= 0:
            raise ValueError(
                f"StepSender needs send_steps >= 1 and send_secs >= 0, got {send_steps}, "
                f"{send_secs}"
            )
        self._queue = queue
        self._send_steps = int(send_steps)
        self._send_secs = float(send_secs)
        self._should_stop = should_stop
        self._clock = clock
        self._pending: list[dict[str, Any]] = []
        self._oldest_at = 0.0
        self._sent = 0  # environment steps the queue took since the last `take_sent`
        self._name = asked_again.caller_name("sender")  # this sender's, across every call
        self._offset = 0  # items the queue took from this sender
        self.calls = 0
        """`insert_batch` calls made."""

    @property
    def pending(self) -> int:
        """Items waiting for a send."""
        return len(self._pending)

    def add(self, item: dict[str, Any]) -> None:
        """Adds one step item; sends what waits once a bound is reached."""
        now = self._clock()
        if not self._pending:
            self._oldest_at = now
        self._pending.append(item)
        if len(self._pending) >= self._send_steps or now - self._oldest_at >= self._send_secs:
            self.send()

    def send(self) -> None:
        """Sends what waits, in order and in columns (`step_batch`), until the queue took all
        of it or the program stops (each call waits at most the queue's short timeout); at a
        stop, or once the queue is closed, drops the rest and raises `WriteAbandonedError`."""
        if not self._pending:
            return
        batch = step_batch.stack(self._pending)
        while True:
            self.calls += 1
            taken = int(self._queue.insert_batch(batch, sender=self._name, offset=self._offset))
            self._offset += taken
            self._sent += step_batch.environment_steps(step_batch.part(batch, 0, taken))
            del self._pending[:taken]
            if not self._pending:
                return
            batch = step_batch.part(batch, taken)
            # The queue is full: the rest travels again once there is room for it (a small
            # call waits for that), or never, at a stop or once the queue is closed (the
            # replay node is stopping: nothing taken from a closed queue ever will be).
            while True:
                room = -1 if self._should_stop() else int(self._queue.wait_for_room(self.pending))
                if room < 0:
                    self._pending.clear()
                    raise WriteAbandonedError("the program is stopping")
                if room > 0:
                    break

    def take_sent(self, send: bool = True) -> int:
        """Sends what waits (at a stop: what the queue still takes), then returns the
        environment steps (items of `add`, not of `add_first`) the queue took since the last
        call: what the actor may count. With `send=False` nothing is sent: what the sends
        made so far took (an acting loop whose counts follow the sends)."""
        if send:
            with contextlib.suppress(WriteAbandonedError):  # dropped, and so never counted
                self.send()
        sent, self._sent = self._sent, 0
        return sent

    def close(self) -> None:
        """Sends what waits, unless the program is stopping or the queue is closed: then it
        is dropped, as a stop drops a write held back."""
        try:
            if self._pending and not self._should_stop():
                self.send()
        except WriteAbandonedError:
            pass
        self._pending.clear()


class ServedFrameAdder(StepAdder):
    """A `StepAdder` writing to a served `StepQueue` through a `StepSender`: its own, or one
    it shares with the other environments of its actor (one call for all k)."""

    def __init__(
        self,
        queue: Any,
        writer: int,
        spec: FrameReplaySpec,
        *,
        send_every: int = 1,
        send_secs: float = SEND_SECS,
        sender: StepSender | None = None,
        check_stacking: bool = True,
        should_stop: Callable[[], bool] = never,
    ):
        """Creates the adder (see `StepAdder` for `writer`, `spec` and `check_stacking`).

        Args:
          queue: the handle of the replay node's `StepQueue` (`insert_batch(batch)`,
            `info()`: a remote client, or the queue itself).
          send_every, send_secs: the bounds of its own sender (`StepSender`'s `send_steps`
            and `send_secs`; 1: each step as it comes).
          sender: a sender shared with the actor's other adders (then `queue`, `send_every`,
            `send_secs` and `should_stop` are the sender's, not these).
          should_stop: whether the program is stopping: a write a full queue holds back is
            then given up (`WriteAbandonedError`) instead of tried again.
        """
        super().__init__(writer, spec, check_stacking=check_stacking)
        self._sender = sender or StepSender(
            queue, send_steps=send_every, send_secs=send_secs, should_stop=should_stop
        )

    def _send(self, item: dict[str, Any]) -> None:
        self._sender.add(item)

    def take_sent_steps(self, send: bool = True) -> int:
        """Sends what its sender holds (unless `send=False`) and returns the environment steps
        the queue took since the last call, of every adder sharing the sender
        (`StepSender.take_sent`)."""
        return self._sender.take_sent(send)

    def close(self) -> None:
        """Sends what its sender holds, unless the program is stopping (`StepSender.close`)."""
        self._sender.close()


# -- the learner's side -------------------------------------------------------------------


class StepSource(Protocol):
    """Where a `StepDrainer` takes steps from: one transport's reading end."""

    name: str
    """What it reads, for the log."""

    def take(self, max_steps: int) -> list[dict[str, Any]]:
        """At least one and at most `max_steps` step items, oldest first (`step_example`'s
        structure), or [] after a short wait for none (or once closed)."""
        ...

    def close(self) -> None:
        """Ends a `take` waiting in another thread; later ones return []."""
        ...

    def hurry(self) -> None:
        """A stop takes the rest: later takes that find nothing end soon, so that `close()`
        (which waits for the take in flight) follows the last step quickly."""
        ...


class ServedStepSource:
    """The drain's reading end of a served `StepQueue`, through `queue`, a handle with its
    `take_batch(max_items, timeout, taker=, ask=)`. Each take is numbered, so a take that an
    engine asks twice (its answer lost) is answered the same steps (`StepQueue.take_batch`)."""

    def __init__(self, queue: Any, *, timeout_s: float = TAKE_WAIT_S):
        self._queue = queue
        self._timeout_s = float(timeout_s)
        self._closed = threading.Event()
        self._taker = asked_again.caller_name("drain")
        self._asks = 0
        self.name = "the served step queue"

    def take(self, max_steps: int) -> list[dict[str, Any]]:
        if self._closed.is_set():
            return []
        start = time.monotonic()
        self._asks += 1
        batch = self._queue.take_batch(
            max_steps, self._timeout_s, taker=self._taker, ask=self._asks
        )
        if batch is None:  # a closed queue answers at once: wait out the timeout, not spin
            self._closed.wait(max(0.0, self._timeout_s - (time.monotonic() - start)))
            return []
        return step_batch.rows(batch)

    def close(self) -> None:
        self._closed.set()

    def hurry(self) -> None:
        # A remote take cannot be cancelled: the drain's close waits for the one in flight.
        self._timeout_s = min(self._timeout_s, BLOCK_S)


class StepDrainer:
    """The learner's thread that moves steps from a `StepSource` into its device store.

    Each item is written into the store as it arrives (`add_first` / `add`), at most as many
    as the `RatioGate` allows: a step completes at most one transition, so the drain asks the
    source for no more steps than the gate lets transitions in. An error on this thread is
    kept and raised by the learner's next batch (`error`, `failure_of`). `close()` ends the
    gate's waits and the source's read.
    """

    def __init__(
        self,
        source: StepSource,
        store: DeviceFrameStore,
        gate: RatioGate,
        *,
        max_take: int = DRAIN_FLUSH_STEPS,
        min_take: int = 1,
    ):
        """`max_take`: the most steps one take asks for. `min_take`: the room in the ratio
        the drain waits for before it takes (`RatioGate.wait_to_insert`), so that a learner
        the ratio holds back is fed in takes of that many rather than a step or two per
        sampled batch (a served take is a remote call)."""
        self._source = source
        self._store = store
        self._gate = gate
        self._max_take = max(1, int(max_take))
        self._min_take = max(1, int(min_take))
        self._closed = threading.Event()
        self._rest = threading.Event()  # a stop: take what is left, past the ratio
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.steps = 0
        """Steps taken from the source."""
        self.skipped_steps = 0
        """Steps of episodes whose start this store never saw (dropped)."""
        self.started_at: float | None = None

    def start(self) -> None:
        """Starts draining (on a daemon thread)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="magi_lp-drain", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.started_at = time.monotonic()
            staged = 0
            while not self._closed.is_set():
                if self._rest.is_set():  # a stop: no batch is sampled any more
                    limit = self._max_take
                elif self._gate.wait_to_insert(timeout=0.1, room=self._min_take):
                    room = self._gate.insert_limit() - self._gate.inserted
                    limit = min(max(1, room), self._max_take)
                else:
                    if staged:  # held back by the ratio: apply what waits meanwhile
                        self._store.flush()
                        staged = 0
                    continue  # not allowed yet (or closed: the loop ends)
                steps = self._source.take(limit)
                if not steps and staged:  # nothing came: apply what waits meanwhile
                    self._store.flush()
                    staged = 0
                for step in steps:
                    self._gate.add_inserted(self._write(step))
                    self.steps += 1
                    staged += 1
                    if staged >= DRAIN_FLUSH_STEPS:
                        self._store.flush()
                        staged = 0
                    if self.steps == 1:
                        logging.info("StepDrainer: first step taken from %s", self._source.name)
        except BaseException as error:  # raised by the learner's next batch
            self.error = error
            logging.error("StepDrainer failed: %s", error)

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

    def take_the_rest(self, quiet_s: float = REST_QUIET_S, within_s: float = REST_WITHIN_S) -> int:
        """At a stop, with the writers gone: takes what the source still holds into the
        store, past the replay ratio, until none has come for `quiet_s` (at most `within_s`),
        then closes. Returns the steps taken so.

        The actors counted these steps (up to `replay.queue_steps` in the queue, and what
        the drain held back for the ratio); left there, the replay node's stop lost them and
        the final checkpoint's store lacked them. The gate closes first: no batch is sampled
        beside these writes (a step in flight past its batch is left out of the final save,
        as at any stop), and the store is saved after them.
        """
        thread = self._thread
        if thread is None or not thread.is_alive() or self.error is not None:
            self.close()
            return 0
        before = self.steps
        self._gate.close()
        self._source.hurry()
        self._rest.set()
        start = last_at = time.monotonic()
        last = self.steps
        while thread.is_alive():
            now = time.monotonic()
            if now - start >= within_s:  # a writer that overstayed its notice: not waited for
                break
            if self.steps != last:
                last, last_at = self.steps, now
            elif now - last_at >= quiet_s:
                break
            time.sleep(0.02)
        self.close()
        return self.steps - before

    def close(self) -> None:
        """Stops draining: ends the gate's waits and the source's read."""
        self._closed.set()
        self._gate.close()
        self._source.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def failure_of(drainer: StepDrainer) -> Callable[[], BaseException | None]:
    """What `DeviceReplayIterator` checks before waiting: the drain thread's error."""
    return lambda: drainer.error
