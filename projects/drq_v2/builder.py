"""`DrQBuilder`: DrQ-v2 on the magi_lp builder protocol (replay, adder, dataset, learner,
policy). The runners call each method in the process that owns the piece.

Replay: `magi_lp.agent.frame_replay`, which stores every rendered frame once and computes the
n-step return and the bootstrap discount at sample time. The learner gets each transition's
unique frames (a `FrameTransition`) and stacks the observations on its own device
(`projects.drq_v2.learning`'s batch contract): host-side stacking, a channels-last
transpose of every batch, cost more CPU than reading the replay itself.

Units: the agent config counts frames where the paper does (`min_replay_frames`); replay and
schedules count agent steps (one policy call = `action_repeat` frames).

The global agent step. The random first `num_expl_steps` agent steps and the exploration
noise schedule are functions of the agent steps taken by ALL actors together. The replay
schedule turns the learner's update count into a lower bound on that step
(`ReplaySchedule.actor_steps_after_updates`): the learner uses it for its noise schedule, and
serves it with the policy parameters, so each actor acts at `max(own steps, that bound)`
(`projects.drq_v2.acting.agent_step`). Exact in one process, within the rate limiter's error
buffer with N actors, independent of N, and it survives a restart (the update count is
checkpointed): a resumed run neither repeats the random phase nor restarts the noise schedule.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import ml_collections
import numpy as np
import reverb
from acme import adders, specs
from acme.utils import counting, loggers

from magi_lp import ActorCore, AgentBuilder, ConfigError, ReplaySchedule
from magi_lp.agent.frame_replay import (
    FrameStackAdder,
    frame_shape_from_observation,
    frame_transition_shape,
    make_frame_replay_dataset,
    make_frame_replay_table,
)
from magi_lp.agent.frame_store import FrameReplaySpec
from magi_lp.agent.frame_window import FrameTransition
from projects.drq_v2.acting import DrQActorState, make_actor_core
from projects.drq_v2.config import replay_schedule, validate_config
from projects.drq_v2.learner import DrQLearner
from projects.drq_v2.networks import DrQNetworks

TABLE_NAME = "frames"
"""The Reverb table the adder writes to and the dataset reads from."""


class DrQBuilder(AgentBuilder[DrQNetworks, FrameTransition]):
    """Builds DrQ-v2's pieces from the agent config; holds nothing heavier than configs."""

    # Both entry points call this before any process starts.
    validate_config = staticmethod(validate_config)

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        frame_stack: int,
        action_repeat: int,
        table_name: str = TABLE_NAME,
        replay_writers: int = 1,
        image_size: int = 84,
    ):
        """Creates the builder.

        Args:
          config: the agent config (`projects.drq_v2.config.get_agent_config(...)`).
          frame_stack: frames per observation (the experiment's `env.frame_stack`).
          action_repeat: frames per agent step (`env.action_repeat`); converts
            `min_replay_frames` to agent steps.
          table_name: the Reverb table.
          replay_writers: adders writing to the replay at once (actors x environments per
            actor): each sends its share of `min_replay_size` items unchunked
            (`FrameStackAdder`'s `eager_items`), so the replay reaches the size learning
            starts at sooner, and no adder stays in that slower mode any longer.
          image_size: rendered frames are image_size x image_size RGB (`env.image_size`).
        """
        for name, value in (
            ("env.frame_stack", frame_stack),
            ("env.action_repeat", action_repeat),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        self._config = config
        self._frame_stack = frame_stack
        self._action_repeat = action_repeat
        self._table_name = table_name
        if isinstance(replay_writers, bool) or not isinstance(replay_writers, int):
            raise ConfigError(f"replay_writers must be an integer >= 1, got {replay_writers!r}")
        self._replay_writers = max(replay_writers, 1)
        self._image_size = int(image_size)

    def frame_replay(self, environment_spec: specs.EnvironmentSpec | None) -> FrameReplaySpec:
        """Frames of `image_size`^2 RGB, stacked `frame_stack`, n-step transitions."""
        frame_shape = (self._image_size, self._image_size, 3)
        actions = None if environment_spec is None else environment_spec.actions
        if environment_spec is not None:
            frame_shape = frame_shape_from_observation(
                environment_spec.observations.shape, self._frame_stack
            )
        return FrameReplaySpec(
            frame_shape=tuple(frame_shape),
            frame_stack=self._frame_stack,
            n_step=int(self._config.n_step),
            discount=float(self._config.discount),
            capacity=int(self._config.replay_buffer_size),
            batch_size=int(self._config.batch_size),
            action_shape=() if actions is None else tuple(actions.shape),
            action_dtype="float32" if actions is None else str(np.dtype(actions.dtype)),
        )

    def replay_schedule(self) -> ReplaySchedule:
        return replay_schedule(self._config, self._action_repeat)

    def make_replay_tables(self, environment_spec: specs.EnvironmentSpec) -> list[reverb.Table]:
        frame_shape = frame_shape_from_observation(
            environment_spec.observations.shape, self._frame_stack
        )
        # Reverb compresses every chunk (Snappy; no switch in 0.7.0); the adder's chunks of
        # several consecutive frames let it share the static background between frames.
        return [
            make_frame_replay_table(
                self._table_name,
                int(self._config.replay_buffer_size),
                frame_shape=frame_shape,
                action_spec=environment_spec.actions,
                frame_stack=self._frame_stack,
                n_step=int(self._config.n_step),
                rate_limiter=self.replay_schedule().rate_limiter(),
            )
        ]

    def make_adder(
        self, replay_client: reverb.Client, environment_spec: specs.EnvironmentSpec
    ) -> adders.Adder:
        frame_shape = frame_shape_from_observation(
            environment_spec.observations.shape, self._frame_stack
        )
        return FrameStackAdder(
            replay_client,
            self._table_name,
            frame_stack=self._frame_stack,
            n_step=int(self._config.n_step),
            channels=frame_shape[-1],
            # Sent at once until this adder's share of what learning starts with is in.
            eager_items=-(-self.replay_schedule().min_replay_size // self._replay_writers),
        )

    def make_dataset_iterator(self, replay_client: reverb.Client) -> Iterator[FrameTransition]:
        # `server_address` works for an in-process server and for a Launchpad node's client.
        # The update stacks the frames on the learner's device (see the module docstring).
        return make_frame_replay_dataset(
            replay_client.server_address,
            self._table_name,
            batch_size=int(self._config.batch_size),
            frame_stack=self._frame_stack,
            n_step=int(self._config.n_step),
            discount=float(self._config.discount),
            stack_on_host=False,
            num_parallel_calls=int(self._config.dataset_num_parallel_calls),
        )

    def make_learner(
        self,
        random_key: jax.Array,
        networks: DrQNetworks,
        dataset: Iterator[FrameTransition],
        environment_spec: specs.EnvironmentSpec,
        logger: loggers.Logger,
        counter: counting.Counter,
    ) -> DrQLearner:
        # The update compiles while actors fill the replay, for batches shaped like these.
        example_batch = frame_transition_shape(
            int(self._config.batch_size),
            frame_shape_from_observation(environment_spec.observations.shape, self._frame_stack),
            environment_spec.actions,
            frame_stack=self._frame_stack,
            n_step=int(self._config.n_step),
        )
        return DrQLearner(
            networks,
            self._config,
            self.replay_schedule(),
            dataset,
            random_key,
            environment_spec.observations,
            counter=counter,
            logger=logger,
            example_batch=example_batch,
        )

    def make_policy(
        self, networks: DrQNetworks, environment_spec: specs.EnvironmentSpec, evaluation: bool
    ) -> ActorCore[DrQActorState]:
        return make_actor_core(
            networks,
            self._config,
            evaluation=evaluation,
            observation_spec=environment_spec.observations,
        )
