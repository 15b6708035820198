"""The paper's tasks and the one experiment config every DrQ-v2 config file derives from.

Yarats et al. 2021 ("Mastering Visual Continuous Control: Improved Data-Augmented
Reinforcement Learning") train on 23 DeepMind Control tasks from pixels, in three groups
that fix the training length and the exploration-noise schedule:

    easy   (1.1M frames):  cartpole_balance, cartpole_balance_sparse, cartpole_swingup,
                           cup_catch, finger_spin, hopper_stand, pendulum_swingup,
                           walker_stand, walker_walk
    medium (3.1M frames):  acrobot_swingup, cartpole_swingup_sparse, cheetah_run,
                           finger_turn_easy, finger_turn_hard, hopper_hop, quadruped_run,
                           quadruped_walk, reacher_easy, reacher_hard, walker_run
    hard   (30.1M frames): humanoid_stand, humanoid_walk, humanoid_run

`make_config(task_name, distributed)` builds a complete experiment config for one of them
on top of `magi_lp.runtime.config.experiment_defaults()`: the group, the per-task
hyperparameter overrides (walker: n-step 1 and batch 512; humanoid: learning rate 8e-5
and feature dim 100; quadruped_run: replay 100k) and the camera come from
`projects.drq_v2.config`. Each `configs/<task>.py` is a three-line `get_config` calling
`task_config`, so `--config configs/walker_walk.py` runs in one process and
`--config configs/walker_walk.py:distributed` with the distributed layout.
"""

from __future__ import annotations

import ml_collections

from magi_lp import ConfigError, experiment_defaults, resource_spec
from magi_lp.config_schema import fact_refusal, not_among
from projects.drq_v2.config import (
    TASK_DIFFICULTY,
    frames_to_agent_steps,
    get_agent_config,
    get_env_config,
    train_frames,
)

# Task name (the paper's, and the config file's) -> dm_control suite (domain, task).
PAPER_TASKS: dict[str, tuple[str, str]] = {
    # easy
    "cartpole_balance": ("cartpole", "balance"),
    "cartpole_balance_sparse": ("cartpole", "balance_sparse"),
    "cartpole_swingup": ("cartpole", "swingup"),
    "cup_catch": ("ball_in_cup", "catch"),
    "finger_spin": ("finger", "spin"),
    "hopper_stand": ("hopper", "stand"),
    "pendulum_swingup": ("pendulum", "swingup"),
    "walker_stand": ("walker", "stand"),
    "walker_walk": ("walker", "walk"),
    # medium
    "acrobot_swingup": ("acrobot", "swingup"),
    "cartpole_swingup_sparse": ("cartpole", "swingup_sparse"),
    "cheetah_run": ("cheetah", "run"),
    "finger_turn_easy": ("finger", "turn_easy"),
    "finger_turn_hard": ("finger", "turn_hard"),
    "hopper_hop": ("hopper", "hop"),
    "quadruped_run": ("quadruped", "run"),
    "quadruped_walk": ("quadruped", "walk"),
    "reacher_easy": ("reacher", "easy"),
    "reacher_hard": ("reacher", "hard"),
    "walker_run": ("walker", "run"),
    # hard
    "humanoid_stand": ("humanoid", "stand"),
    "humanoid_walk": ("humanoid", "walk"),
    "humanoid_run": ("humanoid", "run"),
}

DISTRIBUTED_ACTORS = 4
"""CPU actor processes in the distributed layout."""

EVALUATION_EVERY_FRAMES = 10_000  # the official `eval_every_frames`
EVALUATION_EPISODES = 10  # the official `num_eval_episodes`


def make_config(task_name: str, distributed: bool = False) -> ml_collections.ConfigDict:
    """The experiment config of one of the paper's tasks, with the paper's settings.

    Args:
      task_name: a key of `PAPER_TASKS`, e.g. "reacher_hard".
      distributed: the distributed layout (`DISTRIBUTED_ACTORS` CPU actors pulling
        parameters every 100 steps) instead of the single-process one (one actor that
        sees every update, as in the paper's code). Both carry the same resources.

    Raises:
      ConfigError: an unknown task name (the message lists the valid ones).
    """
    if task_name not in PAPER_TASKS:
        what = f"{task_name!r} is not one of the paper's tasks"
        raise not_among(what, task_name, list(PAPER_TASKS), "they")
    domain, task = PAPER_TASKS[task_name]
    env = get_env_config(domain, task)
    agent = get_agent_config(domain, task)

    config = experiment_defaults()
    config.seed = 0
    # Agent steps summed over actors: the paper's frames / action repeat.
    config.max_actor_steps = frames_to_agent_steps(train_frames(domain, task), env.action_repeat)
    config.num_actors = DISTRIBUTED_ACTORS if distributed else 1
    config.num_evaluators = 1
    # In one process a pull is a dict lookup on the in-process learner: take every update.
    # Across processes it is a ~12 MB Courier call (84x84 policy): every 100 actor steps.
    config.variable_update_period = 100 if distributed else 1
    config.colocate_learner_and_replay = False
    config.isolation = "auto"
    config.checkpoint.enabled = True
    config.checkpoint.every_minutes = 10.0
    config.checkpoint.reverb = False
    config.evaluation.episodes = EVALUATION_EPISODES
    config.evaluation.every_actor_steps = frames_to_agent_steps(
        EVALUATION_EVERY_FRAMES, env.action_repeat
    )
    # Resources: the toolkit's defaults (experiment_defaults(); actors and the evaluator on
    # the CPU rendering with EGL, the rest on the CPU rendering nothing) but for the learner,
    # which takes a GPU when there is one, else the CPU, and the plan prints a one-line
    # notice. On a GPU its memory is what its compiled update, state and replay store need
    # ('auto', reckoned before launch; --config.resources.learner.gpu_memory=0.5 for a fixed
    # share). It renders nothing: it gets the spec, not an environment.
    config.resources.learner = resource_spec(
        device="gpu_if_available", gpu_memory="auto", render="none"
    )

    config.env = env  # with its evaluation video (env.video: projects/drq_v2/video.py)
    config.agent = agent
    return config


def task_config(task_name: str, mode: str = "") -> ml_collections.ConfigDict:
    """`make_config` for a config file's `get_config(mode)`.

    `mode` is what follows the file name in `--config configs/<task>.py:<mode>`:
    '' or 'single' for one process, 'distributed' for the distributed layout, its actors
    sized to the machine (`num_actors='auto'`, `envs_per_actor='auto'`).
    """
    if mode not in ("", "single", "distributed"):
        raise ConfigError(
            fact_refusal(
                f"config argument {mode!r} is not a mode",
                "",
                f"use configs/{task_name}.py (one process) or configs/{task_name}.py:distributed",
            )
        )
    config = make_config(task_name, distributed=mode == "distributed")
    if mode == "distributed":  # run by lp_main.py: actors sized to the machine it runs on
        config.num_actors = "auto"
        config.envs_per_actor = "auto"
    return config


def paper_task_names(difficulty: str | None = None) -> list[str]:
    """The paper's task names, all or of one group ('easy', 'medium', 'hard')."""
    return [
        name
        for name, key in PAPER_TASKS.items()
        if difficulty is None or TASK_DIFFICULTY[key] == difficulty
    ]
