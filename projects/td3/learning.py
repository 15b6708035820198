"""The TD3 learner: one jitted update, and the toolkit's `JaxLearner` around it.

Batch contract (what the dataset yields; an `acme.types.Transition`, possibly inside a
`reverb.ReplaySample(info, data)`, as `NStepTransitionAdder` + `make_reverb_dataset` give):

    observation       float32 [B, O]
    action            float32 [B, A]   in [-1, 1]
    reward            float32 [B]      n-step return sum_k gamma^k r_{t+k}
    discount          float32 [B]      gamma^(n-1) * prod_k d_{t+k} (Acme's convention: the
                                       learner multiplies by gamma once more)
    next_observation  float32 [B, O]   observation n agent steps later

One update (Fujimoto et al. 2018, Algorithm 1):
- critic, every update: y = r + gamma * discount * min_i Q'_i(s', clip(pi'(s') + eps, -1, 1)),
  eps = clip(N(0, policy_noise), -noise_clip, noise_clip); loss = sum_i mean (Q_i(s, a) - y)^2;
- actor and both target networks, every `policy_delay` updates (the 2nd, 4th, ... update):
  the actor maximises Q_1(s, pi(s)) with the critic just updated, then
  target <- tau * online + (1 - tau) * target for the actor and the critics.
The delay is a `lax.cond` inside the one compiled update, so the step count stays on device.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from magi_lp import JaxLearner
from magi_lp.acme_api import counting, loggers
from magi_lp.agent.twin_critic import (
    clipped_double_q_target,
    soft_update,
    twin_critic_loss,
    twin_critic_metrics,
)
from projects.td3.networks import Params, TD3Networks


class TrainingState(NamedTuple):
    """Everything the learner owns; a pytree of arrays, checkpointed as it is.

    policy_params / critic_params: online networks; target_policy_params /
    target_critic_params: their soft-updated copies; policy_opt_state / critic_opt_state:
    Adam states; steps: updates done (int32 scalar); key: PRNG key of the target noise.
    """

    policy_params: Params
    critic_params: Params
    target_policy_params: Params
    target_critic_params: Params
    policy_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    steps: jax.Array
    key: jax.Array


def _make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    return optax.adam(config.learning_rate)


def init_training_state(
    networks: TD3Networks, config: ml_collections.ConfigDict, key: jax.Array
) -> TrainingState:
    """Fresh learner state; targets start as copies of the online networks."""
    params_key, state_key = jax.random.split(key)
    policy_params, critic_params = networks.init(params_key)
    optimizer = _make_optimizer(config)
    copy = jax.tree_util.tree_map(jnp.copy, (policy_params, critic_params))
    return TrainingState(
        policy_params=policy_params,
        critic_params=critic_params,
        target_policy_params=copy[0],
        target_critic_params=copy[1],
        policy_opt_state=optimizer.init(policy_params),
        critic_opt_state=optimizer.init(critic_params),
        steps=jnp.zeros((), jnp.int32),
        key=state_key,
    )


def make_update_fn(networks: TD3Networks, config: ml_collections.ConfigDict):
    """The jitted TD3 update: `update(state, batch) -> (state, metrics)`.

    metrics are float32 scalars: critic_loss, q1, q2, target_q, actor_loss (the loss of the
    current actor, whether or not this update stepped it), batch_reward.
    """
    optimizer = _make_optimizer(config)
    discount = float(config.discount)
    tau = float(config.tau)
    policy_noise = float(config.policy_noise)
    noise_clip = float(config.noise_clip)
    policy_delay = int(config.policy_delay)  # >= 1: projects.td3.config.validate_config

    def critic_loss_fn(critic_params, observation, action, target_q):
        q1, q2 = networks.critic_apply(critic_params, observation, action)
        return twin_critic_loss(q1, q2, target_q), (q1, q2)

    def actor_loss_fn(policy_params, critic_params, observation):
        action = networks.policy_apply(policy_params, observation)
        q1, _ = networks.critic_apply(critic_params, observation, action)
        return -jnp.mean(q1)

    def update(state: TrainingState, batch: Any) -> tuple[TrainingState, dict[str, jax.Array]]:
        key, noise_key = jax.random.split(state.key)
        observation = jnp.asarray(batch.observation, jnp.float32)
        action = jnp.asarray(batch.action, jnp.float32)
        reward = jnp.asarray(batch.reward, jnp.float32)
        transition_discount = jnp.asarray(batch.discount, jnp.float32)
        next_observation = jnp.asarray(batch.next_observation, jnp.float32)

        # Target policy smoothing: clipped noise on the target actor's action.
        next_action = networks.policy_apply(state.target_policy_params, next_observation)
        noise = policy_noise * jax.random.normal(noise_key, next_action.shape)
        noise = jnp.clip(noise, -noise_clip, noise_clip)
        next_action = jnp.clip(next_action + noise, -1.0, 1.0)
        target_q1, target_q2 = networks.critic_apply(
            state.target_critic_params, next_observation, next_action
        )
        target_q = clipped_double_q_target(
            reward, discount * transition_discount, target_q1, target_q2
        )

        (critic_loss, (q1, q2)), critic_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(
            state.critic_params, observation, action, target_q
        )
        critic_updates, critic_opt_state = optimizer.update(
            critic_grads, state.critic_opt_state, state.critic_params
        )
        state = state._replace(
            critic_params=optax.apply_updates(state.critic_params, critic_updates),
            critic_opt_state=critic_opt_state,
            steps=state.steps + 1,
            key=key,
        )

        def delayed_update(state: TrainingState) -> tuple[TrainingState, jax.Array]:
            """The actor (with the critic just updated) and both target networks move."""
            actor_loss, policy_grads = jax.value_and_grad(actor_loss_fn)(
                state.policy_params, state.critic_params, observation
            )
            policy_updates, policy_opt_state = optimizer.update(
                policy_grads, state.policy_opt_state, state.policy_params
            )
            policy_params = optax.apply_updates(state.policy_params, policy_updates)
            moved = state._replace(
                policy_params=policy_params,
                policy_opt_state=policy_opt_state,
                target_policy_params=soft_update(policy_params, state.target_policy_params, tau),
                target_critic_params=soft_update(
                    state.critic_params, state.target_critic_params, tau
                ),
            )
            return moved, actor_loss

        def no_update(state: TrainingState) -> tuple[TrainingState, jax.Array]:
            return state, actor_loss_fn(state.policy_params, state.critic_params, observation)

        state, actor_loss = jax.lax.cond(
            state.steps % policy_delay == 0, delayed_update, no_update, state
        )
        metrics = {
            "critic_loss": critic_loss,
            **twin_critic_metrics(q1, q2, target_q),
            "actor_loss": actor_loss,
            "batch_reward": jnp.mean(reward),
        }
        return state, metrics

    return jax.jit(update)


class TD3Learner(JaxLearner[TrainingState]):
    """Variables: "policy" -> actor params (what actors pull), "critic" -> both heads."""

    def __init__(
        self,
        networks: TD3Networks,
        config: ml_collections.ConfigDict,
        iterator: Iterator[Any],
        random_key: jax.Array,
        logger: loggers.Logger | None = None,
        counter: counting.Counter | None = None,
    ):
        """Creates the learner with fresh parameters.

        Args:
          networks: from `make_networks`.
          config: the agent config (`get_agent_config`).
          iterator: training batches (see the module docstring for the contract).
          random_key: the learner's key (parameter init, target noise).
          logger, counter: see `magi_lp.agent.learner.JaxLearner`.
        """
        super().__init__(
            make_update_fn(networks, config),
            init_training_state(networks, config, random_key),
            iterator,
            counter=counter,
            logger=logger,
        )

    def variables(self, state: TrainingState) -> Mapping[str, Any]:
        return {"policy": state.policy_params, "critic": state.critic_params}

    @property
    def num_updates(self) -> int:
        """Updates done, restored ones included."""
        return int(self.state.steps)
