"""The DrQ-v2 learner: one jitted update (augment, critic + encoder step, actor step,
soft target update) and an Acme-style `Learner` around it.

Batch contract (what the replay must deliver to `update`): a
`magi_lp.replay.frame_window.FrameTransition`, what the DrQ builder's replay yields, or an
`acme.types.Transition` (any object with these attributes):

    frames            uint8   [B, frame_stack + n, H, W, 3]  FrameTransition: the unique
                                                        frames, oldest first; the update
                                                        stacks them on its device
    observation       uint8   [B, H, W, 3*frame_stack]  Transition: oldest frame first
    next_observation  uint8   [B, H, W, 3*frame_stack]  Transition: n agent steps later
    action            float32 [B, A]                    in [-1, 1]
    reward            float32 [B]                       n-step return sum_k gamma^k r_{t+k}
    discount          float32 [B]                       gamma^n * prod_k d_{t+k}: multiplies
                                                        the bootstrapped value as it is

Both give the same update: `window_observations` stacks exactly as the host would.

Note on `discount`: Acme's `NStepTransitionAdder` stores gamma^(n-1) * prod d (Acme
learners multiply by gamma once more); a replay built on it must multiply by
`config.discount` before handing batches here.

Following the official implementation (facebookresearch/drqv2): the encoder is trained by
the critic loss only and shared with the actor, whose loss sees stop-gradient features;
there is no target encoder: targets use the online encoder's features of the augmented
next observation (no gradient) and a target copy of the critic only; the actor is updated
after the critic, with the features computed before the critic step and the updated critic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from magi_lp import ReplaySchedule
from magi_lp.agent.twin_critic import (
    clipped_double_q_target,
    soft_update,
    twin_critic_loss,
    twin_critic_metrics,
)
from magi_lp.replay.frame_window import window_observations
from projects.drq_v2.augmentations import random_shift
from projects.drq_v2.networks import DrQNetworks, sample_action

Params = Any


class TrainingState(NamedTuple):
    """Everything the learner owns; a pytree, so it can be checkpointed as it is.

    params: {'encoder', 'actor', 'critic'}; target_critic_params: the soft-updated copy of
    params['critic']; critic_opt_state: Adam state over {'encoder', 'critic'};
    actor_opt_state: Adam state over params['actor']; steps: updates done (int32);
    key: PRNG key for augmentation and policy noise.
    """

    params: dict[str, Params]
    target_critic_params: Params
    critic_opt_state: optax.OptState
    actor_opt_state: optax.OptState
    steps: jax.Array
    key: jax.Array


def stddev_schedule(step: jax.Array | int, config: ml_collections.ConfigDict) -> jax.Array:
    """Exploration stddev at an agent step: linear from init to final over duration, then flat.

    The official `linear(init,final,duration)` schedule; `step` counts agent steps.
    """
    schedule = config.stddev_schedule
    mix = jnp.clip(jnp.asarray(step, jnp.float32) / schedule.duration, 0.0, 1.0)
    return (1.0 - mix) * schedule.init + mix * schedule.final


def _make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate, eps=config.adam_eps)


def init_training_state(
    networks: DrQNetworks,
    config: ml_collections.ConfigDict,
    key: jax.Array,
    obs_example: Any,
) -> TrainingState:
    """Fresh learner state.

    Args:
        networks: from `make_networks`.
        config: the agent config.
        key: PRNG key.
        obs_example: one observation [H, W, C], or a dm_env spec of it (anything with
            `generate_value()`); the action dimension comes from `networks`.
    """
    if hasattr(obs_example, "generate_value"):
        obs_example = obs_example.generate_value()
    params_key, state_key = jax.random.split(key)
    params = networks.init(params_key, obs_example)
    optimizer = _make_optimizer(config)
    critic_params = {"encoder": params["encoder"], "critic": params["critic"]}
    return TrainingState(
        params=params,
        target_critic_params=jax.tree_util.tree_map(jnp.copy, params["critic"]),
        critic_opt_state=optimizer.init(critic_params),
        actor_opt_state=optimizer.init(params["actor"]),
        steps=jnp.zeros((), jnp.int32),
        key=state_key,
    )


def batch_observations(batch: Any, n_step: int) -> tuple[jax.Array, jax.Array]:
    """(observation, next observation) of a batch, uint8 [B, H, W, 3*frame_stack] each.

    A `FrameTransition`'s window is stacked here, on the update's device; a `Transition`
    already holds both stacks.
    """
    if hasattr(batch, "frames"):
        return window_observations(jnp.asarray(batch.frames), n_step)
    return jnp.asarray(batch.observation), jnp.asarray(batch.next_observation)


def make_update_fn(
    networks: DrQNetworks, config: ml_collections.ConfigDict, schedule: ReplaySchedule
):
    """The jitted DrQ-v2 update: `update(state, batch, agent_step=None) -> (state, metrics)`.

    `agent_step` drives the noise schedule. When None it is the global agent step implied by
    the update count, `schedule.actor_steps_after_updates(state.steps)`: the same conversion
    the actors use (`projects.drq_v2.learner.DrQLearner` serves it to them). metrics are
    scalar float32 arrays.
    """
    optimizer = _make_optimizer(config)
    pad = config.augmentation_pad
    n_step = int(config.n_step)
    tau = config.critic_target_tau
    noise_clip = config.stddev_clip
    clamp_eps = config.action_clamp_eps

    def critic_loss_fn(trainable, obs, action, target_q):
        features = networks.encoder_apply(trainable["encoder"], obs)
        q1, q2 = networks.critic_apply(trainable["critic"], features, action)
        return twin_critic_loss(q1, q2, target_q), (features, q1, q2)

    def actor_loss_fn(actor_params, critic_params, features, stddev, key):
        mean = networks.actor_apply(actor_params, features)
        action = sample_action(key, mean, stddev, noise_clip, clamp_eps)
        q1, q2 = networks.critic_apply(critic_params, features, action)
        return -jnp.mean(jnp.minimum(q1, q2))

    def update(state: TrainingState, batch: Any, agent_step: jax.Array | None = None):
        key, obs_key, next_obs_key, target_key, actor_key = jax.random.split(state.key, 5)
        if agent_step is None:
            agent_step = schedule.actor_steps_after_updates(state.steps)
        stddev = stddev_schedule(agent_step, config)
        params = state.params

        obs, next_obs = batch_observations(batch, n_step)
        # Crop the uint8 pixels, then convert: the same values as shifting floats.
        obs = random_shift(obs_key, obs, pad).astype(jnp.float32)
        next_obs = random_shift(next_obs_key, next_obs, pad).astype(jnp.float32)
        action = jnp.asarray(batch.action, jnp.float32)
        reward = jnp.asarray(batch.reward, jnp.float32)
        discount = jnp.asarray(batch.discount, jnp.float32)

        # TD target: online encoder and actor, target critic, no gradient.
        next_features = networks.encoder_apply(params["encoder"], next_obs)
        next_mean = networks.actor_apply(params["actor"], next_features)
        next_action = sample_action(target_key, next_mean, stddev, noise_clip, clamp_eps)
        target_q1, target_q2 = networks.critic_apply(
            state.target_critic_params, next_features, next_action
        )
        target_q = clipped_double_q_target(reward, discount, target_q1, target_q2)

        # Encoder and critic, one Adam over both.
        trainable = {"encoder": params["encoder"], "critic": params["critic"]}
        (critic_loss, (features, q1, q2)), critic_grads = jax.value_and_grad(
            critic_loss_fn, has_aux=True
        )(trainable, obs, action, target_q)
        critic_updates, critic_opt_state = optimizer.update(
            critic_grads, state.critic_opt_state, trainable
        )
        trainable = optax.apply_updates(trainable, critic_updates)

        # Actor: pre-update features without gradient, updated critic.
        features = jax.lax.stop_gradient(features)
        actor_loss, actor_grads = jax.value_and_grad(actor_loss_fn)(
            params["actor"], trainable["critic"], features, stddev, actor_key
        )
        actor_updates, actor_opt_state = optimizer.update(
            actor_grads, state.actor_opt_state, params["actor"]
        )
        actor_params = optax.apply_updates(params["actor"], actor_updates)

        target_critic_params = soft_update(trainable["critic"], state.target_critic_params, tau)
        new_state = TrainingState(
            params={
                "encoder": trainable["encoder"],
                "actor": actor_params,
                "critic": trainable["critic"],
            },
            target_critic_params=target_critic_params,
            critic_opt_state=critic_opt_state,
            actor_opt_state=actor_opt_state,
            steps=state.steps + 1,
            key=key,
        )
        metrics = {
            "critic_loss": critic_loss,
            **twin_critic_metrics(q1, q2, target_q, prefix="critic_"),
            "actor_loss": actor_loss,
            "actor_stddev": stddev,
            "batch_reward": jnp.mean(reward),
        }
        return new_state, metrics

    return jax.jit(update)


def policy_params(state: TrainingState) -> dict[str, Params]:
    """What an actor needs: {'encoder', 'actor'}."""
    return {"encoder": state.params["encoder"], "actor": state.params["actor"]}
