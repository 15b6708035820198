"""The evaluation schedule both runners follow: the points an evaluator evaluates at, and one
evaluation at a point.

An evaluation falls due at every multiple of `evaluation.every_actor_steps` (0 for a new
run) and at `max_actor_steps`; a resumed run goes on from the first point at or after its
counts. The single-process runner (`magi_lp.runtime.single_process`) evaluates between its
actor's steps, the evaluator node (`magi_lp.runtime.nodes`) as the counter's counts pass
each point. No engine is named here.
"""

from __future__ import annotations

from collections.abc import Callable

from magi_lp.runtime.acting_loop import ActingLoop


def first_evaluation_at(actor_steps: int, every: int) -> int:
    """The first evaluation point (a multiple of `every`) at or after `actor_steps`: 0 for a
    new run; for a resumed one, the point it stopped before (or at: evaluated again, with the
    same parameters, when a run stopped exactly there)."""
    return -(-actor_steps // every) * every


def next_evaluation_after(actor_steps: int, every: int) -> int:
    """The first evaluation point (a multiple of `every`) after one at `actor_steps`."""
    return (actor_steps // every + 1) * every


def evaluate(
    loop: ActingLoop, episodes: int, should_stop: Callable[[], bool] = lambda: False, *, at: int
) -> list[dict]:
    """Pulls fresh parameters (blocking) and runs `episodes` evaluation episodes, the
    evaluation at `at` actor steps (`ActingLoop.start_evaluation`: its rows say so)."""
    loop.actor.update(wait=True)
    loop.start_evaluation(at)
    return loop.run(should_stop, num_episodes=episodes)
