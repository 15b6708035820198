"""DrQ-v2 networks in Haiku: a conv encoder shared by actor and critic, a deterministic
actor (tanh mean; exploration noise is added outside) and a twin-Q critic.

Shapes follow the official PyTorch code (facebookresearch/drqv2, `drqv2.py`), in NHWC:
observations are uint8 [B, H, W, 3*frame_stack]; the encoder gives [B, repr_dim]
(32*35*35 = 39200 at 84x84); the actor gives [B, action_dim] in (-1, 1); the critic gives
two [B] Q-values. Initialisation matches the official `utils.weight_init`: orthogonal
weights (gain sqrt(2), i.e. `calculate_gain('relu')`, for convs; gain 1 for linears) and
zero biases; LayerNorm with scale 1, offset 0, eps 1e-5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import haiku as hk
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from magi_lp.agent.pure_functions import pure_functions
from projects.drq_v2.config import encoder_output_side

if TYPE_CHECKING:  # dm_env is not needed to build the networks (e.g. on a bare GPU box)
    from dm_env import specs

Params = Any  # a Haiku params mapping
PRNGKey = jax.Array

_RELU_GAIN = float(np.sqrt(2.0))  # torch.nn.init.calculate_gain('relu')


def _linear(size: int, name: str | None = None) -> hk.Linear:
    return hk.Linear(size, w_init=hk.initializers.Orthogonal(1.0), name=name)


def _trunk(features: jax.Array, feature_dim: int) -> jax.Array:
    """Linear -> LayerNorm -> tanh: projects the 39200-d encoding to `feature_dim`."""
    h = _linear(feature_dim, name="trunk_linear")(features)
    h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=1e-5, name="trunk_norm")(h)
    return jnp.tanh(h)


def _mlp(hidden_dim: int, output_dim: int, name: str) -> hk.nets.MLP:
    return hk.nets.MLP(
        [hidden_dim, hidden_dim, output_dim],
        w_init=hk.initializers.Orthogonal(1.0),
        activation=jax.nn.relu,
        name=name,
    )


def encoder_repr_dim(image_size: tuple[int, int], config: ml_collections.ConfigDict) -> int:
    """Flattened encoder output size for an image of (height, width), VALID 3x3 convs."""
    layers = (config.encoder_num_layers, config.encoder_kernel_size, config.encoder_first_stride)
    height, width = (encoder_output_side(side, *layers) for side in image_size)
    if height <= 0 or width <= 0:
        raise ValueError(f"image {image_size} is too small for the encoder")
    return config.encoder_channels * height * width


@dataclasses.dataclass(frozen=True)
class DrQNetworks:
    """Pure init/apply functions of the three DrQ-v2 networks.

    Attributes:
        encoder_apply: (encoder params, obs [B,H,W,C] uint8 or float in 0..255) -> [B, repr].
        actor_apply: (actor params, features [B, repr]) -> mean action [B, A] in (-1, 1).
        critic_apply: (critic params, features [B, repr], action [B, A]) -> (q1 [B], q2 [B]).
        action_dim: A.
        init: (key, obs_example) -> {'encoder', 'actor', 'critic'} params; obs_example is
            one observation [H, W, C] (or a batch [B, H, W, C]).
    """

    encoder_init: Callable[[PRNGKey, jax.Array], Params]
    encoder_apply: Callable[[Params, jax.Array], jax.Array]
    actor_init: Callable[[PRNGKey, jax.Array], Params]
    actor_apply: Callable[[Params, jax.Array], jax.Array]
    critic_init: Callable[[PRNGKey, jax.Array, jax.Array], Params]
    critic_apply: Callable[[Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
    action_dim: int

    def init(self, key: PRNGKey, obs_example: Any) -> dict[str, Params]:
        """Fresh parameters for all three networks from one (unbatched) observation."""
        obs = jnp.asarray(obs_example)
        if obs.ndim == 3:
            obs = obs[None]
        encoder_key, actor_key, critic_key = jax.random.split(key, 3)
        encoder_params = self.encoder_init(encoder_key, obs)
        features = self.encoder_apply(encoder_params, obs)
        action = jnp.zeros((obs.shape[0], self.action_dim), jnp.float32)
        return {
            "encoder": encoder_params,
            "actor": self.actor_init(actor_key, features),
            "critic": self.critic_init(critic_key, features, action),
        }


def make_networks(
    action_spec: specs.BoundedArray, config: ml_collections.ConfigDict
) -> DrQNetworks:
    """Builds the DrQ-v2 networks for a 1-d action spec and an agent config."""
    if len(action_spec.shape) != 1:
        raise ValueError(f"DrQ-v2 needs a 1-d action spec, got shape {action_spec.shape}")
    action_dim = int(action_spec.shape[0])

    def encoder_fn(obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32) / 255.0 - 0.5
        for layer in range(config.encoder_num_layers):
            x = hk.Conv2D(
                config.encoder_channels,
                kernel_shape=config.encoder_kernel_size,
                stride=config.encoder_first_stride if layer == 0 else 1,
                padding="VALID",
                w_init=hk.initializers.Orthogonal(_RELU_GAIN),
                name=f"conv_{layer}",
            )(x)
            x = jax.nn.relu(x)
        return x.reshape(x.shape[0], -1)

    def actor_fn(features: jax.Array) -> jax.Array:
        h = _trunk(features, config.feature_dim)
        return jnp.tanh(_mlp(config.hidden_dim, action_dim, name="policy")(h))

    def critic_fn(features: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = _trunk(features, config.feature_dim)
        h_action = jnp.concatenate([h, action.astype(h.dtype)], axis=-1)
        q1 = _mlp(config.hidden_dim, 1, name="q1")(h_action)
        q2 = _mlp(config.hidden_dim, 1, name="q2")(h_action)
        return q1[..., 0], q2[..., 0]

    return DrQNetworks(
        **pure_functions(encoder=encoder_fn, actor=actor_fn, critic=critic_fn),
        action_dim=action_dim,
    )


def sample_action(
    key: PRNGKey,
    mean: jax.Array,
    stddev: jax.Array | float,
    noise_clip: float | None,
    clamp_eps: float,
) -> jax.Array:
    """mean + N(0, stddev) noise (clipped to +-noise_clip unless None), clamped to
    [-1+eps, 1-eps] with a straight-through gradient: the official `TruncatedNormal.sample`.
    """
    noise = stddev * jax.random.normal(key, mean.shape, mean.dtype)
    if noise_clip is not None:
        noise = jnp.clip(noise, -noise_clip, noise_clip)
    action = mean + noise
    clamped = jnp.clip(action, -1.0 + clamp_eps, 1.0 - clamp_eps)
    # The clamp passes gradients through unchanged, as `x - x.detach() + clamped.detach()`.
    return action + jax.lax.stop_gradient(clamped - action)
