"""The twin-critic pieces TD3 and DrQ-v2 share: clipped double-Q targets, the critic loss,
its logged means, and soft target updates (Fujimoto et al. 2018)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def clipped_double_q_target(
    reward: jax.Array, discount: jax.Array, target_q1: jax.Array, target_q2: jax.Array
) -> jax.Array:
    """y = reward + discount * min(Q'_1, Q'_2), without gradient; `discount` multiplies the
    bootstrapped value as it is (fold gamma in first where the batch's discount lacks it)."""
    return jax.lax.stop_gradient(reward + discount * jnp.minimum(target_q1, target_q2))


def twin_critic_loss(q1: jax.Array, q2: jax.Array, target_q: jax.Array) -> jax.Array:
    """sum_i mean (Q_i - y)^2 over both heads."""
    return jnp.mean(jnp.square(q1 - target_q)) + jnp.mean(jnp.square(q2 - target_q))


def twin_critic_metrics(
    q1: jax.Array, q2: jax.Array, target_q: jax.Array, *, prefix: str = ""
) -> dict[str, jax.Array]:
    """The batch means a learner logs: `<prefix>q1`, `<prefix>q2`, `<prefix>target_q`."""
    means = {"q1": q1, "q2": q2, "target_q": target_q}
    return {f"{prefix}{name}": jnp.mean(value) for name, value in means.items()}


def soft_update(online: Any, target: Any, tau: float) -> Any:
    """target <- tau * online + (1 - tau) * target, leaf by leaf."""
    return jax.tree_util.tree_map(lambda o, t: tau * o + (1.0 - tau) * t, online, target)
