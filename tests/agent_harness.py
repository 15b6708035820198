"""What the agent and learner tests share: a logger that keeps its rows, an experiment's
learner, and its actor and evaluator as the runtime builds them
(`magi_lp.runtime.nodes.make_acting_loop`)."""

from __future__ import annotations

from typing import Any

import jax


class Rows:
    """A logger that keeps what it is given, as given (device arrays stay device arrays)."""

    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)

    def close(self):
        pass


def learner_of(experiment: Any, networks: Any, dataset: Any) -> Any:
    """The experiment's learner (key 0, no logger) over `dataset`, as its builder makes it."""
    from magi_lp.acme_api import counting

    return experiment.builder.make_learner(
        jax.random.PRNGKey(0),
        networks,
        dataset,
        experiment.get_environment_spec(),
        logger=None,
        counter=counting.Counter(),
    )


def actor_and_evaluator(
    experiment: Any, replay_client: Any, learner: Any, *, update_period: int
) -> tuple[Any, Any]:
    """Actor 0 (writing to `replay_client`) and evaluator 0 of `experiment`, pulling the
    learner's policy every `update_period` steps, made by the runtime's own factory."""
    from magi_lp.acme_api import counting
    from magi_lp.runtime.nodes import make_acting_loop

    experiment.config.variable_update_period = update_period
    spec = experiment.get_environment_spec()

    def actor(evaluation: bool) -> Any:
        loop = make_acting_loop(
            experiment,
            spec,
            0,
            replay_client,
            learner,
            counting.Counter(),
            lambda *args, **kwargs: Rows(),
            evaluation=evaluation,
        )
        return loop.actor

    return actor(False), actor(True)
