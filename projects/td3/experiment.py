"""The TD3 experiment: builder + environment factory + network factory + config.

`make_experiment(config)` is what `main.py` and `lp_main.py` hand to the toolkit's entry points.
The factories are picklable partials of module-level functions, so Launchpad can ship them to
every node and each node builds its own environment and networks.
"""

from __future__ import annotations

import functools

import ml_collections

from magi_lp import Experiment
from projects.td3.builder import TD3Builder
from projects.td3.environment import make_environment
from projects.td3.networks import make_networks


def make_experiment(config: ml_collections.ConfigDict) -> Experiment:
    """TD3 on `config.env.domain`/`config.env.task` (e.g. configs/td3_cartpole.py)."""
    agent = config.agent
    return Experiment(
        builder=TD3Builder(agent),
        environment_factory=functools.partial(
            make_environment,
            config.env.domain,
            config.env.task,
            action_repeat=int(config.env.action_repeat),
            max_episode_steps=int(config.env.max_episode_steps),
        ),
        network_factory=functools.partial(make_networks, hidden_sizes=tuple(agent.hidden_sizes)),
        config=config,
        frames_per_step=int(config.env.action_repeat),
    )
