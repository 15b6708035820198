"""DrQ-v2 hyperparameters (agent) and task settings (environment), kept apart.

Defaults are those of the paper (Yarats et al. 2021, "Mastering Visual Continuous Control",
Table 1 / appendix) and of the official PyTorch code (facebookresearch/drqv2, `cfgs/`).
Units matter and are spelled out: an *agent step* is one call of the policy, i.e.
`action_repeat` environment *frames*.

    agent = get_agent_config('reacher', 'hard')   # paper defaults + that task's overrides
    env = get_env_config('reacher', 'hard')       # domain, task, pixels, action repeat, stacking
"""

from __future__ import annotations

import ml_collections

from magi_lp import ConfigChecker, ConfigError, ReplaySchedule

# Task -> difficulty group, as in the official `cfgs/task/*.yaml`. The group fixes the
# exploration-noise schedule length and the training length.
TASK_DIFFICULTY: dict[tuple[str, str], str] = {
    ("cartpole", "balance"): "easy",
    ("cartpole", "balance_sparse"): "easy",
    ("cartpole", "swingup"): "easy",
    ("ball_in_cup", "catch"): "easy",
    ("finger", "spin"): "easy",
    ("hopper", "stand"): "easy",
    ("pendulum", "swingup"): "easy",
    ("walker", "stand"): "easy",
    ("walker", "walk"): "easy",
    ("acrobot", "swingup"): "medium",
    ("cartpole", "swingup_sparse"): "medium",
    ("cheetah", "run"): "medium",
    ("finger", "turn_easy"): "medium",
    ("finger", "turn_hard"): "medium",
    ("hopper", "hop"): "medium",
    ("quadruped", "run"): "medium",
    ("quadruped", "walk"): "medium",
    ("reacher", "easy"): "medium",
    ("reacher", "hard"): "medium",
    ("walker", "run"): "medium",
    ("humanoid", "stand"): "hard",
    ("humanoid", "walk"): "hard",
    ("humanoid", "run"): "hard",
}

# Agent steps over which the exploration stddev decays linearly from 1.0 to 0.1.
STDDEV_DURATION_STEPS: dict[str, int] = {"easy": 100_000, "medium": 500_000, "hard": 2_000_000}

# Environment frames of training in the paper (frames = agent steps * action_repeat).
TRAIN_FRAMES: dict[str, int] = {"easy": 1_100_000, "medium": 3_100_000, "hard": 30_100_000}

# Per-task deviations from the defaults in the official configs.
_TASK_OVERRIDES: dict[tuple[str, str], dict] = {
    ("walker", "stand"): {"n_step": 1, "batch_size": 512},
    ("walker", "walk"): {"n_step": 1, "batch_size": 512},
    ("walker", "run"): {"n_step": 1, "batch_size": 512},
    ("quadruped", "run"): {"replay_buffer_size": 100_000},
    ("humanoid", "stand"): {"learning_rate": 8e-5, "feature_dim": 100},
    ("humanoid", "walk"): {"learning_rate": 8e-5, "feature_dim": 100},
    ("humanoid", "run"): {"learning_rate": 8e-5, "feature_dim": 100},
}


def task_difficulty(domain: str, task: str) -> str:
    """The paper's difficulty group of a task ('easy', 'medium', 'hard'); 'medium' if unlisted."""
    return TASK_DIFFICULTY.get((domain, task), "medium")


def train_frames(domain: str, task: str) -> int:
    """Environment frames the paper trains this task for."""
    return TRAIN_FRAMES[task_difficulty(domain, task)]


def frames_to_agent_steps(frames: int, action_repeat: int) -> int:
    """Agent steps in `frames` environment frames, e.g. min_replay_frames 4000 -> 2000 steps."""
    return frames // action_repeat


def replay_schedule(agent: ml_collections.ConfigDict, action_repeat: int) -> ReplaySchedule:
    """No updates before `min_replay_frames` frames; then one per `update_every_steps` steps.

    The first item exists only after `n_step` steps, so learning never starts before that
    (in one process a learner step on an empty table would wait forever).
    """
    min_steps = frames_to_agent_steps(int(agent.min_replay_frames), action_repeat)
    return ReplaySchedule(
        min_replay_size=max(min_steps, int(agent.n_step)),
        actor_steps_per_update=float(agent.update_every_steps),
        batch_size=int(agent.batch_size),
    )


def default_camera_id(domain: str) -> int:
    """Camera the paper renders from: the zoomed-in camera 2 for quadruped, 0 otherwise."""
    return 2 if domain == "quadruped" else 0


