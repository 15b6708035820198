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
    learner's policy every `update_period` steps, made by the runtime's own factory: the
    `acme.core.Actor`s its acting loops drive (`envs_per_actor` = 1)."""
    from magi_lp.acme_api import counting
    from magi_lp.agent.actor import OneEnvironment
    from magi_lp.replay.stores import resolve_store
    from magi_lp.runtime.nodes import make_acting_loop

    experiment.config.variable_update_period = update_period
    spec = experiment.get_environment_spec()

    def actor(evaluation: bool) -> Any:
        loop = make_acting_loop(
            experiment,
            spec,
            0,
            resolve_store(experiment.builder, experiment.config),
            replay_client,
            learner,
            counting.Counter(),
            lambda *args, **kwargs: Rows(),
            evaluation=evaluation,
        )
        assert isinstance(loop.actor, OneEnvironment)
        return loop.actor.actor

    return actor(False), actor(True)


def queue_dataset(address: str, table: str, **kwargs: Any) -> Any:
    """A frame-replay dataset that reads a test's Reverb queue to its end.

    One item a batch and one parallel call (so the order is the queue's), and the iterator
    ends 500 ms after the queue runs dry instead of waiting for more; `kwargs` are
    `make_frame_replay_dataset`'s (frame_stack, n_step, discount) and any override.
    """
    from magi_lp.replay.frame_replay import make_frame_replay_dataset

    settings = {"batch_size": 1, "num_parallel_calls": 1, "rate_limiter_timeout_ms": 500}
    return make_frame_replay_dataset(address, table, **{**settings, **kwargs})


def n_step_transitions(episode: dict, n_step: int, gamma: float) -> dict[int, tuple]:
    """t -> (o_t, a_t, R_t, discount_t, o_{t+n}) of a recorded episode, computed directly.

    `episode` holds the stacked `observations` (one more than the steps), `actions`,
    `rewards` and `discounts` of every step; R_t is the n-step discounted reward and
    discount_t = gamma^n * the product of the n discounts, as DrQ-v2's replay gives them.
    """
    transitions = {}
    for t in range(len(episode["actions"]) - n_step + 1):
        reward, discount = 0.0, 1.0
        for k in range(n_step):
            reward += discount * episode["rewards"][t + k]
            discount *= episode["discounts"][t + k] * gamma
        transitions[t] = (
            episode["observations"][t],
            episode["actions"][t],
            reward,
            discount,
            episode["observations"][t + n_step],
        )
    return transitions


def actor_node_stopping_after(loop: Any, steps: int) -> tuple[Any, list[int]]:
    """An `ActorNode` around `loop` whose program stops once the loop has taken `steps` loop
    steps, and the count of steps it has taken (a one-item list, read after `node.run()`)."""
    from magi_lp.runtime import nodes

    taken = [0]
    step = loop.step
    loop.step = lambda: (taken.__setitem__(0, taken[0] + 1), step())[1]

    class Lifetime:
        def stopping(self) -> bool:
            return taken[0] >= steps

        def leave(self) -> None:
            pass

    node = nodes.ActorNode.__new__(nodes.ActorNode)
    node._lifetime, node._loop, node._name, node._max_actor_steps = (
        Lifetime(),
        loop,
        "actor_0",
        10**6,
    )
    return node, taken
