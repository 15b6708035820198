"""TD3 networks in Haiku: a deterministic tanh actor and twin critics, MLPs over states.

Shapes: observations are float32 [B, O] (the environment concatenates and casts them);
the actor gives actions [B, A] in (-1, 1), the range the environment is wrapped to; the
critics take (observation [B, O], action [B, A]) and give two Q-values, each [B]. Both
networks use Haiku's default initialisers (truncated normal fan-in weights, zero biases),
close to PyTorch's defaults in the reference code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from magi_lp.acme_api import specs
from magi_lp.agent.pure_functions import pure_functions

Params = Any  # a Haiku params mapping
PRNGKey = jax.Array


@dataclasses.dataclass(frozen=True)
class TD3Networks:
    """Pure init/apply functions of the actor ("policy") and the twin critics.

    Attributes:
      policy_init: (key, observation [B, O]) -> actor params.
      policy_apply: (actor params, observation [B, O]) -> action [B, A] in (-1, 1).
      critic_init: (key, observation [B, O], action [B, A]) -> critic params (both heads).
      critic_apply: (critic params, observation [B, O], action [B, A]) -> (q1 [B], q2 [B]).
      observation_size: O.
      action_size: A.
    """

    policy_init: Callable[[PRNGKey, jax.Array], Params]
    policy_apply: Callable[[Params, jax.Array], jax.Array]
    critic_init: Callable[[PRNGKey, jax.Array, jax.Array], Params]
    critic_apply: Callable[[Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    observation_size: int
    action_size: int

    def init(self, key: PRNGKey) -> tuple[Params, Params]:
        """Fresh (actor params, critic params) for batch-of-one dummy inputs."""
        policy_key, critic_key = jax.random.split(key)
        observation = jnp.zeros((1, self.observation_size), jnp.float32)
        action = jnp.zeros((1, self.action_size), jnp.float32)
        return (
            self.policy_init(policy_key, observation),
            self.critic_init(critic_key, observation, action),
        )


def make_networks(
    environment_spec: specs.EnvironmentSpec, hidden_sizes: Sequence[int] = (256, 256)
) -> TD3Networks:
    """The networks for an environment with a flat observation vector and a [-1, 1] action.

    This is the experiment's network factory (`functools.partial(make_networks,
    hidden_sizes=...)`), so it is called inside each node process.
    """
    observation_shape = environment_spec.observations.shape
    action_shape = environment_spec.actions.shape
    if len(observation_shape) != 1 or len(action_shape) != 1:
        raise ValueError(
            "TD3 needs flat observation and action vectors; got observation shape "
            f"{observation_shape} and action shape {action_shape}. Wrap the environment "
            "with acme.wrappers.ConcatObservationWrapper (see projects/td3/environment.py)."
        )
    observation_size = int(np.prod(observation_shape))
    action_size = int(np.prod(action_shape))
    hidden_sizes = tuple(int(size) for size in hidden_sizes)

    def policy(observation: jax.Array) -> jax.Array:
        mlp = hk.nets.MLP([*hidden_sizes, action_size], activation=jax.nn.relu, name="policy")
        return jnp.tanh(mlp(observation))

    def critic(observation: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        inputs = jnp.concatenate([observation, action], axis=-1)
        # Two independent heads: TD3's clipped double-Q takes the minimum of the two.
        q1 = hk.nets.MLP([*hidden_sizes, 1], activation=jax.nn.relu, name="q1")(inputs)
        q2 = hk.nets.MLP([*hidden_sizes, 1], activation=jax.nn.relu, name="q2")(inputs)
        return jnp.squeeze(q1, -1), jnp.squeeze(q2, -1)

    return TD3Networks(
        **pure_functions(policy=policy, critic=critic),
        observation_size=observation_size,
        action_size=action_size,
    )