def get_agent_config(
    domain: str | None = None, task: str | None = None
) -> ml_collections.ConfigDict:
    """DrQ-v2 hyperparameters. With a task, the official per-task overrides are applied.

    Without arguments this is the paper's default ('medium' noise schedule).
    """
    config = ml_collections.ConfigDict()

    # --- optimisation -------------------------------------------------------------------
    config.learning_rate = 1e-4  # Adam, for encoder, critic and actor alike
    config.adam_eps = 1e-8  # PyTorch's Adam default, which the official code uses
    config.batch_size = 256  # transitions per update
    config.discount = 0.99  # gamma, per agent step
    config.n_step = 3  # n-step TD targets; the replay sums rewards over n agent steps
    config.critic_target_tau = 0.01  # soft target update: target <- tau*online + (1-tau)*target

    # --- networks -----------------------------------------------------------------------
    config.encoder_channels = 32  # channels of every conv layer
    config.encoder_num_layers = 4  # 3x3 convs; repr dim 32*35*35 = 39200 at 84x84
    config.encoder_kernel_size = 3
    config.encoder_first_stride = 2  # stride of the first conv; the others use stride 1
    config.feature_dim = 50  # width of the Linear -> LayerNorm -> tanh trunk (actor, critic)
    config.hidden_dim = 1024  # width of the two hidden layers of actor and Q heads

    # --- exploration and target-policy smoothing ----------------------------------------
    # Linear decay of the policy noise stddev, as a function of agent steps.
    config.stddev_schedule = ml_collections.ConfigDict(
        {"init": 1.0, "final": 0.1, "duration": STDDEV_DURATION_STEPS["medium"]}
    )
    config.stddev_clip = 0.3  # noise clip for target and actor-loss actions (not for acting)
    config.action_clamp_eps = 1e-6  # sampled actions are clamped to [-1+eps, 1-eps]
    config.num_expl_steps = 2000  # agent steps of uniform random actions at the start

    # --- data ---------------------------------------------------------------------------
    config.augmentation_pad = 4  # random shift: replicate-pad by this, shift by 0..2*pad px
    config.min_replay_frames = 4000  # no updates before this many environment frames
    config.update_every_steps = 2  # one update per this many agent steps (replay ratio)
    config.replay_buffer_size = 1_000_000  # transitions kept in replay
    config.dataset_num_parallel_calls = 2  # parallel Reverb readers feeding the learner

    if domain is not None and task is not None:
        difficulty = task_difficulty(domain, task)
        config.stddev_schedule.duration = STDDEV_DURATION_STEPS[difficulty]
        for key, value in _TASK_OVERRIDES.get((domain, task), {}).items():
            config[key] = value
    return config


def get_env_config(domain: str = "reacher", task: str = "hard") -> ml_collections.ConfigDict:
    """Task settings (the `config.env` part of an experiment), defaults from the paper."""
    config = ml_collections.ConfigDict()
    config.domain = domain  # dm_control suite domain, e.g. 'reacher'
    config.task = task  # task of that domain, e.g. 'hard'
    config.image_size = 84  # rendered pixels are image_size x image_size RGB
    config.action_repeat = 2  # frames per agent step; rewards are summed over them
    config.frame_stack = 3  # observation = last frame_stack frames along channels
    config.camera_id = default_camera_id(domain)  # 2 for quadruped, 0 otherwise
    config.max_episode_frames = 0  # cut episodes after this many frames; 0: the task's limit
    return config


def validate_agent_config(agent: ml_collections.ConfigDict) -> None:
    """Refuses out-of-range DrQ-v2 hyperparameters, one line naming `agent.<key>` and the fix.

    Run by both entry points before any process starts (`DrQBuilder.validate_config`).
    """
    check = ConfigChecker(agent, defaults=get_agent_config())
    check.number("learning_rate", above=0)
    check.number("adam_eps", above=0)
    check.integer("batch_size", minimum=1)
    check.number("discount", above=0, maximum=1)
    check.integer("n_step", minimum=1)
    check.number("critic_target_tau", above=0, maximum=1)
    for key in ("encoder_channels", "encoder_num_layers", "encoder_kernel_size"):
        check.integer(key, minimum=1)
    check.integer("encoder_first_stride", minimum=1)
    check.integer("feature_dim", minimum=1)
    check.integer("hidden_dim", minimum=1)
    schedule = ConfigChecker(
        agent.stddev_schedule,
        section="agent.stddev_schedule",
        defaults=get_agent_config().stddev_schedule,
    )
    schedule.number("init", minimum=0)
    schedule.number("final", minimum=0)
    schedule.integer("duration", minimum=1)
    check.number("stddev_clip", minimum=0)
    check.number("action_clamp_eps", minimum=0, below=1)
    check.integer("num_expl_steps", minimum=0)
    check.integer("augmentation_pad", minimum=0)
    check.integer("min_replay_frames", minimum=0)
    check.integer("update_every_steps", minimum=1)
    check.integer("replay_buffer_size", minimum=1)
    check.at_least("replay_buffer_size", "batch_size")
    check.integer("dataset_num_parallel_calls", minimum=1)


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks `config.agent` and `config.env` before any process starts (both entry points).

    The task name is checked against dm_control's suite (about a second to import) so that a
    typo is refused before the launch, not by every node after theirs.
    """
    validate_agent_config(config.agent)
    env = config.env
    check = ConfigChecker(env, section="env", defaults=get_env_config())
    for key in ("image_size", "action_repeat", "frame_stack"):
        check.integer(key, minimum=1)
    check.integer("camera_id", minimum=0)
    if "max_episode_frames" in env:
        check.integer("max_episode_frames", minimum=0)
    from dm_control import suite  # here: only a run that passed every other check pays

    if (env.domain, env.task) not in suite.ALL_TASKS:
        raise ConfigError(
            f"env.domain/env.task={env.domain}/{env.task} is not a dm_control suite task; "
            "e.g. reacher/hard, walker/walk, cheetah/run (configs/ has one per paper task)"
        )
