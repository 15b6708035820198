"""Actors driven by an `ActorCore`: one environment (`GenericActor`) or k (`BatchedActor`).

`GenericActor` is an `acme.core.Actor`, as Acme's `GenericActor`: it jit-compiles action
selection, threads the actor state and the random key, writes experience through an adder,
and pulls parameters through a `VariableClient`. Acme 0.4.0's own version cannot be imported
with any installable jaxlib.

`BatchedActor` acts for k environments of one process (`config.envs_per_actor`): the core's
`select_action` is vmapped over the k observations and states and jitted, so one call on the
node's device chooses all k actions (rlstructures' advice for GPU acting: one process with N
environments and batched inference instead of N processes, each paying for a CUDA context).
Each environment keeps its own actor state (its own key and step count) and its own adder, so
replay streams never mix environments.

One acting loop (`magi_lp.runtime.acting_loop.ActingLoop`) drives both: a `BatchedActor`
directly, any `acme.core.Actor` through `OneEnvironment` (the batched interface for k = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic

import dm_env
import jax
import jax.numpy as jnp
import numpy as np

from magi_lp.acme_api import adders, close_reverb_adder, core
from magi_lp.agent.actor_core import ActorCore, State
from magi_lp.agent.contract import check_pair
from magi_lp.agent.device_check import DeviceCheck
from magi_lp.agent.variable_client import VariableClient


class GenericActor(core.Actor, Generic[State]):
    """An `acme.core.Actor` driven by an `ActorCore`."""

    def __init__(
        self,
        actor_core: ActorCore[State],
        random_key: jax.Array,
        variable_client: VariableClient | None,
        adder: adders.Adder | None = None,
        *,
        device_check: DeviceCheck | None = None,
        steps_before: int = 0,
    ):
        """Creates the actor.

        Args:
          actor_core: the agent's acting functions; `select_action` is jitted for the
            node's default device, which its resource spec decides (JAX_PLATFORMS).
          random_key: this actor's own key.
          variable_client: where parameters come from; None only for parameter-free cores.
          adder: where experience goes; None for evaluators.
          device_check: device-check mode: checks every call's inputs and outputs.
          steps_before: agent steps this actor took before this launch (a resumed run);
            the core's `resume` puts them in its state.
        """
        self._core = actor_core
        self._client = variable_client
        self._adder = adder
        self._select_action = jax.jit(actor_core.select_action)
        self._state = resumed_state(actor_core, actor_core.init(random_key), steps_before)
        self._check = device_check

    @property
    def _params(self) -> Any:
        return self._client.params if self._client is not None else None

    def select_action(self, observation: Any) -> np.ndarray:
        action, self._state = _policy_call(
            self._select_action, self._check, self._params, observation, self._state
        )
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

    def close(self) -> None:
        """Sends what its adder still holds (`end_episode_writes`)."""
        end_episode_writes([self._adder])

    def take_sent_steps(self, send: bool = True) -> int | None:
        """`sent_steps` of its adder."""
        return sent_steps([self._adder], send)

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


def resumed_state(actor_core: ActorCore[State], state: State, steps_before: int) -> State:
    """`state` after `steps_before` agent steps of an earlier launch (`ActorCore.resume`);
    `state` itself for a new run or a core without `resume`."""
    if steps_before < 0:
        raise ValueError(f"steps_before must be >= 0, got {steps_before}")
    if not steps_before or actor_core.resume is None:
        return state
    return actor_core.resume(state, steps_before)


def _policy_call(
    select: Callable[..., Any], check: DeviceCheck | None, params: Any, observation: Any, state: Any
) -> tuple[Any, Any]:
    """One call of the (jitted) policy: (action, new state), the result checked to be that
    pair and, with a device check, its inputs and outputs checked for their devices. The
    same for one environment's action and a batched actor's k."""
    if check is not None:
        _check_inputs(check, params, observation, state)
    result = select(params, observation, state)
    check_pair(result, "the policy's select_action", "action", "new state")
    action, new_state = result
    if check is not None:
        _check_outputs(check, action, new_state)
    return action, new_state


def _check_inputs(check: DeviceCheck, params: Any, observations: Any, state: Any) -> None:
    check.check("select_action input params", params)
    check.check("select_action input observation", observations, host_ok=True)
    check.check("select_action input state", state)


def _check_outputs(check: DeviceCheck, actions: Any, state: Any) -> None:
    check.check("select_action output action", actions)
    check.check("select_action output state", state)


class BatchedActor(Generic[State]):
    """Acts for k environments with one jitted call: `ActorCore.select_action` vmapped.

    Environment i has its own actor state (from its own key) and its own adder; parameters
    are pulled once for all k. Not an `acme.core.Actor` (that acts for one environment):
    `magi_lp.runtime.acting_loop.ActingLoop` drives it.
    """

    def __init__(
        self,
        actor_core: ActorCore[State],
        random_keys: Sequence[jax.Array],
        variable_client: VariableClient | None,
        environment_adders: Sequence[adders.Adder | None],
        *,
        device_check: DeviceCheck | None = None,
        steps_before: int = 0,
    ):
        """Creates the actor.

        Args:
          actor_core: the agent's acting functions for ONE environment; they are vmapped
            over the environments, the parameters shared.
          random_keys: one key per environment (k of them).
          variable_client: where parameters come from; None only for parameter-free cores.
          environment_adders: one adder (or None) per environment, each its own replay
            stream.
          device_check: device-check mode: checks every call's inputs and outputs.
          steps_before: agent steps EACH environment's actor state took before this launch
            (a resumed run; `GenericActor`'s).
        """
        if len(random_keys) != len(environment_adders) or not random_keys:
            raise ValueError(
                f"BatchedActor needs one key and one adder per environment, got "
                f"{len(random_keys)} keys and {len(environment_adders)} adders"
            )
        self._core = actor_core
        self._client = variable_client
        self._adders = list(environment_adders)
        self._select_actions = jax.jit(jax.vmap(actor_core.select_action, in_axes=(None, 0, 0)))
        self._get_extras = jax.jit(jax.vmap(actor_core.get_extras))
        self._state = jax.vmap(
            lambda key: resumed_state(actor_core, actor_core.init(key), steps_before)
        )(jnp.stack(list(random_keys)))
        self._check = device_check
        self._extras: Any = None
        self._has_extras: bool | None = None  # learnt from the first call

    @property
    def num_environments(self) -> int:
        """k: the environments this actor acts for."""
        return len(self._adders)

    @property
    def _params(self) -> Any:
        return self._client.params if self._client is not None else None

    def select_actions(self, observations: Sequence[Any]) -> np.ndarray:
        """One action per environment, [k, ...], chosen in one call on the node's device."""
        stacked = np.stack([np.asarray(o) for o in observations])  # one host->device copy
        actions, self._state = _policy_call(
            self._select_actions, self._check, self._params, stacked, self._state
        )
        if self._has_extras is None:
            self._has_extras = bool(
                jax.tree_util.tree_leaves(
                    self._core.get_extras(jax.tree_util.tree_map(lambda x: x[0], self._state))
                )
            )
        # Most cores have no extras (`()`); only the others pay for the extra call.
        self._extras = jax.device_get(self._get_extras(self._state)) if self._has_extras else ()
        return np.asarray(actions)

    def warm_up(self, observation: Any) -> bool:
        """`GenericActor.warm_up` for the batched call: compiles `select_actions` for k
        observations like `observation` while the first parameters are fetched; False (and
        nothing done) when the core gives no `params_shape`."""
        if self._core.params_shape is None:
            return False
        if self._client is not None:
            self._client.request()
        stacked = np.stack([np.asarray(observation)] * self.num_environments)
        self._select_actions.lower(self._core.params_shape(), stacked, self._state).compile()
        return True

    def observe_first(self, index: int, timestep: dm_env.TimeStep) -> None:
        """Environment `index` started an episode."""
        adder = self._adders[index]
        if adder is not None:
            adder.add_first(timestep)

    def observe(self, index: int, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        """Environment `index` took `action` (its row of `select_actions`) and got there."""
        adder = self._adders[index]
        if adder is not None:
            extras = self._extras
            if self._has_extras:
                extras = jax.tree_util.tree_map(lambda column: column[index], extras)
            adder.add(action, next_timestep, extras)

    def update(self, wait: bool = False) -> None:
        """Counts one batched step toward the next parameter pull (see `VariableClient`)."""
        if self._client is not None:
            self._client.update(wait)

    def close(self) -> None:
        """Sends what each environment's adder still holds (`end_episode_writes`)."""
        end_episode_writes(self._adders)

    def take_sent_steps(self, send: bool = True) -> int | None:
        """`sent_steps` of its k adders (one call for all k where they share a sender)."""
        return sent_steps(self._adders, send)

    @property
    def state(self) -> State:
        """The k actor states, stacked along a leading axis."""
        return self._state


def end_episode_writes(environment_adders: Sequence[adders.Adder | None]) -> None:
    """Sends what each adder still holds: its `close()` (the toolkit's adders: flush, then
    close the writer); for Acme's Reverb adders `acme_api.close_reverb_adder` (end the
    episode, which flushes, then close the writer); else `reset()`.

    A run that stops mid-episode (at its step limit, at Ctrl-C) calls this before its replay
    server stops: an Acme Reverb adder otherwise flushes when it is garbage-collected, after
    the server has gone, and waits 10 s for confirmations that never come; and a writer left
    open holds the server's stop for 5 s.
    """
    for adder in environment_adders:
        if adder is not None:
            close = getattr(adder, "close", None)
            if close is not None:
                close()
            elif not close_reverb_adder(adder):
                adder.reset()


def sent_steps(environment_adders: Sequence[adders.Adder | None], send: bool = True) -> int | None:
    """Sends what the adders hold back for a batched send (not with `send=False`), and returns
    the environment steps their replay took since the last call (an acting loop counts these:
    nothing it counts is still waiting to be sent); None where no adder says (each step is
    written as it comes: the loop counts its own steps).

    Adders that send in batches have `take_sent_steps()` (the served
    `magi_lp.replay.step_queue.ServedFrameAdder`); adders sharing one sender answer its
    count once between them.
    """
    counting = [a for a in environment_adders if hasattr(a, "take_sent_steps")]
    if not counting:
        return None
    return sum(int(adder.take_sent_steps(send)) for adder in counting)


class OneEnvironment:
    """An `acme.core.Actor` seen as a `BatchedActor` of one environment.

    The acting loop speaks the batched interface only (`select_actions` over a list, the
    environment's index on every observe), so an Acme-style actor for one environment,
    `GenericActor` or anyone's own, plugs into the same loop through this.
    """

    num_environments = 1

    def __init__(self, actor: core.Actor):
        self.actor = actor

    def select_actions(self, observations: Sequence[Any]) -> list[np.ndarray]:
        """The one environment's action, as a list of one."""
        return [self.actor.select_action(observations[0])]

    def observe_first(self, index: int, timestep: dm_env.TimeStep) -> None:
        self.actor.observe_first(timestep)

    def observe(self, index: int, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        self.actor.observe(action, next_timestep=next_timestep)

    def update(self, wait: bool = False) -> None:
        self.actor.update(wait)

    def close(self) -> None:
        """The actor's `close` where it has one (`GenericActor.close`)."""
        close = getattr(self.actor, "close", None)
        if close is not None:
            close()

    def take_sent_steps(self, send: bool = True) -> int | None:
        """The actor's `take_sent_steps` where it has one (`GenericActor`'s); else None."""
        take = getattr(self.actor, "take_sent_steps", None)
        return None if take is None else take(send)

    def warm_up(self, observation: Any) -> bool:
        """The actor's `warm_up` where it has one (`GenericActor.warm_up`); else False."""
        warm_up = getattr(self.actor, "warm_up", None)
        return bool(warm_up(observation)) if warm_up is not None else False
