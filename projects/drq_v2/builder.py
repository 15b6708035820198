"""`DrQBuilder`: DrQ-v2 on the magi_lp builder protocol (replay, adder, dataset, learner,
policies, actor). The runners call each method in the process that owns the piece.

Replay: `magi_lp.agent.frame_replay`, which stores every rendered frame once and rebuilds the
stacked observations, the n-step return and the bootstrap discount at sample time, so the
learner gets exactly its batch contract (`projects.drq_v2.learning`).

Units: the agent config counts frames where the paper does (`min_replay_frames`); replay and
schedules count agent steps (one policy call = `action_repeat` frames).

The global agent step. The random first `num_expl_steps` agent steps and the exploration
noise schedule are functions of the agent steps taken by ALL actors together. Each actor
counts its own steps; on top of that it pulls, with its parameters, the learner's update
count, which the replay schedule turns into a global step: the learner makes its first
update once `min_replay_size` steps are in replay and one more every
`update_every_steps` steps (enforced by the rate limiter in the distributed program, by
the runner in one process), so after u >= 1 updates at least
`min_replay_size + (u - 1) * update_every_steps` agent steps have been taken. The actor acts
at `max(own steps, that bound)` (`projects.drq_v2.acting.agent_step`). This is exact in one
process, within the rate limiter's error buffer with N actors, independent of N, and it
survives a restart (the learner's update count is checkpointed; actors' counts are not):
a resumed run neither repeats the random phase nor restarts the noise schedule. Before the
learner's first update the bound is 0 and each actor uses its own count; with the paper's
settings (num_expl_steps = min_replay_size = 2000) every actor is then still in the random
phase, which ends for all of them at the first parameter pull after the first update.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
import reverb
from acme import adders, core, specs, types
from acme.utils import counting, loggers

from magi_lp.agent.actor import GenericActor
from magi_lp.agent.actor_core import ActorCore
from magi_lp.agent.builder import AgentBuilder, ReplaySchedule, VariableSource
from magi_lp.agent.frame_replay import (
    FrameStackAdder,
    frame_shape_from_observation,
    make_frame_replay_dataset,
    make_frame_replay_table,
)
from magi_lp.agent.variable_client import VariableClient
from magi_lp.errors import ConfigError
from projects.drq_v2.acting import GLOBAL_AGENT_STEPS, DrQActorState, make_actor_core
from projects.drq_v2.config import frames_to_agent_steps
from projects.drq_v2.learner import DrQLearner
from projects.drq_v2.networks import DrQNetworks

TABLE_NAME = "frames"
"""The Reverb table the adder writes to and the dataset reads from."""

LEARNER_STEPS = "learner_steps"
"""Variable name under which the learner serves its update count."""


class DrQBuilderLearner(DrQLearner):
    """`DrQLearner` that also serves its update count as the variable `learner_steps`."""

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        others = [name for name in names if name != LEARNER_STEPS]
        values = dict(zip(others, super().get_variables(others), strict=True))
        values[LEARNER_STEPS] = np.asarray(self.state.steps, np.int32)
        return [values[name] for name in names]


class PolicyVariables:
    """What actors pull: the learner's 'policy' params plus the global agent-step bound.

    Wraps the variable source (the learner, or a Courier handle to it) so that one pull
    returns `{'encoder', 'actor', 'global_agent_steps'}`, placed once per pull on this
    process's default device, where the actor's jitted policy runs (otherwise the numpy
    arrays a Courier pull returns would be copied to the device at every step).
    """

    def __init__(self, source: VariableSource, schedule: ReplaySchedule):
        self._source = source
        self._min_replay_size = int(schedule.min_replay_size)
        self._steps_per_update = float(schedule.actor_steps_per_update)

    def global_agent_steps(self, learner_steps: int) -> int:
        """A lower bound on the agent steps of all actors after `learner_steps` updates."""
        if learner_steps < 1:
            return 0
        return int(self._min_replay_size + (learner_steps - 1) * self._steps_per_update)

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        if list(names) != ["policy"]:
            raise ValueError(f"PolicyVariables serves only ['policy'], not {list(names)}")
        policy, learner_steps = self._source.get_variables(["policy", LEARNER_STEPS])
        variables = dict(policy)
        bound = self.global_agent_steps(int(np.asarray(learner_steps)))
        variables[GLOBAL_AGENT_STEPS] = np.asarray(bound, np.int32)
        return [jax.device_put(variables)]


class DrQBuilder(AgentBuilder[DrQNetworks, ActorCore[DrQActorState], types.Transition]):
    """Builds DrQ-v2's pieces from the agent config; holds nothing heavier than configs."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        frame_stack: int,
        action_repeat: int,
        variable_update_period: int = 1,
        table_name: str = TABLE_NAME,
    ):
        """Creates the builder.

        Args:
          config: the agent config (`projects.drq_v2.config.get_agent_config(...)`).
          frame_stack: frames per observation (the experiment's `env.frame_stack`).
          action_repeat: frames per agent step (`env.action_repeat`); converts
            `min_replay_frames` to agent steps.
          variable_update_period: actor steps between parameter pulls (the experiment's
            `variable_update_period`).
          table_name: the Reverb table.
        """
        for name, value in (
            ("env.frame_stack", frame_stack),
            ("env.action_repeat", action_repeat),
            ("variable_update_period", variable_update_period),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        self._config = config
        self._frame_stack = frame_stack
        self._action_repeat = action_repeat
        self._variable_update_period = variable_update_period
        self._table_name = table_name

    @property
    def config(self) -> ml_collections.ConfigDict:
        """The agent config."""
        return self._config

    def replay_schedule(self) -> ReplaySchedule:
        """No updates before `min_replay_frames` frames; then one per `update_every_steps`."""
        min_steps = frames_to_agent_steps(int(self._config.min_replay_frames), self._action_repeat)
        # The first item exists only after n_step steps; in one process a learner step
        # before that would wait on an empty table in the thread that should fill it.
        return ReplaySchedule(
            min_replay_size=max(min_steps, int(self._config.n_step)),
            actor_steps_per_update=float(self._config.update_every_steps),
            batch_size=int(self._config.batch_size),
        )

    def make_replay_tables(
        self, environment_spec: specs.EnvironmentSpec, *, rate_limited: bool
    ) -> list[reverb.Table]:
        if rate_limited:
            rate_limiter = self.replay_schedule().rate_limiter()
        else:
            rate_limiter = reverb.rate_limiters.MinSize(1)
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
                rate_limiter=rate_limiter,
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
        )

    def make_dataset_iterator(self, replay_client: reverb.Client) -> Iterator[types.Transition]:
        # `server_address` works for an in-process server and for a Launchpad node's client.
        return make_frame_replay_dataset(
            replay_client.server_address,
            self._table_name,
            batch_size=int(self._config.batch_size),
            frame_stack=self._frame_stack,
            n_step=int(self._config.n_step),
            discount=float(self._config.discount),
            num_parallel_calls=int(self._config.dataset_num_parallel_calls),
        )

    def make_learner(
        self,
        random_key: jax.Array,
        networks: DrQNetworks,
        dataset: Iterator[types.Transition],
        environment_spec: specs.EnvironmentSpec,
        logger: loggers.Logger,
        counter: counting.Counter | None = None,
    ) -> DrQBuilderLearner:
        return DrQBuilderLearner(
            networks,
            self._config,
            dataset,
            random_key,
            environment_spec.observations,
            counter=counter,
            logger=logger,
        )

    def make_policy(
        self, networks: DrQNetworks, environment_spec: specs.EnvironmentSpec, evaluation: bool
    ) -> ActorCore[DrQActorState]:
        del environment_spec
        return make_actor_core(networks, self._config, evaluation=evaluation)

    def make_actor(
        self,
        random_key: jax.Array,
        policy: ActorCore[DrQActorState],
        environment_spec: specs.EnvironmentSpec,
        variable_source: VariableSource,
        adder: adders.Adder | None = None,
    ) -> core.Actor:
        del environment_spec
        client = VariableClient(
            PolicyVariables(variable_source, self.replay_schedule()),
            "policy",
            update_period=self._variable_update_period,
        )
        return GenericActor(policy, random_key, client, adder)
