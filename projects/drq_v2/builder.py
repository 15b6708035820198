"""`DrQBuilder`: DrQ-v2 on the magi_lp builder protocol (what it stores, learner, policy).
The runners call each method in the process that owns the piece.

Replay: DrQ-v2 only says what it stores (`frame_replay`: 84x84 RGB frames stacked 3, n-step
3 transitions, 1M of them); the toolkit serves it (`magi_lp.replay.stores`): the device
frame store on the learner's device, or the Reverb frame replay, as `config.replay.store`
chooses. Either way each rendered frame is stored once, the n-step return and bootstrap
discount come with each transition, and the learner gets each transition's unique frames
(a `FrameTransition`) and stacks the observations on its own device
(`projects.drq_v2.learning`'s batch contract).

Units: the agent config counts frames where the paper does (`min_replay_frames`); replay and
schedules count agent steps (one policy call = `action_repeat` frames).

The global agent step. The random first `num_expl_steps` agent steps and the exploration
noise schedule are functions of the agent steps taken by ALL actors together. The replay
schedule turns the learner's update count into a lower bound on that step
(`ReplaySchedule.actor_steps_after_updates`): the learner uses it for its noise schedule, and
serves it with the policy parameters, so each actor acts at `max(own steps, that bound)`
(`projects.drq_v2.acting.agent_step`). Exact in one process, within the replay ratio's error
buffer with N actors, independent of N, and it survives a restart (the update count is
checkpointed): a resumed run neither repeats the random phase nor restarts the noise schedule.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

from magi_lp import ActorCore, AgentBuilder, FrameReplaySpec, ReplaySchedule
from magi_lp.acme_api import counting, loggers, specs
from magi_lp.replay.frame_store import transition_shape
from magi_lp.replay.frame_window import FrameTransition, frame_shape_from_observation
from projects.drq_v2.acting import DrQActorState, make_actor_core
from projects.drq_v2.config import replay_schedule
from projects.drq_v2.learner import DrQLearner
from projects.drq_v2.networks import DrQNetworks


class DrQBuilder(AgentBuilder[DrQNetworks, FrameTransition]):
    """Builds DrQ-v2's pieces from the agent config; holds nothing heavier than configs."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        frame_stack: int,
        action_repeat: int,
        image_size: int = 84,
    ):
        """Creates the builder.

        Args:
          config: the agent config (`projects.drq_v2.config.get_agent_config(...)`).
          frame_stack: frames per observation (the experiment's `env.frame_stack`).
          action_repeat: frames per agent step (`env.action_repeat`); converts
            `min_replay_frames` to agent steps.
          image_size: rendered frames are image_size x image_size RGB (`env.image_size`).

        The three sizes are checked once, by `projects.drq_v2.config.validate_config`.
        """
        self._config = config
        self._frame_stack = frame_stack
        self._action_repeat = action_repeat
        self._image_size = image_size

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
        example_batch = transition_shape(self.frame_replay(environment_spec))
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
