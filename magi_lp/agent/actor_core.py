"""`ActorCore`: how an agent acts, as pure functions (Acme's `ActorCore` shape).

Kept free of Acme and dm_env so that a policy can be built and jitted anywhere JAX runs
(e.g. the GPU check on a machine without the pinned stack); `magi_lp.agent.actor` turns a core
into an `acme.core.Actor`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax

State = TypeVar("State")


@dataclasses.dataclass(frozen=True)
class ActorCore(Generic[State]):
    """Acting as pure functions.

    Attributes:
      init: random key -> initial actor state (holds the key and e.g. a step count).
      select_action: (params, observation, state) -> (action, new state); jit-compatible.
      get_extras: state -> extras written to replay with each step (often `()`).
      params_shape: optional; () -> a pytree of `jax.ShapeDtypeStruct` shaped like the
        params the learner serves (`POLICY_VARIABLES`). With it an actor compiles
        `select_action` while it waits for its first parameters (`GenericActor.warm_up`).
      resume: optional; (initial state, agent steps) -> the state of an actor that took that
        many steps before this launch. A resumed run's actors are made with it: a core whose
        state counts steps for a schedule (a random first phase, a noise decay) goes on where
        the run was instead of starting the schedule again. Without it a resumed actor starts
        from `init`'s state.
    """

    init: Callable[[jax.Array], State]
    select_action: Callable[[Any, Any, State], tuple[Any, State]]
    get_extras: Callable[[State], Any] = lambda state: ()
    params_shape: Callable[[], Any] | None = None
    resume: Callable[[State, int], State] | None = None
