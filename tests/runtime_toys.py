"""A tiny real experiment for the fast runtime tests: TD3 on a toy environment.

The agent is the real TD3 project (builder, learner, policy); only the environment is a toy
(no MuJoCo, no rendering), so the toolkit's wiring runs in seconds.
"""

from __future__ import annotations

import functools

import dm_env
import ml_collections
import numpy as np
from dm_env import specs

from magi_lp.placement.resources import resource_spec
from magi_lp.replay.reverb_seam import without_rate_limit
from magi_lp.runtime.config import NODE_GROUPS, experiment_defaults
from magi_lp.runtime.experiment import Experiment
from projects.td3.builder import TD3Builder
from projects.td3.config import get_agent_config
from projects.td3.networks import make_networks

EPISODE_STEPS = 10


class ReachZero(dm_env.Environment):
    """A point on a line: observation (x, time left); the action moves x; reward -|x|."""

    def __init__(self, seed: int, episode_steps: int = EPISODE_STEPS):
        self._rng = np.random.default_rng(seed)
        self._episode_steps = episode_steps
        self._x = 0.0
        self._t = 0

    def _observation(self) -> np.ndarray:
        left = 1.0 - self._t / self._episode_steps
        return np.array([self._x, left], np.float32)

    def reset(self) -> dm_env.TimeStep:
        self._x = float(self._rng.uniform(-1, 1))
        self._t = 0
        return dm_env.restart(self._observation())

    def step(self, action) -> dm_env.TimeStep:
        self._x = float(np.clip(self._x + 0.5 * float(np.asarray(action)[0]), -2, 2))
        self._t += 1
        reward = np.float32(-abs(self._x))
        one = np.float32(1.0)
        if self._t >= self._episode_steps:
            return dm_env.truncation(reward, self._observation(), one)
        return dm_env.transition(reward, self._observation(), one)

    def observation_spec(self) -> specs.Array:
        return specs.Array((2,), np.float32, "observation")

    def action_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((1,), np.float32, -1.0, 1.0, "action")

    def reward_spec(self) -> specs.Array:
        return specs.Array((), np.float32, "reward")

    def discount_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray((), np.float32, 0.0, 1.0, "discount")


def make_reach_zero(seed: int, evaluation: bool) -> ReachZero:
    del evaluation
    return ReachZero(seed)


def toy_config(max_actor_steps: int = 200) -> ml_collections.ConfigDict:
    """An experiment config at toy sizes: every node on the CPU, no rendering."""
    config = experiment_defaults()
    config.max_actor_steps = max_actor_steps
    config.variable_update_period = 5
    config.isolation = "off"
    config.checkpoint.every_minutes = 1000.0
    config.evaluation.episodes = 1
    config.evaluation.every_actor_steps = 100
    config.logging.tensorboard = False
    config.logging.terminal = False
    config.logging.time_delta = 0.0
    for group in NODE_GROUPS:
        config.resources[group] = resource_spec(device="cpu", render="none", cpu_threads=1)
    agent = get_agent_config()
    agent.batch_size = 8
    agent.n_step = 1
    agent.min_replay_size = 20
    agent.random_action_steps = 10
    agent.hidden_sizes = (8, 8)
    agent.replay_size = 1_000
    agent.dataset_num_parallel_calls = 1
    config.agent = agent
    return config


class UnlimitedTD3Builder(TD3Builder):
    """TD3 whose replay never blocks an actor, for threaded test launches.

    In Launchpad's `test_mt` every node is a thread of the test process and the test's
    cleanup waits for all of them; an actor blocked by the rate limiter once the learner has
    stopped sampling would never return (a real launch kills its processes instead).
    """

    def make_replay_tables(self, environment_spec):
        return [without_rate_limit(t) for t in super().make_replay_tables(environment_spec)]


def toy_experiment(config: ml_collections.ConfigDict, *, rate_limited: bool = True) -> Experiment:
    """TD3 on `ReachZero` (with `rate_limited=False`: replay that never blocks)."""
    builder_class = TD3Builder if rate_limited else UnlimitedTD3Builder
    return Experiment(
        builder=builder_class(config.agent),
        environment_factory=make_reach_zero,
        network_factory=functools.partial(
            make_networks, hidden_sizes=tuple(config.agent.hidden_sizes)
        ),
        config=config,
    )
