"""Store 'device': a pixel agent's frames on the learner's own device(s).

The frames live in a `magi_lp.replay.frame_store.DeviceFrameStore` where the update runs, and
a batch is a gather there. In a distributed program each actor writes each step once into a
step queue in the replay node, a thread of the learner drains it into the store
(`magi_lp.replay.step_queue.StepDrainer`), and the learner enforces the replay ratio
(`RatioGate`). The queue is a Reverb queue table on the 'reverb' transport
(`magi_lp.replay.frame_queue`) and the served `magi_lp.replay.served_queue.StepQueue` on
'served'. In one process the actor writes into the store directly: no Reverb, no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from magi_lp.replay.store import HeldLearnerReplay, ReplayStore, StopFn, never

STEP_QUEUE = "steps"
"""The Reverb queue that carries actors' steps to the learner's device store ('reverb')."""


class DeviceLearnerReplay(HeldLearnerReplay):
    """The device store on the learner's side, with its replay ratio and drain thread
    (distributed only).

    Attributes:
      store: the `DeviceFrameStore` (`held`).
      gate: the replay ratio the learner enforces (distributed), else None.
      drainer: the thread moving steps from the queue into the store (distributed), else None.
    """

    def __init__(
        self,
        iterator: Any,
        store: Any,
        *,
        client: Any = None,
        gate: Any = None,
        drainer: Any = None,
    ):
        super().__init__(iterator, store, client)
        self.store = store
        self.gate = gate
        self.drainer = drainer

    def info(self) -> dict[str, Any]:
        # frames, episode starts included
        return {**super().info(), "replay_steps_added": self.store.steps_added}

    def has_items(self) -> bool:
        self.store.flush()
        return self.store.ready()

    def restore(self, saved: Any) -> None:
        """Takes a saved store back, with the replay ratio's counts."""
        super().restore(saved)
        if self.gate is not None:
            self.gate.restore(self.store.inserted, self.store.sampled_batches)

    def start(self) -> None:
        if self.drainer is not None:
            self.drainer.start()

    def take_the_rest(self) -> int:
        """What the step queue still holds, into the store (`StepDrainer.take_the_rest`)."""
        if self.drainer is None:
            return 0
        return int(self.drainer.take_the_rest())

    def close(self) -> None:
        """Stops the drain thread and ends the learner's waits."""
        if self.drainer is not None:
            self.drainer.close()
        elif self.gate is not None:
            self.gate.close()


class DeviceStore(ReplayStore):
    """Frames on the learner's device(s); a step queue (Reverb's, or served) only between
    processes."""

    name = "device"
    saved_by = "replay"

    @property
    def uses_reverb(self) -> bool:
        return not self.single_process and not self.served

    def make_tables(self, environment_spec: Any) -> list:
        del environment_spec
        if self.single_process or self.served:
            return []
        from magi_lp.replay.frame_queue import make_step_queue_table

        return [make_step_queue_table(STEP_QUEUE, int(self.config.replay.queue_steps))]

    def make_server(self, environment_spec: Any) -> Any:
        """The served step queue (`StepQueue`, `replay.queue_steps` steps), or None."""
        if not self.served:
            return None
        from magi_lp.replay.served_queue import StepQueue

        spec = self.builder.frame_replay(environment_spec)
        return StepQueue(spec, int(self.config.replay.queue_steps))

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        return self.make_adders(environment_spec, replay, [writer], should_stop)[0]

    def make_adders(
        self,
        environment_spec: Any,
        replay: Any,
        writers: Sequence[int],
        should_stop: StopFn = never,
    ) -> list[Any]:
        """One actor's adders; on 'served' they share one `StepSender`: the actor's k
        environments' steps go in one call, `replay.send_steps` at a time (or after
        `replay.send_secs`, or when the loop's count asks)."""
        if isinstance(replay, DeviceLearnerReplay):  # one process: straight into the store
            from magi_lp.replay.frame_store import StoreAdder

            return [StoreAdder(replay.store, writer) for writer in writers]
        spec = self.builder.frame_replay(environment_spec)
        if self.served:
            from magi_lp.replay.step_queue import ServedFrameAdder, StepSender

            sender = StepSender(replay, **self.send_bounds(), should_stop=should_stop)
            return [ServedFrameAdder(replay, w, spec, sender=sender) for w in writers]
        from magi_lp.replay.frame_queue import QueueFrameAdder

        return [
            QueueFrameAdder(replay, STEP_QUEUE, w, spec, should_stop=should_stop) for w in writers
        ]

    def send_bounds(self) -> dict[str, Any]:
        """An actor's `StepSender` bounds: `replay.send_steps` and `replay.send_secs` (their
        defaults where a config lacks them)."""
        from magi_lp.replay.step_queue import SEND_SECS, SEND_STEPS

        replay = self.config.replay
        return {
            "send_steps": int(replay.get("send_steps", SEND_STEPS)),
            "send_secs": float(replay.get("send_secs", SEND_SECS)),
        }

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> DeviceLearnerReplay:
        import jax

        from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator

        key = jax.random.PRNGKey(0) if key is None else key
        store = DeviceFrameStore(self.builder.frame_replay(environment_spec), writers=self.writers)
        if self.single_process or replay_client is None:
            return DeviceLearnerReplay(DeviceReplayIterator(store, key), store)
        gate, drainer, client = self._drain(store, replay_client)
        from magi_lp.replay.step_queue import failure_of

        iterator = DeviceReplayIterator(store, key, gate=gate, failure=failure_of(drainer))
        return DeviceLearnerReplay(iterator, store, client=client, gate=gate, drainer=drainer)

    def _drain(self, store: Any, replay_client: Any) -> tuple[Any, Any, Any]:
        """(the replay ratio, the thread draining the step queue into `store`, the Reverb
        client the learner keeps or None) of a distributed learner: shared by the stores
        whose steps come through the step queue."""
        from magi_lp.replay.schedule import RatioGate

        gate = RatioGate(self.builder.replay_schedule())
        if self.served:
            from magi_lp.replay.step_queue import (
                SERVED_TAKE_STEPS,
                ServedStepSource,
                StepDrainer,
            )

            drainer = StepDrainer(
                ServedStepSource(replay_client),
                store,
                gate,
                max_take=SERVED_TAKE_STEPS,
                min_take=SERVED_TAKE_STEPS,
            )
            return gate, drainer, None  # no Reverb: the handle is the drain's alone
        from magi_lp.replay.frame_queue import QueueDrainer

        return gate, QueueDrainer(replay_client, STEP_QUEUE, store, gate), replay_client

    def nbytes(self, shards: int = 1) -> int:
        return self.builder.frame_replay(None).nbytes(self.writers, shards)
