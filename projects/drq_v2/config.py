"""DrQ-v2 hyperparameters (agent) and task settings (environment), kept apart.

Defaults are those of the paper (Yarats et al. 2021, "Mastering Visual Continuous Control",
Table 1 / appendix) and of the official PyTorch code (facebookresearch/drqv2, `cfgs/`).
Units matter and are spelled out: an *agent step* is one call of the policy, i.e.
`action_repeat` environment *frames*.

    agent = get_agent_config('reacher', 'hard')   # paper defaults + that task's overrides
    env = get_env_config('reacher', 'hard')       # domain, task, pixels, action repeat, stacking

Each key is declared once, with its type, default and range: `DrQSettings` (`config.agent`)
and `DrQEnvSettings` (`config.env`); `validate_config` checks a config against them.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from magi_lp import ConfigError, ReplaySchedule
from magi_lp.agent.suite_tasks import check_suite_camera, check_suite_task
from magi_lp.config_schema import as_config, check, check_project_sections, in_range, refusal

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


@dataclasses.dataclass(frozen=True)
class StddevSchedule:
    """`agent.stddev_schedule`: the policy noise stddev decays linearly over agent steps."""

    init: float = 1.0
    final: float = 0.1
    duration: int = STDDEV_DURATION_STEPS["medium"]  # agent steps; set by the task's group

    def __post_init__(self) -> None:
        for key in ("init", "final"):  # stddevs
            in_range(self, key, minimum=0)
        in_range(self, "duration", minimum=1)


@dataclasses.dataclass(frozen=True)
class DrQSettings:
    """DrQ-v2 hyperparameters (`config.agent`), the paper's defaults ('medium' schedule).
    Checked by `validate_config`, before any process starts."""

    # --- optimisation -------------------------------------------------------------------
    learning_rate: float = 1e-4  # Adam, for encoder, critic and actor alike
    adam_eps: float = 1e-8  # PyTorch's Adam default, which the official code uses
    batch_size: int = 256  # transitions per update
    discount: float = 0.99  # gamma, per agent step
    n_step: int = 3  # n-step TD targets; the replay sums rewards over n agent steps
    critic_target_tau: float = 0.01  # soft target update: target <- tau*online + (1-tau)*target

    # --- networks -----------------------------------------------------------------------
    encoder_channels: int = 32  # channels of every conv layer
    encoder_num_layers: int = 4  # 3x3 convs; repr dim 32*35*35 = 39200 at 84x84
    encoder_kernel_size: int = 3
    encoder_first_stride: int = 2  # stride of the first conv; the others use stride 1
    feature_dim: int = 50  # width of the Linear -> LayerNorm -> tanh trunk (actor, critic)
    hidden_dim: int = 1024  # width of the two hidden layers of actor and Q heads

    # --- exploration and target-policy smoothing ----------------------------------------
    stddev_schedule: StddevSchedule = dataclasses.field(default_factory=StddevSchedule)
    stddev_clip: float = 0.3  # noise clip for target and actor-loss actions (not for acting)
    action_clamp_eps: float = 1e-6  # sampled actions are clamped to [-1+eps, 1-eps]
    num_expl_steps: int = 2000  # agent steps of uniform random actions at the start

    # --- data ---------------------------------------------------------------------------
    augmentation_pad: int = 4  # random shift: replicate-pad by this, shift by 0..2*pad px
    min_replay_frames: int = 4000  # no updates before this many environment frames
    update_every_steps: int = 2  # one update per this many agent steps (replay ratio)
    replay_buffer_size: int = 1_000_000  # transitions kept in replay
    dataset_num_parallel_calls: int = 2  # parallel Reverb readers feeding the learner

    def __post_init__(self) -> None:
        for key in ("learning_rate", "adam_eps"):
            in_range(self, key, above=0)
        for key in ("discount", "critic_target_tau"):
            in_range(self, key, above=0, maximum=1)
        for key in ("stddev_clip", "num_expl_steps", "augmentation_pad", "min_replay_frames"):
            in_range(self, key, minimum=0)
        in_range(self, "action_clamp_eps", minimum=0, below=1)
        for key in (
            "batch_size",
            "n_step",
            "encoder_channels",
            "encoder_num_layers",
            "encoder_kernel_size",
            "encoder_first_stride",
            "feature_dim",
            "hidden_dim",
            "update_every_steps",
            "replay_buffer_size",
            "dataset_num_parallel_calls",
        ):
            in_range(self, key, minimum=1)
        batch = self.batch_size
        check(
            self,
            "replay_buffer_size",
            self.replay_buffer_size >= batch,
            f">= agent.batch_size ({batch})",
        )


@dataclasses.dataclass(frozen=True)
class VideoSettings:
    """`env.video`: evaluation videos (projects/drq_v2/video.py), under `env` because the
    toolkit owns `evaluation`. Written to <workdir>/videos."""

    every_evaluations: int = 10  # one episode every this many evaluations; 0: none
    fps: float = 25.0  # one frame per agent step
    scale: int = 2  # nearest-neighbour upscaling of the agent's view

    def __post_init__(self) -> None:
        in_range(self, "every_evaluations", minimum=0)
        in_range(self, "fps", above=0)
        in_range(self, "scale", minimum=1)


@dataclasses.dataclass(frozen=True)
class DrQEnvSettings:
    """The task (`config.env`), defaults from the paper. Checked by `validate_config`, the
    one check of these keys: the builder, experiment and environment trust them."""

    domain: str = "reacher"  # dm_control suite domain, e.g. 'reacher'
    task: str = "hard"  # task of that domain, e.g. 'hard'
    image_size: int = 84  # rendered pixels are image_size x image_size RGB
    action_repeat: int = 2  # frames per agent step; rewards are summed over them
    frame_stack: int = 3  # observation = last frame_stack frames along channels
    camera_id: int = 0  # 2 for quadruped (`default_camera_id`), 0 otherwise
    max_episode_frames: int = 0  # cut episodes after this many frames; 0: the task's limit
    # False skips the shadow pass of every frame: the images are no longer the paper's, but
    # a software renderer (Mesa's llvmpipe, EGL or OSMesa without a GPU) draws a cartpole
    # frame in about a fifth of the time (projects/drq_v2/environment.py).
    render_shadows: bool = True
    video: VideoSettings = dataclasses.field(default_factory=VideoSettings)

    def __post_init__(self) -> None:
        for key in ("image_size", "action_repeat", "frame_stack"):
            in_range(self, key, minimum=1)
        for key in ("camera_id", "max_episode_frames"):
            in_range(self, key, minimum=0)


def get_agent_config(
    domain: str | None = None, task: str | None = None
) -> ml_collections.ConfigDict:
    """DrQ-v2 hyperparameters (`DrQSettings`) as `config.agent`. With a task, the official
    per-task overrides are applied; without, this is the paper's default ('medium' schedule).
    """
    settings = DrQSettings()
    if domain is not None and task is not None:
        duration = STDDEV_DURATION_STEPS[task_difficulty(domain, task)]
        settings = dataclasses.replace(
            settings,
            stddev_schedule=dataclasses.replace(settings.stddev_schedule, duration=duration),
            **_TASK_OVERRIDES.get((domain, task), {}),
        )
    return as_config(settings)


def get_env_config(domain: str = "reacher", task: str = "hard") -> ml_collections.ConfigDict:
    """Task settings (`DrQEnvSettings`) as `config.env`, with the paper's camera."""
    return as_config(DrQEnvSettings(domain=domain, task=task, camera_id=default_camera_id(domain)))


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks `config.agent` and `config.env` before any process starts (main.py and
    lp_main.py pass it to the toolkit's entry point, which runs it once, before anything
    heavy is imported): the one check of DrQ-v2's keys.

    The task name is checked against dm_control's suite (about a second to import) so that a
    typo is refused before the launch, not by every node after theirs.
    """
    sections = {"agent": DrQSettings, "env": DrQEnvSettings}
    check_project_sections(config, sections, defaults_module=__name__)
    _check_image_fits_the_encoder(config)
    _check_replay_can_fill(config)
    check_suite_task(config.env.domain, config.env.task)
    check_suite_camera(config.env.domain, config.env.task, config.env.camera_id)


def encoder_output_side(
    image_size: int, num_layers: int, kernel_size: int, first_stride: int
) -> int:
    """Side of the encoder's output for a square image: VALID convs, the first one strided
    (0 or less: the image is too small for it)."""
    side = image_size
    for layer in range(num_layers):
        side = (side - kernel_size) // (first_stride if layer == 0 else 1) + 1
        if side < 1:
            break
    return side


def _check_replay_can_fill(config: ml_collections.ConfigDict) -> None:
    """Refuses a replay that cannot hold the transitions the first update waits for: the
    learner would wait forever (TD3's settings refuse the same in one section)."""
    agent, repeat = config.agent, int(config.env.action_repeat)
    needed = replay_schedule(agent, repeat).min_replay_size
    if int(agent.replay_buffer_size) >= needed:
        return
    raise ConfigError(
        refusal(
            "agent.replay_buffer_size",
            f">= the {needed:,} transitions of agent.min_replay_frames="
            f"{int(agent.min_replay_frames)} (at env.action_repeat={repeat})",
            agent.replay_buffer_size,
            f"e.g. --config.agent.replay_buffer_size={needed}, or fewer min_replay_frames",
        )
    )


def _check_image_fits_the_encoder(config: ml_collections.ConfigDict) -> None:
    """Refuses an image the encoder's convs reduce to nothing: the agent would act on empty
    features (its returns stay at a random policy's), not fail."""
    agent = config.agent
    layers = (
        agent.encoder_num_layers,
        agent.encoder_kernel_size,
        agent.encoder_first_stride,
    )
    if encoder_output_side(config.env.image_size, *layers) >= 1:
        return
    layers_after_the_first, kernel, stride = layers[0] - 1, layers[1], layers[2]
    smallest = kernel + stride * layers_after_the_first * (kernel - 1)
    raise ConfigError(
        refusal(
            "env.image_size",
            f"at least {smallest} for agent.encoder_num_layers={layers[0]} "
            f"{layers[1]}x{layers[1]} convs (the first of stride {layers[2]})",
            config.env.image_size,
            f"e.g. --config.env.image_size={max(smallest, 84)}, or fewer encoder layers",
        )
    )
