"""Tiny DrQ-v2 settings: the whole agent at sizes a 2-core CPU runs in seconds.

For end-to-end tests and benchmarks that need the real entry points but not real learning:
32x32 pixels rendered without shadows (most of a frame's cost without a GPU), batch 16,
feature 8 / hidden 32 / 8 conv channels, episodes cut at 100 frames (50 agent steps), learning
after 40 frames, one evaluation episode (with a video) every 50 actor steps, no TensorBoard.

    python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py \\
        --workdir /tmp/tiny $(python -c "from projects.drq_v2 import tiny; print(*tiny.flags())")
"""

from __future__ import annotations

from collections.abc import Mapping

OVERRIDES: dict[str, object] = {
    "env.image_size": 32,
    "env.max_episode_frames": 100,
    "env.render_shadows": False,
    "env.video.every_evaluations": 1,
    "agent.batch_size": 16,
    "agent.feature_dim": 8,
    "agent.hidden_dim": 32,
    "agent.encoder_channels": 8,
    "agent.min_replay_frames": 40,
    "agent.num_expl_steps": 20,
    "agent.replay_buffer_size": 1000,
    "agent.dataset_num_parallel_calls": 1,
    "evaluation.episodes": 1,
    "evaluation.every_actor_steps": 50,
    "logging.tensorboard": False,
}
"""Config key -> value, in the order the flags are given."""


def flags(changes: Mapping[str, object] | None = None) -> list[str]:
    """`--config.<key>=<value>` for every entry of OVERRIDES, with `changes` on top.

    A key of `changes` already in OVERRIDES keeps its place; new keys come last.
    """
    settings = {**OVERRIDES, **(changes or {})}
    return [f"--config.{key}={value}" for key, value in settings.items()]
