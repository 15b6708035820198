"""`Experiment`: everything one run needs, distributed or in one process.

An experiment is an agent builder plus the factories that make its environment and networks
inside each node, and the experiment config (see `magi_lp.runtime.config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import dm_env
import ml_collections

from magi_lp.acme_api import specs
from magi_lp.agent.builder import AgentBuilder

EnvironmentFactory = Callable[[int, bool], dm_env.Environment]
"""(seed, evaluation) -> environment. Called once inside each actor or evaluator node."""

NetworkFactory = Callable[[specs.EnvironmentSpec], Any]
"""environment spec -> the agent's networks (pure functions, no parameters yet)."""


@dataclasses.dataclass
class Experiment:
    """Everything needed to run one experiment, distributed or in one process.

    Attributes:
      builder: the agent's builder.
      environment_factory: makes a seeded environment inside each actor/evaluator node.
      network_factory: makes the agent's networks from the environment spec.
      config: the experiment config (ml_collections), see docs/architecture.md.
      evaluation_observers: zero-argument factories, each called once inside every
        evaluator process to make an observer with `observe_first(timestep)`,
        `observe(timestep, action)` and `episode_done(episode_return)` (see
        `acting_loop.ActingLoop`); e.g. a video recorder. Must be picklable.
      environment_spec: the environment's spec; made once from a throwaway environment
        (in the launching process) when not given.
      frames_per_step: environment frames per agent step (the action repeat), so that
        logs and progress can count frames as papers do.
    """

    builder: AgentBuilder
    environment_factory: EnvironmentFactory
    network_factory: NetworkFactory
    config: ml_collections.ConfigDict
    environment_spec: specs.EnvironmentSpec | None = None
    evaluation_observers: Sequence[Callable[..., Any]] = ()
    frames_per_step: int = 1

    def get_environment_spec(self) -> specs.EnvironmentSpec:
        """The environment spec, made once from a throwaway environment when not given."""
        if self.environment_spec is None:
            environment = self.environment_factory(0, False)
            self.environment_spec = specs.make_environment_spec(environment)
            environment.close()
        return self.environment_spec
