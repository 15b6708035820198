"""Store 'device': a pixel agent's frames on the learner's own device(s).

The frames live in a `magi_lp.replay.frame_store.DeviceFrameStore` where the update runs, and
a batch is a gather there. In a distributed program each actor writes each step once into a
Reverb queue in the replay node (`magi_lp.replay.frame_queue`), a thread of the learner
drains it into the store, and the learner enforces the replay ratio (`RatioGate`). In one
process the actor writes into the store directly: no Reverb, no TensorFlow.
"""

from __future__ import annotations

from typing import Any

from magi_lp.replay.store import HeldLearnerReplay, ReplayStore, StopFn, never

STEP_QUEUE = "steps"
"""The Reverb queue that carries actors' steps to the learner's device store."""


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

    def close(self) -> None:
        """Stops the drain thread and ends the learner's waits."""
        if self.drainer is not None:
            self.drainer.close()
        elif self.gate is not None:
            self.gate.close()


class DeviceStore(ReplayStore):
    """Frames on the learner's device(s); a Reverb step queue only between processes."""

    name = "device"

    @property
    def uses_reverb(self) -> bool:
        return not self.single_process

    def make_tables(self, environment_spec: Any) -> list:
        del environment_spec
        if self.single_process:
            return []
        from magi_lp.replay.frame_queue import make_step_queue_table

        return [make_step_queue_table(STEP_QUEUE, int(self.config.replay.queue_steps))]

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        if isinstance(replay, DeviceLearnerReplay):  # one process: straight into the store
            from magi_lp.replay.frame_store import StoreAdder

            return StoreAdder(replay.store, writer)
        from magi_lp.replay.frame_queue import QueueFrameAdder

        spec = self.builder.frame_replay(environment_spec)
        return QueueFrameAdder(replay, STEP_QUEUE, writer, spec, should_stop=should_stop)

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> DeviceLearnerReplay:
        import jax

        from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator

        key = jax.random.PRNGKey(0) if key is None else key
        store = DeviceFrameStore(self.builder.frame_replay(environment_spec), writers=self.writers)
        if self.single_process or replay_client is None:
            return DeviceLearnerReplay(DeviceReplayIterator(store, key), store)
        from magi_lp.replay.frame_queue import QueueDrainer, failure_of
        from magi_lp.replay.schedule import RatioGate

        gate = RatioGate(self.builder.replay_schedule())
        drainer = QueueDrainer(replay_client, STEP_QUEUE, store, gate)
        iterator = DeviceReplayIterator(store, key, gate=gate, failure=failure_of(drainer))
        return DeviceLearnerReplay(
            iterator, store, client=replay_client, gate=gate, drainer=drainer
        )

    def nbytes(self, shards: int = 1) -> int:
        return self.builder.frame_replay(None).nbytes(self.writers, shards)
