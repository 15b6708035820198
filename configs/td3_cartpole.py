"""TD3 on cartpole/balance from proprioceptive states: the small experiment the tests run.

Why this task: a 5-d state and a 1-d action keep an update at a few milliseconds on one CPU
core, and learning shows within minutes without a GPU at `--config.env.action_repeat=4` (as
BENCHMARKS.md's figure 6 runs it; at this config's repeat of 1 it takes far more steps).
cartpole/swingup is the harder next step (`--config.env.task=swingup`, plan on 100k steps).

Toolkit keys and their defaults: magi_lp/runtime/config.py; agent keys:
projects/td3/config.py. Override any key with `--config.<key>=value`.
"""

from __future__ import annotations

import ml_collections

from magi_lp import experiment_defaults, resource_spec
from projects.td3.config import get_agent_config, get_env_config


def get_config() -> ml_collections.ConfigDict:
    """The experiment config."""
    config = experiment_defaults()
    config.max_actor_steps = 30_000  # agent steps summed over actors; then the run stops
    config.checkpoint.every_minutes = 5.0
    config.evaluation.episodes = 5
    config.evaluation.every_actor_steps = 5_000
    config.logging.tensorboard = False
    config.logging.wandb_project = "magi_lp"

    # State-based: no node renders, no node needs a GPU; the learner gets two threads.
    for group in ("replay", "counter", "actor", "evaluator", "coordinator"):
        config.resources[group] = resource_spec(device="cpu", cpu_threads=1, render="none")
    config.resources.learner = resource_spec(device="cpu", cpu_threads=2, render="none")

    config.env = get_env_config()  # cartpole/balance, action repeat 1

    config.agent = get_agent_config()
    return config
