"""The DrQ-v2 experiment: builder + environment factory + network factory + config.

`make_experiment(config, workdir=...)` is what `main.py` and `lp_main.py` hand to the
toolkit's entry points. Every factory is a `functools.partial` of a module-level function
holding only plain values and configs, so Launchpad can pickle the experiment into every
node and each node builds its own environment, networks and video recorder.
"""

from __future__ import annotations

import functools
import math

import dm_env
import ml_collections

from magi_lp import Experiment, Workdir
from magi_lp.acme_api import specs, wrappers
from projects.drq_v2.builder import DrQBuilder
from projects.drq_v2.environment import make_environment
from projects.drq_v2.networks import DrQNetworks, make_networks
from projects.drq_v2.video import EvaluationVideo


def environment_factory(
    seed: int,
    evaluation: bool,
    *,
    domain: str,
    task: str,
    image_size: int,
    action_repeat: int,
    frame_stack: int,
    camera_id: int,
    max_episode_frames: int = 0,
    render_shadows: bool = True,
) -> dm_env.Environment:
    """A seeded pixel task (`projects.drq_v2.environment.make_environment`).

    Args:
      seed: the node's seed.
      evaluation: whether an evaluator asks; the task is the same either way.
      domain, task, image_size, action_repeat, frame_stack, camera_id: `config.env`.
      max_episode_frames: cut episodes after this many frames (as a time limit does:
        the last step keeps discount 1); 0 keeps the task's own limit (1000 frames for
        every task of the paper). For short smoke tests and tests.
      render_shadows: `config.env.render_shadows` (False: frames without shadows).
    """
    del evaluation
    environment = make_environment(
        domain,
        task,
        seed=seed,
        image_size=image_size,
        action_repeat=action_repeat,
        frame_stack=frame_stack,
        camera_id=camera_id,
        render_shadows=render_shadows,
    )
    if max_episode_frames:
        environment = wrappers.StepLimitWrapper(
            environment, step_limit=math.ceil(max_episode_frames / action_repeat)
        )
    return environment


def network_factory(
    environment_spec: specs.EnvironmentSpec, *, agent_config: ml_collections.ConfigDict
) -> DrQNetworks:
    """The DrQ-v2 networks for the environment's action spec."""
    return make_networks(environment_spec.actions, agent_config)


def make_experiment(config: ml_collections.ConfigDict, workdir: str | None = None) -> Experiment:
    """DrQ-v2 on `config.env.domain`/`config.env.task` (e.g. configs/reacher_hard.py).

    Args:
      config: the experiment config (`projects.drq_v2.tasks.make_config`), checked by
        `projects.drq_v2.config.validate_config` (the entry points run it first).
      workdir: the run folder; evaluation videos go to `<workdir>/videos` when
        `config.env.video.every_evaluations` > 0. None: no videos.
    """
    env = config.env
    agent = config.agent
    builder = DrQBuilder(
        agent,
        frame_stack=env.frame_stack,
        action_repeat=env.action_repeat,
        image_size=env.image_size,
    )
    observers = []
    video = env.video
    if workdir is not None and video.every_evaluations > 0:
        observers.append(
            functools.partial(
                EvaluationVideo,
                str(Workdir(workdir).videos),
                episodes_per_evaluation=config.evaluation.episodes,
                every_evaluations=int(video.every_evaluations),
                fps=float(video.fps),
                scale=int(video.scale),
            )
        )
    return Experiment(
        builder=builder,
        environment_factory=functools.partial(
            environment_factory,
            domain=env.domain,
            task=env.task,
            image_size=env.image_size,
            action_repeat=env.action_repeat,
            frame_stack=env.frame_stack,
            camera_id=env.camera_id,
            max_episode_frames=env.max_episode_frames,
            render_shadows=env.render_shadows,
        ),
        network_factory=functools.partial(network_factory, agent_config=agent),
        config=config,
        evaluation_observers=tuple(observers),
        frames_per_step=env.action_repeat,
    )
