"""What shortens a launch: the learner serves before it builds, actors compile their policy
while the first parameters are on their way, and the learner compiles its update before the
first batch. Each checked for what it promises (the order, and no second compile)."""

from __future__ import annotations

import logging
import threading
import time
from unittest import mock

import jax
import numpy as np
import pytest
import reverb
from acme.utils import counting
from dm_env import specs

from magi_lp.agent.actor import BatchedActor, GenericActor
from magi_lp.agent.learner import JaxLearner
from magi_lp.agent.variable_client import VariableClient
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.loggers import LoggerFactory
from magi_lp.runtime.nodes import LearnerNode
from projects.drq_v2.acting import GLOBAL_AGENT_STEPS, make_actor_core
from projects.drq_v2.config import get_agent_config
from projects.drq_v2.learning import init_training_state, policy_params
from projects.drq_v2.networks import make_networks
from tests.runtime_toys import toy_config, toy_experiment

IMAGE = 16


class CompileLog(logging.Handler):
    """Collects JAX's "Finished XLA compilation of jit(<name>)" lines."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of jit("):
            self.names.append(message.split("jit(", 1)[1].split(")", 1)[0])


@pytest.fixture
def compiles():
    handler = CompileLog()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    # Globally, not `jax.log_compiles()`: that context is per thread, and compiles ahead
    # happen on background threads.
    jax.config.update("jax_log_compiles", True)
    try:
        yield handler.names
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)


def test_learner_node_serves_before_it_builds_and_callers_wait_for_the_build(tmp_path, request):
    config = toy_config()
    experiment = toy_experiment(config)
    factory = LoggerFactory.from_config(str(tmp_path), config.logging)
    counter = counting.Counter()
    spec = experiment.get_environment_spec()
    server = reverb.Server(experiment.builder.make_replay_tables(spec))
    request.addfinalizer(server.stop)
    client = reverb.Client(f"localhost:{server.port}")
    store = resolve_store(experiment.builder, config)
    start = time.monotonic()
    lifetime = mock.Mock(stopping=lambda: False)  # the engine's; only run() would use it
    node = LearnerNode(
        experiment, store, spec, client, counter, str(tmp_path), factory, lifetime=lifetime
    )
    assert node._runner is None  # nothing built: Launchpad can start serving at once
    assert time.monotonic() - start < 5.0
    pulled = []
    caller = threading.Thread(target=lambda: pulled.append(node.get_variables(["policy"])))
    caller.start()
    time.sleep(0.3)
    assert caller.is_alive() and not pulled  # an actor's first pull waits for the build
    node._build()  # what run() does once Launchpad serves the node
    caller.join(timeout=30)
    assert pulled and pulled[0][0]  # the TD3 policy's parameters

    def broken():
        raise ValueError("bad network")

    failing = LearnerNode(
        experiment, store, spec, client, counter, str(tmp_path), factory, lifetime=lifetime
    )
    failing._make_runner = broken
    with pytest.raises(ValueError, match="bad network"):
        failing._build()
    # The caller (an actor) is told the learner's own error: its exit report names it.
    with pytest.raises(RuntimeError, match="the learner failed to build: ValueError: bad network"):
        failing.get_variables(["policy"])


class GatedSource:
    """A learner stand-in whose first `get_variables` waits until released (a learner still
    building); it serves numpy arrays, as a Courier handle does."""

    def __init__(self, policy):
        self._policy = jax.tree_util.tree_map(np.asarray, policy)
        self.release = threading.Event()
        self.calls = 0

    def get_variables(self, names):
        self.calls += 1
        self.release.wait()
        return [self._policy for _ in names]


@pytest.mark.parametrize("evaluation,envs", [(False, 1), (True, 1), (False, 3)])
def test_actor_compiles_its_policy_before_its_first_parameters_and_never_again(
    compiles, evaluation, envs
):
    config = get_agent_config()
    config.feature_dim, config.hidden_dim, config.encoder_channels = 8, 32, 8
    spec = specs.BoundedArray((IMAGE, IMAGE, 9), np.uint8, 0, 255)
    action_spec = specs.BoundedArray((2,), np.float32, -1.0, 1.0)
    networks = make_networks(action_spec, config)
    state = init_training_state(networks, config, jax.random.PRNGKey(0), spec.generate_value())
    # What DrQLearner serves as "policy".
    source = GatedSource({**policy_params(state), GLOBAL_AGENT_STEPS: np.int32(7)})
    core = make_actor_core(networks, config, evaluation=evaluation, observation_spec=spec)
    client = VariableClient(source, "policy")
    observation = np.random.default_rng(0).integers(0, 256, spec.shape, dtype=np.uint8)
    if envs == 1:
        actor = GenericActor(core, jax.random.PRNGKey(1), client)
        act = actor.select_action
    else:  # envs_per_actor: one vmapped call for all environments
        keys = list(jax.random.split(jax.random.PRNGKey(1), envs))
        actor = BatchedActor(core, keys, client, [None] * envs)

        def act(obs):
            return actor.select_actions([obs] * envs)[0]

    assert actor.warm_up(spec.generate_value())  # returned while the learner still builds
    assert "select_action" in compiles
    assert source.calls == 1  # the first pull is already on its way
    compiled = len(compiles)
    source.release.set()
    action = act(observation)
    act(observation)
    assert action.shape == (2,)
    assert "select_action" not in compiles[compiled:]  # the pulled params hit the cache
    assert source.calls == 1  # and the request's fetch was used, not a second one
    # A core without params_shape: nothing to warm up.
    plain = make_actor_core(networks, config, evaluation=evaluation)
    assert not GenericActor(plain, jax.random.PRNGKey(1), None).warm_up(spec.generate_value())


class SumLearner(JaxLearner):
    def variables(self, state):
        return {"total": state}


@pytest.mark.parametrize("made", [False, True], ids=["state", "state_function"])
def test_learner_compiles_its_update_ahead_and_not_again_at_the_first_step(compiles, made):
    def update(state, batch):
        return state + batch["x"].sum(), {"mean": batch["x"].mean()}

    def make_state():  # with a function, the compile starts before the state exists
        return jax.numpy.zeros((), np.float32)

    batches = iter([{"x": np.ones((4, 3), np.float32)}] * 2)
    example = {"x": jax.ShapeDtypeStruct((4, 3), np.float32)}
    state = make_state if made else make_state()
    learner = SumLearner(jax.jit(update), state, batches, example_batch=example)
    learner._compiling.result(timeout=60)  # compiled before any batch exists
    assert "update" in compiles
    compiled = len(compiles)
    learner.step()
    learner.step()
    assert "update" not in compiles[compiled:]
    assert float(learner.get_variables(["total"])[0]) == 24.0
