"""`DrQLearner`: DrQ-v2's jitted update (`learning.py`) on the toolkit's `JaxLearner`.

Actors pull 'policy': the encoder and actor parameters plus `global_agent_steps`, the agent
steps all actors together have taken at least, derived from the update count by the replay
schedule (`projects.drq_v2.acting` explores at that step).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from magi_lp import JaxLearner, ReplaySchedule
from projects.drq_v2.acting import GLOBAL_AGENT_STEPS
from projects.drq_v2.learning import (
    TrainingState,
    init_training_state,
    make_update_fn,
    policy_params,
)
from projects.drq_v2.networks import DrQNetworks


class DrQLearner(JaxLearner[TrainingState]):
    """Variables: 'policy' (what actors pull), 'encoder', 'actor', 'critic', 'params'."""

    def __init__(
        self,
        networks: DrQNetworks,
        config: ml_collections.ConfigDict,
        schedule: ReplaySchedule,
        iterator: Iterator[Any],
        key: jax.Array,
        obs_example: Any,
        *,
        counter: Any | None = None,
        logger: Any | None = None,
        example_batch: Any = None,
    ):
        """Creates the learner with fresh parameters.

        Args:
          networks: from `make_networks`.
          config: the agent config.
          schedule: the replay schedule (`projects.drq_v2.config.replay_schedule`).
          iterator: training batches (see `learning.py` for the contract).
          key: the learner's key (parameter init, augmentation, noise).
          obs_example: one observation, or its spec.
          counter, logger, example_batch: see `JaxLearner`.
        """
        super().__init__(
            make_update_fn(networks, config, schedule),
            # A function: with example_batch the update compiles while the state is made.
            functools.partial(init_training_state, networks, config, key, obs_example),
            iterator,
            counter=counter,
            logger=logger,
            example_batch=example_batch,
        )
        self._schedule = schedule

    def variables(self, state: TrainingState) -> Mapping[str, Any]:
        params = state.params
        global_steps = self._schedule.actor_steps_after_updates(state.steps)
        return {
            "policy": {
                **policy_params(state),
                GLOBAL_AGENT_STEPS: jnp.asarray(global_steps, jnp.int32),
            },
            "encoder": params["encoder"],
            "actor": params["actor"],
            "critic": params["critic"],
            "params": params,
        }

    @property
    def num_updates(self) -> int:
        """Updates done, restored ones included."""
        return int(self.state.steps)
