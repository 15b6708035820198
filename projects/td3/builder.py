"""`TD3Builder`: the magi_lp builder protocol for TD3 (replay, adder, dataset, learner,
policy). The runners call each method in the process that owns the piece.

Replay holds one-step (or n-step) transitions written by Acme's `NStepTransitionAdder` into
one uniform FIFO table; the learner reads batches through `acme.datasets.make_reverb_dataset`.
Where Reverb is not installed (the current stack, one process), the toolkit serves the same
transitions from host memory (`transition_replay`); Reverb is imported only where it is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import ml_collections

from magi_lp import ActorCore, AgentBuilder, ReplaySchedule, TransitionReplaySpec
from magi_lp.acme_api import adders, counting, loggers, specs
from projects.td3.acting import TD3ActorState, make_actor_core
from projects.td3.learning import TD3Learner
from projects.td3.networks import TD3Networks

if TYPE_CHECKING:
    import reverb

TABLE = "priority_table"
"""The Reverb table (Acme's `adders.reverb.DEFAULT_PRIORITY_TABLE`)."""


class TD3Builder(AgentBuilder[TD3Networks, Any]):
    """Builds TD3's pieces from the agent config; holds nothing heavier than the config."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        *,
        table_name: str = TABLE,
    ):
        """Creates the builder.

        Args:
          config: the agent config (`projects.td3.config.get_agent_config()`).
          table_name: the Reverb table the adder writes to and the dataset reads from.
        """
        self._config = config
        self._table_name = table_name

    def replay_schedule(self) -> ReplaySchedule:
        return ReplaySchedule(
            min_replay_size=int(self._config.min_replay_size),
            actor_steps_per_update=float(self._config.actor_steps_per_update),
            batch_size=int(self._config.batch_size),
        )

    def transition_replay(
        self, environment_spec: specs.EnvironmentSpec | None
    ) -> TransitionReplaySpec:
        del environment_spec
        return TransitionReplaySpec(
            capacity=int(self._config.replay_size),
            batch_size=int(self._config.batch_size),
            n_step=int(self._config.n_step),
            discount=float(self._config.discount),
        )

    def make_replay_tables(self, environment_spec: specs.EnvironmentSpec) -> list[reverb.Table]:
        import reverb
        from acme.adders import reverb as adders_reverb

        return [
            reverb.Table(
                name=self._table_name,
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                max_size=int(self._config.replay_size),
                rate_limiter=self.replay_schedule().rate_limiter(),
                signature=adders_reverb.NStepTransitionAdder.signature(environment_spec),
            )
        ]

    def make_adder(
        self, replay_client: reverb.Client, environment_spec: specs.EnvironmentSpec
    ) -> adders.Adder:
        del environment_spec
        from acme.adders import reverb as adders_reverb

        return adders_reverb.NStepTransitionAdder(
            client=replay_client,
            n_step=int(self._config.n_step),
            discount=float(self._config.discount),
            priority_fns={self._table_name: None},
        )

    def make_dataset_iterator(self, replay_client: reverb.Client) -> Iterator[reverb.ReplaySample]:
        # Imported here: only the learner's process pays for TensorFlow.
        from acme import datasets

        dataset = datasets.make_reverb_dataset(
            server_address=replay_client.server_address,
            table=self._table_name,
            batch_size=int(self._config.batch_size),
            num_parallel_calls=int(self._config.dataset_num_parallel_calls),
        )
        return dataset.as_numpy_iterator()

    def make_learner(
        self,
        random_key: jax.Array,
        networks: TD3Networks,
        dataset: Iterator[Any],
        environment_spec: specs.EnvironmentSpec,
        logger: loggers.Logger,
        counter: counting.Counter,
    ) -> TD3Learner:
        del environment_spec  # The networks already know the sizes.
        return TD3Learner(
            networks, self._config, dataset, random_key, logger=logger, counter=counter
        )

    def make_policy(
        self, networks: TD3Networks, environment_spec: specs.EnvironmentSpec, evaluation: bool
    ) -> ActorCore[TD3ActorState]:
        del environment_spec
        return make_actor_core(networks, self._config, evaluation=evaluation)
