"""DrQ-v2 policies as Acme-style actor cores: behaviour (explore) and evaluation (mean).

Behaviour, as in the official `DrQV2Agent.act`: uniform random actions in [-1, 1] for the
first `num_expl_steps` agent steps, then the actor's mean plus N(0, stddev) noise at the
scheduled stddev, clamped to [-1, 1] (the noise is not clipped when acting; `stddev_clip`
only applies to the learner's target and actor-loss actions). Evaluation: the mean.

The actor state counts this actor's agent steps, which drive both the initial random phase
and the noise schedule. It must live across episodes: call `init` once per actor, not at
every episode start (Acme 0.4's `GenericActor` re-inits its state in `observe_first`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import ml_collections

from projects.drq_v2.learning import stddev_schedule
from projects.drq_v2.networks import DrQNetworks, sample_action

State = TypeVar("State")
Extras = Any


@dataclasses.dataclass(frozen=True)
class ActorCore(Generic[State]):
    """Pure functions of a policy, in the shape of Acme's `acme.jax.actor_core.ActorCore`.

    init(key) -> state; select_action(params, observation, state) -> (action, state), one
    unbatched observation in, one action out; get_extras(state) -> extras for the adder.
    """

    init: Callable[[jax.Array], State]
    select_action: Callable[[Any, Any, State], tuple[jax.Array, State]]
    get_extras: Callable[[State], Extras]


class DrQActorState(NamedTuple):
    """key: PRNG key for noise; steps: agent steps this actor has taken (int32)."""

    key: jax.Array
    steps: jax.Array


def make_actor_core(
    networks: DrQNetworks, config: ml_collections.ConfigDict, evaluation: bool = False
) -> ActorCore[DrQActorState]:
    """The behaviour policy (evaluation=False) or the evaluation policy (evaluation=True).

    `select_action` takes params {'encoder', 'actor'} and a uint8 observation [H, W, C]; it
    returns a float32 action [A] in [-1, 1]. It is pure and can be jitted.
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
            stddev = stddev_schedule(state.steps, config)
            noisy = sample_action(noise_key, mean, stddev, None, config.action_clamp_eps)
            uniform = jax.random.uniform(uniform_key, mean.shape, mean.dtype, -1.0, 1.0)
            action = jnp.where(state.steps < config.num_expl_steps, uniform, noisy)
        return action.astype(jnp.float32), DrQActorState(key=key, steps=state.steps + 1)

    def get_extras(state: DrQActorState) -> tuple:
        del state
        return ()

    return ActorCore(init=init, select_action=select_action, get_extras=get_extras)
