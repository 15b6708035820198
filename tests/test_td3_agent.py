"""Unit tests of the TD3 project (projects/td3): networks, update, checkpoint state, and the
builder's replay round trip on a real in-process Reverb server. Tiny networks and batches."""

from __future__ import annotations

import functools
import gc
import importlib.util
import pickle
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from acme import specs, types
from acme.adders import reverb as adders_reverb

from magi_lp.placement.resources import ResourceSpec
from magi_lp.replay.reverb_seam import without_rate_limit
from magi_lp.runtime.config import experiment_defaults
from magi_lp.runtime.experiment import Experiment
from projects.td3.builder import TD3Builder
from projects.td3.config import get_agent_config
from projects.td3.environment import make_environment
from projects.td3.experiment import make_experiment
from projects.td3.learning import TD3Learner, init_training_state, make_update_fn
from projects.td3.networks import make_networks
from tests.agent_harness import Rows, actor_and_evaluator, learner_of

BATCH = 32
HIDDEN = (32, 32)
CONFIG_PATH = Path(__file__).resolve().parents[1] / "configs" / "td3_cartpole.py"


def get_config():
    """configs/td3_cartpole.py's config, loaded by path as the entry points' --config does."""
    spec = importlib.util.spec_from_file_location("td3_cartpole_config", CONFIG_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _tree_close(a, b, **kwargs) -> bool:
    return all(
        np.allclose(x, y, **kwargs)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


def _tree_equal(a, b) -> bool:
    return all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


@pytest.fixture(scope="module")
def environment_spec() -> specs.EnvironmentSpec:
    environment = make_environment("cartpole", "balance", seed=0)
    spec = specs.make_environment_spec(environment)
    environment.close()
    return spec


@pytest.fixture()
def agent_config():
    config = get_agent_config()
    config.hidden_sizes = HIDDEN
    config.batch_size = BATCH
    config.min_replay_size = 10
    config.replay_size = 1_000
    config.random_action_steps = 0
    config.dataset_num_parallel_calls = 1
    return config


def _fixed_batch(spec: specs.EnvironmentSpec, seed: int = 0) -> types.Transition:
    rng = np.random.default_rng(seed)
    obs_size = spec.observations.shape[0]
    act_size = spec.actions.shape[0]
    return types.Transition(
        observation=rng.normal(size=(BATCH, obs_size)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(BATCH, act_size)).astype(np.float32),
        reward=rng.uniform(0, 1, size=(BATCH,)).astype(np.float32),
        discount=np.ones((BATCH,), np.float32),
        next_observation=rng.normal(size=(BATCH, obs_size)).astype(np.float32),
    )


def test_environment_is_flat_float32_in_unit_actions(environment_spec):
    assert environment_spec.observations.shape == (5,)
    assert environment_spec.observations.dtype == np.float32
    assert environment_spec.actions.shape == (1,)
    assert environment_spec.actions.dtype == np.float32
    np.testing.assert_array_equal(environment_spec.actions.minimum, [-1.0])
    np.testing.assert_array_equal(environment_spec.actions.maximum, [1.0])
    environment = make_environment("cartpole", "balance", seed=3)
    environment.reset()
    timestep = environment.step(np.zeros(1, np.float32))
    assert timestep.observation.dtype == np.float32
    assert np.asarray(timestep.reward).dtype == np.float32


def test_max_episode_steps_cuts_episodes_as_a_time_limit_does():
    environment = make_environment("cartpole", "balance", seed=3, max_episode_steps=5)
    steps = [environment.reset()]
    while not steps[-1].last():
        steps.append(environment.step(np.zeros(1, np.float32)))
    assert len(steps) == 1 + 5
    assert float(steps[-1].discount) == 1.0  # cut, not a terminal state: bootstrapped
    uncut = make_environment("cartpole", "balance", seed=3)
    uncut.reset()
    assert not any(uncut.step(np.zeros(1, np.float32)).last() for _ in range(5))


def test_network_shapes(environment_spec):
    networks = make_networks(environment_spec, hidden_sizes=HIDDEN)
    policy_params, critic_params = networks.init(jax.random.PRNGKey(0))
    observation = jax.random.normal(jax.random.PRNGKey(1), (7, 5))
    action = networks.policy_apply(policy_params, observation)
    assert action.shape == (7, 1)
    assert bool(jnp.all(jnp.abs(action) < 1.0))
    q1, q2 = networks.critic_apply(critic_params, observation, action)
    assert q1.shape == (7,) and q2.shape == (7,)
    assert not np.allclose(q1, q2)  # two independently initialised heads


def test_repeated_updates_lower_the_critic_loss(environment_spec, agent_config):
    networks = make_networks(environment_spec, hidden_sizes=HIDDEN)
    update = make_update_fn(networks, agent_config)
    state = init_training_state(networks, agent_config, jax.random.PRNGKey(0))
    batch = _fixed_batch(environment_spec)
    losses = []
    for _ in range(150):
        state, metrics = update(state, batch)
        assert all(np.isfinite(np.asarray(value)) for value in metrics.values()), metrics
        losses.append(float(metrics["critic_loss"]))
    assert int(state.steps) == 150
    assert np.mean(losses[-10:]) < 0.5 * losses[0], losses[::15]
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree_util.tree_leaves(state))


def test_actor_and_targets_move_every_policy_delay_updates(environment_spec, agent_config):
    agent_config.policy_delay = 2
    networks = make_networks(environment_spec, hidden_sizes=HIDDEN)
    update = make_update_fn(networks, agent_config)
    tau = agent_config.tau
    state0 = init_training_state(networks, agent_config, jax.random.PRNGKey(0))
    batch = _fixed_batch(environment_spec)

    # Update 1: critic only.
    state1, _ = update(state0, batch)
    assert not _tree_close(state1.critic_params, state0.critic_params)
    assert _tree_equal(state1.policy_params, state0.policy_params)
    assert _tree_equal(state1.target_critic_params, state0.target_critic_params)
    assert _tree_equal(state1.target_policy_params, state0.target_policy_params)

    # Update 2: critic, actor, and both targets move by tau towards the new online nets.
    state2, _ = update(state1, batch)
    assert not _tree_close(state2.policy_params, state1.policy_params)
    expected_critic = jax.tree_util.tree_map(
        lambda o, t: tau * o + (1 - tau) * t, state2.critic_params, state1.target_critic_params
    )
    expected_policy = jax.tree_util.tree_map(
        lambda o, t: tau * o + (1 - tau) * t, state2.policy_params, state1.target_policy_params
    )
    assert _tree_close(state2.target_critic_params, expected_critic, rtol=1e-6, atol=1e-7)
    assert _tree_close(state2.target_policy_params, expected_policy, rtol=1e-6, atol=1e-7)
    assert not _tree_close(state2.target_critic_params, state1.target_critic_params)


def _batches(spec):
    seed = 0
    while True:
        yield _fixed_batch(spec, seed)
        seed += 1


def test_save_restore_round_trip(environment_spec, agent_config):
    networks = make_networks(environment_spec, hidden_sizes=HIDDEN)
    original = TD3Learner(networks, agent_config, _batches(environment_spec), jax.random.PRNGKey(0))
    for _ in range(3):
        original.step()
    saved = original.save()
    assert isinstance(saved.steps, jax.Array) and int(saved.steps) == 3

    restored = TD3Learner(networks, agent_config, _batches(environment_spec), jax.random.PRNGKey(9))
    assert not _tree_equal(restored.get_variables(["policy"]), original.get_variables(["policy"]))
    restored.restore(jax.device_get(saved))  # numpy leaves, as a checkpoint may give back
    names = ["policy", "critic"]
    assert _tree_equal(restored.get_variables(names), original.get_variables(names))
    assert _tree_equal(restored.save(), saved)
    assert restored.num_updates == 3

    # Same state and same batch: the next update is identical (the noise key is in the state).
    batch = _fixed_batch(environment_spec, 42)
    original._iterator = iter([batch])
    restored._iterator = iter([batch])
    original.step()
    restored.step()
    assert _tree_equal(restored.save(), original.save())

    with pytest.raises(ValueError, match="shaped unlike"):
        restored.restore({"policy": saved.policy_params})


def test_learner_logs_metrics_and_counts(environment_spec, agent_config):
    from acme.utils import counting

    parent = counting.Counter(time_delta=0.0)
    recorder = Rows()
    learner = TD3Learner(
        make_networks(environment_spec, hidden_sizes=HIDDEN),
        agent_config,
        _batches(environment_spec),
        jax.random.PRNGKey(0),
        logger=recorder,
        counter=counting.Counter(parent, prefix="learner", time_delta=0.0),
    )
    learner.step()
    learner.step()
    assert parent.get_counts()["learner_steps"] == 2
    assert recorder.rows[-1]["learner_steps"] == 2
    assert {"critic_loss", "actor_loss", "q1", "q2", "target_q"} <= set(recorder.rows[-1])


def test_a_resumed_actor_goes_on_past_the_random_first_steps(environment_spec, agent_config):
    """The random first steps are the run's, not each launch's: an actor made with the
    steps it took before a resume (`steps_before`) acts with its policy at once."""
    from unittest import mock

    from magi_lp.agent.actor import BatchedActor, GenericActor
    from projects.td3.acting import make_actor_core

    config = agent_config.copy_and_resolve_references()
    config.random_action_steps, config.exploration_noise = 100, 0.0
    networks = make_networks(environment_spec, hidden_sizes=HIDDEN)
    params, _ = networks.init(jax.random.PRNGKey(0))
    client = mock.Mock(params=params)
    core = make_actor_core(networks, config)
    observation = np.linspace(-1, 1, 5).astype(np.float32)
    policy = np.clip(np.asarray(networks.policy_apply(params, observation[None]))[0], -1, 1)

    def actions(actor: GenericActor) -> list[float]:
        return [float(actor.select_action(observation)[0]) for _ in range(3)]

    new = GenericActor(core, jax.random.PRNGKey(1), client)
    assert int(new.state.steps) == 0
    assert len(set(actions(new))) == 3  # uniform random: the random first steps
    for before in (100, 5_000):
        resumed = GenericActor(core, jax.random.PRNGKey(1), client, steps_before=before)
        assert int(resumed.state.steps) == before
        np.testing.assert_allclose(actions(resumed), [policy[0]] * 3, rtol=1e-6)
    # Short of the phase's end: still random, for the steps left.
    short = GenericActor(core, jax.random.PRNGKey(1), client, steps_before=50)
    assert len(set(actions(short))) == 3
    batched = BatchedActor(
        core, list(jax.random.split(jax.random.PRNGKey(1), 2)), client, [None, None],
        steps_before=300,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(batched._state.steps), [300, 300])
    np.testing.assert_allclose(
        batched.select_actions([observation, observation])[:, 0], [policy[0]] * 2, rtol=1e-6
    )
    with pytest.raises(ValueError, match="steps_before"):
        GenericActor(core, jax.random.PRNGKey(1), client, steps_before=-1)


def test_builder_replay_round_trip(environment_spec, agent_config):
    import reverb

    builder = TD3Builder(agent_config)
    schedule = builder.replay_schedule()
    assert schedule.batch_size == BATCH and schedule.min_replay_size == 10

    tables = builder.make_replay_tables(environment_spec)
    assert tables[0].info.rate_limiter_info.min_size_to_sample == 10

    server = reverb.Server([without_rate_limit(table) for table in tables])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        _write_sample_learn_act(builder, client, environment_spec, agent_config)
        # The adder's writer flushes when it is deleted: delete it while the server is up.
        gc.collect()
    finally:
        server.stop()


def _write_sample_learn_act(builder, client, environment_spec, agent_config):
    environment = make_environment("cartpole", "balance", seed=1)
    adder = builder.make_adder(client, environment_spec)
    rng = np.random.default_rng(0)
    timestep = environment.reset()
    adder.add_first(timestep)
    for _ in range(40):
        action = rng.uniform(-1, 1, size=(1,)).astype(np.float32)
        timestep = environment.step(action)
        adder.add(action, timestep)
    n_step = agent_config.n_step
    # One item per step once the episode is under way; the last few may still be in flight.
    table = client.server_info()[adders_reverb.DEFAULT_PRIORITY_TABLE]
    assert 30 <= table.current_size <= 40

    dataset = builder.make_dataset_iterator(client)
    batch = next(dataset).data
    assert batch.observation.shape == (BATCH, 5) and batch.observation.dtype == np.float32
    assert batch.next_observation.shape == (BATCH, 5)
    assert batch.action.shape == (BATCH, 1) and batch.action.dtype == np.float32
    assert batch.reward.shape == (BATCH,) and batch.reward.dtype == np.float32
    assert batch.discount.shape == (BATCH,) and batch.discount.dtype == np.float32
    # No episode ended in 40 steps, so an item's discount is gamma^(k-1) for its k-step window:
    # k = n_step, or 1..n_step-1 for the shorter windows Acme writes at an episode's start.
    gamma = np.float32(agent_config.discount)
    windows = np.round(np.log(batch.discount) / np.log(gamma)).astype(int) + 1
    np.testing.assert_allclose(batch.discount, gamma ** (windows - 1), rtol=1e-6)
    assert set(windows) <= set(range(1, n_step + 1)) and n_step in set(windows)
    assert np.all((batch.reward >= 0) & (batch.reward <= n_step))  # n rewards in [0, 1]
    assert np.all(np.abs(batch.action) <= 1)

    # The learner consumes the dataset; an actor and an evaluator act with its params.
    experiment = Experiment(
        builder,
        functools.partial(make_environment, "cartpole", "balance"),
        functools.partial(make_networks, hidden_sizes=HIDDEN),
        experiment_defaults(),
        environment_spec=environment_spec,
    )
    networks = experiment.network_factory(environment_spec)
    learner = learner_of(experiment, networks, dataset)
    learner.step()
    actor, evaluator = actor_and_evaluator(experiment, client, learner, update_period=5)
    observation = timestep.observation
    noisy = [actor.select_action(observation) for _ in range(3)]
    greedy = [evaluator.select_action(observation) for _ in range(3)]
    assert noisy[0].shape == (1,) and noisy[0].dtype == np.float32
    assert len({float(a[0]) for a in noisy}) == 3  # exploration noise
    assert len({float(a[0]) for a in greedy}) == 1  # evaluation is deterministic
    expected = networks.policy_apply(learner.get_variables(["policy"])[0], observation[None])
    np.testing.assert_allclose(greedy[0], np.asarray(expected)[0], rtol=1e-5)
    actor.observe_first(environment.reset())
    actor.observe(noisy[0], environment.step(noisy[0]))
    actor.update()


def test_experiment_config_and_pickling():
    config = get_config()
    # Every toolkit key, with every resource field of every group, so each is overridable.
    assert set(config.keys()) == set(experiment_defaults().keys())
    for group, spec in config.resources.items():
        assert set(spec.keys()) == set(ResourceSpec.field_names()), group
    assert {"domain", "task", "action_repeat"} <= set(config.env.keys())

    experiment = make_experiment(config)
    # Launchpad ships the experiment to every node: plain pickle must do (no lambdas).
    clone = pickle.loads(pickle.dumps(experiment))
    environment = clone.environment_factory(5, True)
    assert environment.reset().observation.shape == (5,)
    assert clone.network_factory(clone.get_environment_spec()).action_size == 1


def test_config_passes_the_toolkits_checks(tmp_path):
    from magi_lp.placement.resources import ResourceSpec
    from magi_lp.runtime.config import validate_experiment_config
    from magi_lp.runtime.loggers import LoggerFactory

    config = get_config()
    validate_experiment_config(config)
    LoggerFactory.from_config(tmp_path, config.logging)
    for group, mapping in config.resources.items():
        spec = ResourceSpec.from_config(group, mapping)
        assert spec.device == "cpu" and spec.render == "none"
