"""dm_control proprioceptive tasks as TD3 sees them.

`make_environment` returns a `dm_env.Environment` whose observation is one flat float32
vector (the suite's observation dict concatenated in key order), whose action is float32
in [-1, 1] (rescaled to the task's bounds and clipped), and whose reward and discount are
float32. No rendering: MuJoCo needs no GL backend here.
"""

from __future__ import annotations

import dm_env

from magi_lp.acme_api import wrappers


def make_environment(
    domain: str,
    task: str,
    seed: int,
    evaluation: bool = False,
    *,
    action_repeat: int = 1,
    max_episode_steps: int = 0,
) -> dm_env.Environment:
    """A seeded dm_control suite task with flat float32 observations and [-1, 1] actions.

    Args:
      domain: suite domain, e.g. "cartpole".
      task: task of that domain, e.g. "balance".
      seed: the task's random seed (initial states, and noise where the task has some).
      evaluation: whether this is an evaluator's environment; the same task either way.
      action_repeat: physics control steps per agent step (rewards add up).
      max_episode_steps: cut episodes after this many agent steps (as a time limit does: the
        last step keeps discount 1); 0 keeps the task's own limit (1000 control steps for
        the suite's tasks). For short smoke runs and tests.

    The names and the repeat are checked once, by `projects.td3.config.validate_config`.
    """
    del evaluation
    from dm_control import suite  # Imported here: loading MuJoCo is only for env nodes.

    environment = suite.load(domain, task, task_kwargs={"random": seed})
    environment = wrappers.ConcatObservationWrapper(environment)
    if action_repeat > 1:
        environment = wrappers.ActionRepeatWrapper(environment, action_repeat)
    if max_episode_steps:
        environment = wrappers.StepLimitWrapper(environment, step_limit=max_episode_steps)
    environment = wrappers.CanonicalSpecWrapper(environment, clip=True)
    return wrappers.SinglePrecisionWrapper(environment)
