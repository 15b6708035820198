"""Store 'reverb': a pixel agent's frames in the Reverb frame replay of the replay node.

Each frame is stored once (`magi_lp.replay.frame_replay`), the table's rate limiter enforces
the replay ratio between processes, and the learner's CPU samples batches of frame windows
through a `tf.data` pipeline.
"""

from __future__ import annotations

from typing import Any

from magi_lp.replay.store import LearnerReplay, ReplayStore, StopFn, never, reverb_client_of

FRAME_TABLE = "frames"
"""The Reverb frame replay's table."""


class ReverbFrameStore(ReplayStore):
    """The Reverb frame replay: unique frames in a Reverb table, sampled on the host."""

    name = "reverb"

    def make_tables(self, environment_spec: Any) -> list:
        from magi_lp.replay.frame_replay import make_frame_replay_table

        spec = self.builder.frame_replay(environment_spec)
        return [
            make_frame_replay_table(
                FRAME_TABLE,
                spec.capacity,
                frame_shape=spec.frame_shape,
                action_spec=environment_spec.actions,
                frame_stack=spec.frame_stack,
                n_step=spec.n_step,
                rate_limiter=self.builder.replay_schedule().rate_limiter(),
            )
        ]

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        del writer  # every writer has a stream of its own in the table
        from magi_lp.replay.frame_replay import FrameStackAdder

        spec = self.builder.frame_replay(environment_spec)
        min_size = self.builder.replay_schedule().min_replay_size
        # Every environment of every configured actor, in one process too (as it always was).
        writers = int(self.config.num_actors) * int(self.config.envs_per_actor)
        return FrameStackAdder(
            reverb_client_of(replay),
            FRAME_TABLE,
            frame_stack=spec.frame_stack,
            n_step=spec.n_step,
            channels=spec.frame_shape[-1],
            # Sent at once until this adder's share of what learning starts with is in.
            eager_items=-(-min_size // writers),
            should_stop=should_stop,
        )

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> LearnerReplay:
        del key  # Reverb samples
        from magi_lp.replay.frame_replay import make_frame_replay_dataset

        spec = self.builder.frame_replay(environment_spec)
        dataset = make_frame_replay_dataset(
            replay_client.server_address,
            FRAME_TABLE,
            batch_size=spec.batch_size,
            frame_stack=spec.frame_stack,
            n_step=spec.n_step,
            discount=spec.discount,
            stack_on_host=False,
            num_parallel_calls=int(self.config.agent.get("dataset_num_parallel_calls", 2)),
        )
        return LearnerReplay(dataset, replay_client)
