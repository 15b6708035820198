"""What an agent's builder must hand the toolkit, checked where the toolkit first takes it.

A new agent that breaks the builder protocol (`magi_lp.agent.builder.AgentBuilder`) would
otherwise fail deep inside the toolkit, with a traceback that never names the method at
fault (`'NoneType' object has no attribute 'save'`, `not enough values to unpack`). Each
check here raises one `TypeError` that names the builder's method, what it returned and what
it must return; the node's exit report leads with it.
"""

from __future__ import annotations

from typing import Any

from magi_lp.agent.actor_core import ActorCore

_LEARNER_METHODS = ("step", "get_variables", "save", "restore")


def _named(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def check_learner(builder: Any, learner: Any) -> None:
    """`builder.make_learner`'s result: a learner that steps, serves `POLICY_VARIABLES` (what
    every actor pulls) and saves and restores its state."""
    from magi_lp.agent.builder import POLICY_VARIABLES  # builder imports the learner module

    where = f"{type(builder).__name__}.make_learner"
    missing = [name for name in _LEARNER_METHODS if not callable(getattr(learner, name, None))]
    if missing:
        raise TypeError(
            f"{where} returned {_named(learner)}, which has no {', '.join(missing)}(): return "
            "a learner (magi_lp.agent.learner.JaxLearner, or an object with step(), "
            "get_variables(names), save() and restore(state))"
        )
    variables = getattr(learner, "variables", None)
    state = getattr(learner, "state", None)
    if not callable(variables) or state is None:
        return  # another kind of learner: its first get_variables says what it serves
    served = sorted(variables(state))
    if POLICY_VARIABLES not in served:
        raise TypeError(
            f"{where}'s learner serves the variables {served}, not {POLICY_VARIABLES!r}: every "
            f"actor pulls {POLICY_VARIABLES!r} (the params its policy's select_action takes); "
            f"serve them under that name in the learner's variables()"
        )


def check_policy(builder: Any, policy: Any) -> None:
    """`builder.make_policy`'s result: an `ActorCore` (its `init` and `select_action`)."""
    if isinstance(policy, ActorCore):
        return
    raise TypeError(
        f"{type(builder).__name__}.make_policy returned {_named(policy)}: return a "
        "magi_lp.agent.actor_core.ActorCore (init, select_action, and optionally get_extras, "
        "params_shape and resume)"
    )


def check_pair(result: Any, where: str, first: str, second: str) -> None:
    """A function's `(first, second)` result, e.g. select_action's `(action, state)`."""
    if isinstance(result, tuple) and len(result) == 2:
        return
    got = f"a tuple of {len(result)}" if isinstance(result, tuple) else _named(result)
    raise TypeError(f"{where} returned {got}: it must return the pair ({first}, {second})")
