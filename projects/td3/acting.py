"""TD3 policies as `magi_lp.agent.actor_core.ActorCore`s: behaviour (explore) and evaluation.

Behaviour, as in the reference code: uniformly random actions in [-1, 1] for the first
`random_action_steps` agent steps of each actor, then the actor's action plus
N(0, exploration_noise), clipped to [-1, 1]. Evaluation: the actor's action, no noise.

The actor state counts this actor's agent steps across episodes (magi_lp's `GenericActor`
initialises it once per actor, not per episode), and a resumed run's actor goes on from its
share of the run's steps (`resume`): the random first steps are not taken again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from magi_lp import ActorCore
from projects.td3.networks import TD3Networks


class TD3ActorState(NamedTuple):
    """key: PRNG key of the exploration noise; steps: agent steps taken (int32)."""

    key: jax.Array
    steps: jax.Array


def make_actor_core(
    networks: TD3Networks, config: ml_collections.ConfigDict, evaluation: bool = False
) -> ActorCore[TD3ActorState]:
    """The behaviour policy (evaluation=False) or the deterministic one (evaluation=True).

    `select_action(policy params, observation [O], state)` returns a float32 action [A] in
    [-1, 1] and the next state; it is pure and jit-compatible.
    """
    exploration_noise = float(config.exploration_noise)
    random_action_steps = int(config.random_action_steps)

    def init(key: jax.Array) -> TD3ActorState:
        return TD3ActorState(key=key, steps=jnp.zeros((), jnp.int32))

    def select_action(
        params: Any, observation: Any, state: TD3ActorState
    ) -> tuple[jax.Array, TD3ActorState]:
        action = networks.policy_apply(params, jnp.asarray(observation, jnp.float32)[None])[0]
        key, noise_key, uniform_key = jax.random.split(state.key, 3)
        if not evaluation:
            noisy = action + exploration_noise * jax.random.normal(noise_key, action.shape)
            uniform = jax.random.uniform(uniform_key, action.shape, minval=-1.0, maxval=1.0)
            action = jnp.where(state.steps < random_action_steps, uniform, noisy)
            action = jnp.clip(action, -1.0, 1.0)
        return action.astype(jnp.float32), TD3ActorState(key=key, steps=state.steps + 1)

    def resume(state: TD3ActorState, steps: int) -> TD3ActorState:
        return state._replace(steps=jnp.asarray(min(steps, 2**31 - 1), jnp.int32))

    return ActorCore(
        init=init, select_action=select_action, get_extras=lambda state: (), resume=resume
    )
