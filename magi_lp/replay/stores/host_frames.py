"""Store 'host': a pixel agent's frames in the learner's host memory, zstd-compressed.

What 'auto' takes where the device store does not fit the learner's device
(`magi_lp.replay.plan`): 1M transitions of 84x84x3 frames take about 5 GB here against 21.9 GB
on the device. The frames live in a `magi_lp.replay.compressed_frames.CompressedFrameStore`
in the learner's process, which the steps reach as they reach the device store (this class
is the device store's but for what holds the frames and how a batch is made): each actor
writes each step once into the step queue of the replay node (Reverb's on the 'reverb'
transport, the served `StepQueue` on 'served'), the learner's drain thread compresses it into
the store, and the learner enforces the replay ratio. Batches are sampled and decompressed on
the host by the learner's prefetch thread, off the update's. In one process the actor writes
into the store directly.
"""

from __future__ import annotations

from typing import Any

from magi_lp.replay.stores.device import DeviceLearnerReplay, DeviceStore


class HostFramesLearnerReplay(DeviceLearnerReplay):
    """The compressed host store on the learner's side (the device store's, with the store's
    bytes in the status view)."""

    def info(self) -> dict[str, Any]:
        return {**super().info(), **self.store.info()}

    def restore_target(self) -> None:
        """None: the replay checkpoint is restored with its saved shapes (`save()` writes
        the arena's bytes in use, however many; `ReplayCheckpoint.restore_target`)."""
        return self.store.restore_target()


class HostFrameStore(DeviceStore):
    """Compressed frames in the learner's host memory; the device store's step queue between
    processes."""

    name = "host"

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> HostFramesLearnerReplay:
        from magi_lp.replay.compressed_frames import CompressedFrameStore, HostReplayIterator

        seed = 0
        if key is not None:
            import jax

            seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        spec = self.builder.frame_replay(environment_spec)
        store = CompressedFrameStore(spec, writers=self.writers, seed=seed)
        if self.single_process or replay_client is None:
            return HostFramesLearnerReplay(HostReplayIterator(store), store)
        gate, drainer, client = self._drain(store, replay_client)
        from magi_lp.replay.step_queue import failure_of

        iterator = HostReplayIterator(store, gate=gate, failure=failure_of(drainer))
        return HostFramesLearnerReplay(iterator, store, client=client, gate=gate, drainer=drainer)

    def nbytes(self, shards: int = 1) -> int:
        """Nothing on the learner's device: the frames are in its host memory."""
        del shards
        return 0

    def host_nbytes(self) -> int:
        """Host bytes the store is expected to take when full (`estimated_nbytes`)."""
        from magi_lp.replay.compressed_frames import estimated_nbytes

        return estimated_nbytes(self.builder.frame_replay(None), self.writers)
