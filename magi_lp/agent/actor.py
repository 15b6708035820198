"""`GenericActor`: an `acme.core.Actor` driven by an `ActorCore`, as Acme's `GenericActor`.

It jit-compiles action selection, threads the actor state and the random key, writes
experience through an adder, and pulls parameters through a `VariableClient`. Acme 0.4.0's own
version cannot be imported with any installable jaxlib.
"""

from __future__ import annotations

from typing import Any, Generic

import dm_env
import jax
import numpy as np
from acme import adders, core

from magi_lp.agent.actor_core import ActorCore, State
from magi_lp.agent.variable_client import VariableClient


class GenericActor(core.Actor, Generic[State]):
    """An `acme.core.Actor` driven by an `ActorCore`."""

    def __init__(
        self,
        actor_core: ActorCore[State],
        random_key: jax.Array,
        variable_client: VariableClient | None,
        adder: adders.Adder | None = None,
    ):
        """Creates the actor.

        Args:
          actor_core: the agent's acting functions; `select_action` is jitted for the
            node's default device, which its resource spec decides (JAX_PLATFORMS).
          random_key: this actor's own key.
          variable_client: where parameters come from; None only for parameter-free cores.
          adder: where experience goes; None for evaluators.
        """
        self._core = actor_core
        self._client = variable_client
        self._adder = adder
        self._select_action = jax.jit(actor_core.select_action)
        self._state = actor_core.init(random_key)

    @property
    def _params(self) -> Any:
        return self._client.params if self._client is not None else None

    def select_action(self, observation: Any) -> np.ndarray:
        action, self._state = self._select_action(self._params, observation, self._state)
        return np.asarray(action)

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        if self._adder is not None:
            self._adder.add_first(timestep)

    def observe(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        if self._adder is not None:
            extras = self._core.get_extras(self._state)
            self._adder.add(action, next_timestep, extras)

    def update(self, wait: bool = False) -> None:
        if self._client is not None:
            self._client.update(wait)

    def warm_up(self, observation: Any) -> bool:
        """Compiles `select_action` for params shaped as the core's `params_shape` says and
        an observation like `observation`, while the first parameters are fetched in the
        background; returns False (and does nothing) when the core gives no shape.

        The acting state is left as it is. The first real `select_action` then reuses the
        compiled code, as long as the pulled params have exactly those shapes and dtypes.
        """
        if self._core.params_shape is None:
            return False
        if self._client is not None:
            self._client.request()
        self._select_action.lower(self._core.params_shape(), observation, self._state).compile()
        return True

    @property
    def state(self) -> State:
        """The actor state (for tests and for checkpointing an actor's step count)."""
        return self._state
