"""TD3 on cartpole/balance from proprioceptive states: the small experiment the tests run.

Why this task: its 5-d state and 1-d action make an update about a millisecond on one CPU
core, and a good policy (return 800-1000 of 1000) is reached within minutes on a 2-core
CPU, so it shows learning without a GPU. cartpole/swingup is the harder next step
(`--config.env.task=swingup`, plan on 50k+ steps).


Every key below is described in docs/architecture.md; `agent` is projects/td3/config.py.
"""

from __future__ import annotations

import ml_collections

from projects.td3.config import get_agent_config


def _cpu(threads: int = 1) -> dict:
    # State-based: no node renders, no node needs a GPU.
    return {"device": "cpu", "cpu_threads": threads, "render": "none"}


def get_config() -> ml_collections.ConfigDict:
    """The experiment config; override any key with `--config.<key>=value`."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # every node's seed is derived from this one (magi_lp.seeding)
    config.max_actor_steps = 30_000  # agent steps summed over actors; then the run stops
    config.num_actors = 1  # actor processes in the distributed program
    config.num_evaluators = 1  # evaluator processes (0: no evaluation)
    config.variable_update_period = 100  # actor steps between non-blocking parameter pulls
    config.colocate_learner_and_replay = False  # one process for learner + Reverb server
    config.isolation = "auto"  # private network namespace for node RPC ports when possible

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.enabled = True  # learner checkpoints under <workdir>/checkpoints
    config.checkpoint.every_minutes = 5.0  # time between periodic learner checkpoints
    config.checkpoint.reverb = False  # also checkpoint the replay at the end of a run

    config.evaluation = ml_collections.ConfigDict()
    config.evaluation.episodes = 5  # deterministic-policy episodes per evaluation
    config.evaluation.every_actor_steps = 5_000  # actor steps between evaluations

    config.logging = ml_collections.ConfigDict()
    config.logging.csv = True  # <workdir>/logs/<label>/logs.csv
    config.logging.tensorboard = False  # <workdir>/tensorboard/<label>
    config.logging.wandb = False  # Weights & Biases (needs the wandb package and a login)
    config.logging.wandb_project = "magi_lp"
    config.logging.terminal = True  # one line per logger write on stdout
    config.logging.time_delta = 1.0  # seconds between rows a logger keeps (0: every row)

    config.resources = ml_collections.ConfigDict()
    config.resources.replay = _cpu()
    config.resources.counter = _cpu()
    config.resources.learner = _cpu(threads=2)
    config.resources.actor = _cpu()
    config.resources.evaluator = _cpu()
    config.resources.coordinator = _cpu()

    config.env = ml_collections.ConfigDict()
    config.env.domain = "cartpole"  # dm_control suite domain
    config.env.task = "balance"  # task of that domain
    config.env.action_repeat = 1  # physics control steps per agent step

    config.agent = get_agent_config()
    return config
