"""TD3 on cartpole/balance from proprioceptive states: the small experiment the tests run.

Why this task: a 5-d state and a 1-d action keep an update at a few milliseconds on one CPU
core, and learning shows within minutes without a GPU. Measured in one process on a shared
2-core CPU (~65-80 agent steps/s, one seed): evaluation return ~200 at the start, ~990 (of
1000) by 25k agent steps (~6 min), 600-990 from there to 40k (the balance is not yet
stable). With the paper's 1-step targets (`agent.n_step=1`) it was ~500 at 40k.
cartpole/swingup is the harder next step (`--config.env.task=swingup`, plan on 100k steps).


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
    config.seed = 0  # every node's seed is derived from this one (magi_lp.runtime.seeding)
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
