"""DrQ-v2 learner update, noise schedule and actor cores, at tiny sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import specs

from magi_lp.acme_api import types
from magi_lp.replay.frame_window import FrameTransition
from projects.drq_v2.acting import GLOBAL_AGENT_STEPS, make_actor_core
from projects.drq_v2.config import get_agent_config, replay_schedule
from projects.drq_v2.learner import DrQLearner
from projects.drq_v2.learning import (
    init_training_state,
    make_update_fn,
    policy_params,
    stddev_schedule,
)
from projects.drq_v2.networks import make_networks

ACTION_DIM = 2
IMAGE = 16
BATCH = 8


def _tiny_config():
    config = get_agent_config()
    config.feature_dim = 8
    config.hidden_dim = 32
    config.encoder_channels = 8
    config.learning_rate = 1e-3  # visible progress within a few dozen updates
    return config


def _networks(config):
    action_spec = specs.BoundedArray((ACTION_DIM,), np.float32, -1.0, 1.0)
    return make_networks(action_spec, config)


def _batch(seed=0, discount=0.9):
    rng = np.random.default_rng(seed)
    return types.Transition(
        observation=rng.integers(0, 256, (BATCH, IMAGE, IMAGE, 9), dtype=np.uint8),
        action=rng.uniform(-1, 1, (BATCH, ACTION_DIM)).astype(np.float32),
        reward=rng.normal(size=BATCH).astype(np.float32),
        discount=np.full(BATCH, discount, np.float32),
        next_observation=rng.integers(0, 256, (BATCH, IMAGE, IMAGE, 9), dtype=np.uint8),
    )


def _schedule(config):
    return replay_schedule(config, action_repeat=2)


def _obs_example():
    return np.zeros((IMAGE, IMAGE, 9), np.uint8)


@pytest.fixture(scope="module")
def setup():
    config = _tiny_config()
    networks = _networks(config)
    update = make_update_fn(networks, config, _schedule(config))
    state = init_training_state(networks, config, jax.random.PRNGKey(0), _obs_example())
    return config, networks, update, state


def test_stddev_schedule_start_middle_end():
    config = get_agent_config()
    config.stddev_schedule.duration = 1000
    assert float(stddev_schedule(0, config)) == pytest.approx(1.0)
    assert float(stddev_schedule(500, config)) == pytest.approx(0.55)
    assert float(stddev_schedule(1000, config)) == pytest.approx(0.1)
    assert float(stddev_schedule(10**9, config)) == pytest.approx(0.1)
    assert float(jax.jit(lambda step: stddev_schedule(step, config))(250)) == pytest.approx(0.775)


def test_task_overrides_set_schedule_length():
    assert get_agent_config("walker", "walk").stddev_schedule.duration == 100_000
    assert get_agent_config("reacher", "hard").stddev_schedule.duration == 500_000
    humanoid = get_agent_config("humanoid", "run")
    assert humanoid.stddev_schedule.duration == 2_000_000
    assert humanoid.learning_rate == pytest.approx(8e-5)


def test_init_state(setup):
    _, _, _, state = setup
    assert set(state.params) == {"encoder", "actor", "critic"}
    assert int(state.steps) == 0
    for online, target in zip(
        jax.tree_util.tree_leaves(state.params["critic"]),
        jax.tree_util.tree_leaves(state.target_critic_params),
        strict=True,
    ):
        np.testing.assert_array_equal(online, target)


def test_updates_are_finite_and_lower_the_critic_loss(setup):
    _, _, update, state = setup
    batch = _batch()
    losses = []
    for _ in range(50):
        state, metrics = update(state, batch)
        assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
        losses.append(float(metrics["critic_loss"]))
    assert int(state.steps) == 50
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:5]), losses


def test_target_critic_moves_by_exactly_tau(setup):
    config, _, update, state = setup
    tau = config.critic_target_tau
    new_state, _ = update(state, _batch())
    for online, target, new_target in zip(
        jax.tree_util.tree_leaves(new_state.params["critic"]),
        jax.tree_util.tree_leaves(state.target_critic_params),
        jax.tree_util.tree_leaves(new_state.target_critic_params),
        strict=True,
    ):
        expected = tau * np.asarray(online) + (1 - tau) * np.asarray(target)
        np.testing.assert_allclose(new_target, expected, rtol=1e-6, atol=1e-7)
    # ...and every network did move.
    for name in ("encoder", "actor", "critic"):
        before = jax.tree_util.tree_leaves(state.params[name])
        after = jax.tree_util.tree_leaves(new_state.params[name])
        assert any(not np.allclose(a, b) for a, b in zip(before, after, strict=True)), name


def test_frame_windows_update_exactly_like_host_stacked_observations(setup):
    """The replay's FrameTransition, stacked inside the jitted update, gives the same state
    and metrics, bit for bit, as the stacked Transition a host-side replay would deliver."""
    config, _, update, state = setup
    n_step = config.n_step
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (BATCH, 3 + n_step, IMAGE, IMAGE, 3), dtype=np.uint8)
    stacked = _batch(6)._replace(
        # Host-side stacking as the replay did it: frames oldest first along channels.
        observation=np.concatenate(list(frames[:, :3].transpose(1, 0, 2, 3, 4)), axis=-1),
        next_observation=np.concatenate(list(frames[:, n_step:].transpose(1, 0, 2, 3, 4)), axis=-1),
    )
    window = FrameTransition(
        frames=frames,
        action=stacked.action,
        reward=stacked.reward,
        discount=stacked.discount,
    )
    state_a, metrics_a = update(state, stacked)
    state_b, metrics_b = update(state, window)
    for a, b in zip(
        jax.tree_util.tree_leaves((state_a, metrics_a)),
        jax.tree_util.tree_leaves((state_b, metrics_b)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_zero_discount_target_is_the_reward(setup):
    _, _, update, state = setup
    batch = _batch(discount=0.0)
    _, metrics = update(state, batch)
    assert float(metrics["critic_target_q"]) == pytest.approx(float(np.mean(batch.reward)))


def test_agent_step_drives_the_noise_schedule(setup):
    config, _, update, state = setup
    _, metrics = update(state, _batch())
    assert float(metrics["actor_stddev"]) == pytest.approx(1.0)
    late = jnp.asarray(config.stddev_schedule.duration, jnp.int32)
    _, metrics = update(state, _batch(), late)
    assert float(metrics["actor_stddev"]) == pytest.approx(0.1)


def test_learner_noise_follows_the_global_step_the_actors_use(setup):
    """One conversion from updates to agent steps, on the learner and on the actors."""
    config, _, update, state = setup
    schedule = _schedule(config)
    for updates in (1, 1000, 100_000):
        _, metrics = update(state._replace(steps=jnp.asarray(updates, jnp.int32)), _batch())
        agent_step = schedule.actor_steps_after_updates(updates)
        assert agent_step == schedule.min_replay_size + (updates - 1) * 2
        expected = float(stddev_schedule(agent_step, config))
        assert float(metrics["actor_stddev"]) == pytest.approx(expected, rel=1e-6)


def test_learner_steps_and_serves_policy_variables():
    config = _tiny_config()
    networks = _networks(config)
    batches = iter([_batch(0), _batch(1)])
    schedule = _schedule(config)
    learner = DrQLearner(networks, config, schedule, batches, jax.random.PRNGKey(0), _obs_example())
    learner.step()
    learner.step()
    assert learner.num_updates == 2
    (policy,) = learner.get_variables(["policy"])
    assert set(policy) == {"encoder", "actor", GLOBAL_AGENT_STEPS}
    assert int(policy[GLOBAL_AGENT_STEPS]) == schedule.actor_steps_after_updates(2)
    with pytest.raises(KeyError, match="serves"):
        learner.get_variables(["no_such_variables"])


def test_actor_explores_uniformly_then_follows_the_policy(setup):
    config, networks, _, state = setup
    config = _tiny_config()
    config.num_expl_steps = 3
    config.stddev_schedule.duration = 1  # noise stddev 0.1 right away
    params = policy_params(state)
    core = make_actor_core(networks, config)
    select = jax.jit(core.select_action)
    obs = np.random.default_rng(0).integers(0, 256, (IMAGE, IMAGE, 9), dtype=np.uint8)
    mean = np.asarray(
        networks.actor_apply(params["actor"], networks.encoder_apply(params["encoder"], obs[None]))
    )[0]
    actor_state = core.init(jax.random.PRNGKey(0))
    actions = []
    for _ in range(8):
        action, actor_state = select(params, obs, actor_state)
        assert action.shape == (ACTION_DIM,) and action.dtype == jnp.float32
        assert np.all(np.abs(np.asarray(action)) <= 1.0)
        actions.append(np.asarray(action))
    assert int(actor_state.steps) == 8
    assert core.get_extras(actor_state) == ()
    distances = [np.abs(a - mean).max() for a in actions]
    # Random phase: uniform actions, far from the mean (0.1-stddev noise would stay near it).
    assert max(distances[:3]) > 0.3
    # Policy phase: the mean plus small noise, and not deterministic.
    assert max(distances[3:]) < 0.5
    assert not np.allclose(actions[3], actions[4])


def test_eval_policy_is_the_deterministic_mean(setup):
    config, networks, _, state = setup
    params = policy_params(state)
    core = make_actor_core(networks, config, evaluation=True)
    obs = np.random.default_rng(1).integers(0, 256, (IMAGE, IMAGE, 9), dtype=np.uint8)
    first, actor_state = core.select_action(params, obs, core.init(jax.random.PRNGKey(0)))
    second, _ = core.select_action(params, obs, actor_state)
    third, _ = core.select_action(params, obs, core.init(jax.random.PRNGKey(7)))
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, third)
    mean = networks.actor_apply(
        params["actor"], networks.encoder_apply(params["encoder"], obs[None])
    )
    # Jitted vs eager: XLA may fuse differently (1.7e-6 apart on jax 0.11.2).
    np.testing.assert_allclose(first, mean[0], rtol=1e-5)
