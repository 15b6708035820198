"""DrQ-v2 policies as actor cores (`magi_lp.agent.actor_core.ActorCore`): behaviour and evaluation.

Behaviour, as in the official `DrQV2Agent.act`: uniform random actions in [-1, 1] for the
first `num_expl_steps` agent steps, then the actor's mean plus N(0, stddev) noise at the
scheduled stddev, clamped to [-1, 1] (the noise is not clipped when acting; `stddev_clip`
only applies to the learner's target and actor-loss actions). Evaluation: the mean.

Both the random phase and the noise schedule are functions of the GLOBAL agent step (all
actors together), as in the official single-process code. An actor only sees its own steps,
so the step it uses is

    agent_step = max(this actor's steps, params["global_agent_steps"])

where the optional `global_agent_steps` leaf of the params is a lower bound on the global
step that the builder derives from the learner's update count (see
`projects.drq_v2.builder`). Without that leaf (e.g. in unit tests) the actor's own count is
used. The actor state must live across episodes: `GenericActor` calls `init`
once per actor, not at every episode start.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from magi_lp import ActorCore
from projects.drq_v2.learning import stddev_schedule
from projects.drq_v2.networks import DrQNetworks, sample_action

GLOBAL_AGENT_STEPS = "global_agent_steps"
"""Optional params leaf: a lower bound on the agent steps taken by all actors together."""


class DrQActorState(NamedTuple):
    """key: PRNG key for noise; steps: agent steps this actor has taken (int32)."""

    key: jax.Array
    steps: jax.Array


def agent_step(params: Any, state: DrQActorState) -> jax.Array:
    """The global agent step the behaviour policy acts at (see the module docstring)."""
    if isinstance(params, dict) and GLOBAL_AGENT_STEPS in params:
        return jnp.maximum(state.steps, jnp.asarray(params[GLOBAL_AGENT_STEPS], jnp.int32))
    return state.steps


def make_actor_core(
    networks: DrQNetworks,
    config: ml_collections.ConfigDict,
    evaluation: bool = False,
    observation_spec: Any = None,
) -> ActorCore[DrQActorState]:
    """The behaviour policy (evaluation=False) or the evaluation policy (evaluation=True).

    `select_action` takes params {'encoder', 'actor'} (optionally with the
    `global_agent_steps` leaf) and a uint8 observation [H, W, C]; it returns a float32
    action [A] in [-1, 1]. It is pure and can be jitted. With `observation_spec` (anything
    with `shape` and `dtype`) the core also says the shape of the params the learner serves
    (`DrQLearner`'s "policy"), so actors compile it before their first pull.
    """

    def init(key: jax.Array) -> DrQActorState:
        return DrQActorState(key=key, steps=jnp.zeros((), jnp.int32))

    def select_action(
        params: Any, observation: Any, state: DrQActorState
    ) -> tuple[jax.Array, DrQActorState]:
        obs = jnp.asarray(observation)[None]
        features = networks.encoder_apply(params["encoder"], obs)
        mean = networks.actor_apply(params["actor"], features)[0]
        key, noise_key, uniform_key = jax.random.split(state.key, 3)
        if evaluation:
            action = mean
        else:
            step = agent_step(params, state)
            stddev = stddev_schedule(step, config)
            noisy = sample_action(noise_key, mean, stddev, None, config.action_clamp_eps)
            uniform = jax.random.uniform(uniform_key, mean.shape, mean.dtype, -1.0, 1.0)
            action = jnp.where(step < config.num_expl_steps, uniform, noisy)
        return action.astype(jnp.float32), DrQActorState(key=key, steps=state.steps + 1)

    def get_extras(state: DrQActorState) -> tuple:
        del state
        return ()

    def params_shape() -> dict[str, Any]:
        observation = jax.ShapeDtypeStruct(tuple(observation_spec.shape), observation_spec.dtype)
        params = jax.eval_shape(networks.init, jax.random.PRNGKey(0), observation)
        return {
            "encoder": params["encoder"],
            "actor": params["actor"],
            GLOBAL_AGENT_STEPS: jax.ShapeDtypeStruct((), jnp.int32),
        }

    def resume(state: DrQActorState, steps: int) -> DrQActorState:
        # The params' lower bound (`agent_step`) already puts a resumed actor past the
        # random phase; its own count goes on too, as TD3's does (and holds without the bound).
        return state._replace(steps=jnp.asarray(min(steps, 2**31 - 1), jnp.int32))

    return ActorCore(
        init=init,
        select_action=select_action,
        get_extras=get_extras,
        params_shape=None if observation_spec is None else params_shape,
        resume=resume,
    )
