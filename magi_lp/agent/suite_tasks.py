"""The one check of a dm_control suite task named by `config.env.domain` / `config.env.task`
(and, for agents that render it, `config.env.camera_id`).

Agent projects on the suite (DrQ-v2, TD3) call it from their config check, which both entry
points run before any process starts; their environments then trust the names. dm_control
is imported on the call (about a second), so only a run that passed every other check pays.
"""

from __future__ import annotations

from magi_lp.config_schema import not_among, refusal
from magi_lp.errors import ConfigError


def check_suite_task(domain: str, task: str) -> None:
    """Refuses a domain or task the suite does not have, in one line listing the valid ones."""
    from dm_control import suite

    domains = sorted({d for d, _ in suite.ALL_TASKS})
    if domain not in domains:
        example = "e.g. --config.env.domain=cartpole --config.env.task=balance"
        what = f"env.domain={domain!r} is not a dm_control suite task domain"
        raise not_among(
            what, domain, domains, "the domains", prefix="--config.env.domain=", otherwise=example
        )
    tasks = sorted(t for d, t in suite.ALL_TASKS if d == domain)
    if task not in tasks:
        example = f"e.g. --config.env.task={tasks[0]}"
        what = f"env.task={task!r} is not a dm_control suite task of domain {domain!r}"
        raise not_among(
            what, task, tasks, "its tasks", prefix="--config.env.task=", otherwise=example
        )


def check_suite_camera(domain: str, task: str, camera_id: int) -> None:
    """Refuses a camera the task's model does not have (renderers fail on it in every actor
    after the launch). Loads the task: about 0.1 s after `check_suite_task`."""
    from dm_control import suite

    cameras = suite.load(domain, task).physics.model.ncam
    if camera_id >= cameras:
        raise ConfigError(
            refusal(
                "env.camera_id",
                f"below {cameras} ({domain} {task} has {cameras} fixed cameras, 0-{cameras - 1})",
                camera_id,
                "e.g. --config.env.camera_id=0",
            )
        )
