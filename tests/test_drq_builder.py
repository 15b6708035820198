"""DrQ-v2 on the builder API (projects/drq_v2/builder.py, experiment.py, tasks.py, video.py)
and its configs, at tiny sizes: a real in-process Reverb server fed by the builder's adder
from real pixel episodes must give the learner its batch contract; the actor and evaluator
act with the learner's parameters; every config file loads, validates and overrides."""

from __future__ import annotations

import os

# Rendering backend must be chosen before dm_control is imported; EGL works without a GPU.
os.environ.setdefault("MUJOCO_GL", "egl")

import dataclasses
import functools
import importlib.util
import pickle
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import reverb
from absl import flags
from acme import specs
from ml_collections import config_flags

from magi_lp.errors import ConfigError
from magi_lp.placement.resources import ResourceSpec, resource_spec
from magi_lp.replay.frame_replay import frame_transition_shape
from magi_lp.replay.reverb_seam import without_rate_limit
from magi_lp.replay.stores import resolve_store
from magi_lp.replay.stores.reverb_frames import FRAME_TABLE
from magi_lp.runtime.config import experiment_defaults, validate_experiment_config
from magi_lp.runtime.experiment import Experiment
from projects.drq_v2.acting import GLOBAL_AGENT_STEPS, make_actor_core
from projects.drq_v2.builder import DrQBuilder
from projects.drq_v2.config import TASK_DIFFICULTY, get_agent_config, validate_config
from projects.drq_v2.experiment import environment_factory, make_experiment, network_factory
from projects.drq_v2.learning import batch_observations
from projects.drq_v2.networks import make_networks
from projects.drq_v2.tasks import PAPER_TASKS, make_config, paper_task_names
from projects.drq_v2.video import EvaluationVideo
from tests.agent_harness import actor_and_evaluator, learner_of

ROOT = Path(__file__).resolve().parents[1]
IMAGE = 24
BATCH = 8
N_STEP = 3
STACK = 3
ACTION_REPEAT = 2
GAMMA = 0.99


def _store_of(experiment):
    """The replay store the runners would resolve for `experiment`."""
    return resolve_store(experiment.builder, experiment.config)


def _replay_experiment(builder, *, num_actors: int = 1, store: str = "reverb") -> Experiment:
    """What the toolkit's replay functions need of an experiment: the builder and config."""
    config = experiment_defaults()
    config.num_actors = num_actors
    config.replay.store = store
    return Experiment(builder, environment_factory=None, network_factory=None, config=config)


def _tiny_agent_config():
    config = get_agent_config("reacher", "easy")
    config.feature_dim = 8
    config.hidden_dim = 32
    config.encoder_channels = 8
    config.batch_size = BATCH
    config.n_step = N_STEP
    config.discount = GAMMA
    config.min_replay_frames = 20  # 10 agent steps
    config.replay_buffer_size = 1_000
    config.dataset_num_parallel_calls = 1
    return config


# The experiment's environment factory for the tiny reacher/easy task.
_ENVIRONMENT_FACTORY = functools.partial(
    environment_factory,
    domain="reacher",
    task="easy",
    image_size=IMAGE,
    action_repeat=ACTION_REPEAT,
    frame_stack=STACK,
    camera_id=0,
)


def _environment(seed=0, max_episode_frames=0):
    return _ENVIRONMENT_FACTORY(seed, False, max_episode_frames=max_episode_frames)


@pytest.fixture(scope="module")
def environment_spec() -> specs.EnvironmentSpec:
    environment = _environment()
    spec = specs.make_environment_spec(environment)
    environment.close()
    return spec


def _load_config(path: Path, argument: str = ""):
    spec = importlib.util.spec_from_file_location(f"config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(argument) if argument else module.get_config()


# --- replay schedule and tables ------------------------------------------------------------


def test_replay_schedule_counts_agent_steps_from_frames(environment_spec):
    builder = DrQBuilder(get_agent_config("reacher", "hard"), frame_stack=3, action_repeat=2)
    schedule = builder.replay_schedule()
    assert schedule.min_replay_size == 2_000  # no updates before 4,000 frames
    assert schedule.actor_steps_per_update == 2
    assert schedule.batch_size == 256
    assert schedule.samples_per_insert == 128

    config = _tiny_agent_config()
    builder = DrQBuilder(config, frame_stack=STACK, action_repeat=ACTION_REPEAT, image_size=IMAGE)
    (table,) = _store_of(_replay_experiment(builder)).make_tables(environment_spec)
    info = table.info
    assert info.max_size == 1_000
    assert info.rate_limiter_info.min_size_to_sample == 10
    assert info.rate_limiter_info.samples_per_insert == pytest.approx(BATCH / 2)

    # Never before the first n-step transition exists.
    config.min_replay_frames = 0
    assert DrQBuilder(config, frame_stack=3, action_repeat=2).replay_schedule().min_replay_size == 3


@pytest.mark.parametrize("writers,eager", [(1, 2_000), (3, 667), (8, 250)])
def test_each_replay_writer_sends_its_share_of_the_first_items_at_once(writers, eager):
    # 4,000 frames / action repeat 2 = 2,000 items before learning, shared by the adders.
    config = get_agent_config("reacher", "hard")
    builder = DrQBuilder(config, frame_stack=3, action_repeat=2, image_size=8)
    spec = specs.EnvironmentSpec(
        observations=specs.BoundedArray((8, 8, 9), np.uint8, 0, 255),
        actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )
    experiment = _replay_experiment(builder, num_actors=writers)
    # Connects on its first add.
    adder = _store_of(experiment).make_adder(spec, reverb.Client("localhost:1"), 0)
    assert adder._eager_items == eager


def _key(observation) -> bytes:
    return np.ascontiguousarray(observation).tobytes()


@pytest.mark.integration  # a real Reverb server and learner, ~9 s
def test_table_adder_dataset_learner_and_actors_on_a_real_server(environment_spec):
    config = _tiny_agent_config()
    builder = DrQBuilder(config, frame_stack=STACK, action_repeat=ACTION_REPEAT, image_size=IMAGE)
    experiment = _replay_experiment(builder)
    tables = _store_of(experiment).make_tables(environment_spec)
    server = reverb.Server([without_rate_limit(table) for table in tables])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        adder = _store_of(experiment).make_adder(environment_spec, client, 0)

        # One real pixel episode of 30 agent steps, recorded for the reference.
        environment = _environment(seed=1, max_episode_frames=60)
        rng = np.random.default_rng(0)
        timestep = environment.reset()
        adder.add_first(timestep)
        observations, rewards, discounts = [timestep.observation], [], []
        actions = []
        while not timestep.last():
            action = rng.uniform(-1, 1, size=environment_spec.actions.shape).astype(np.float32)
            timestep = environment.step(action)
            adder.add(action, timestep)
            observations.append(timestep.observation)
            actions.append(action)
            rewards.append(float(timestep.reward))
            discounts.append(float(timestep.discount))
        assert len(actions) == 30 and timestep.discount == 1.0  # a time limit, not a failure
        # Random actions tell the transitions apart.
        index = {_key(action): t for t, action in enumerate(actions)}
        table = client.server_info()[FRAME_TABLE]
        assert table.current_size == 30 - N_STEP + 1

        dataset = _store_of(experiment).make_learner_replay(environment_spec, client, None).iterator
        batch = next(dataset)
        # Only each transition's unique frames travel; the update stacks them on its device.
        assert batch.frames.shape == (BATCH, STACK + N_STEP, IMAGE, IMAGE, 3)
        assert batch.frames.dtype == np.uint8
        assert batch.action.shape == (BATCH, 2) and batch.action.dtype == np.float32
        assert batch.reward.shape == (BATCH,) and batch.reward.dtype == np.float32
        assert batch.discount.shape == (BATCH,) and batch.discount.dtype == np.float32
        # Shaped as the learner's compile-ahead expects: its first update compiles nothing.
        example = frame_transition_shape(
            BATCH, (IMAGE, IMAGE, 3), environment_spec.actions, frame_stack=STACK, n_step=N_STEP
        )
        assert jax.tree_util.tree_structure(batch) == jax.tree_util.tree_structure(example)
        for real, expected in zip(
            jax.tree_util.tree_leaves(batch), jax.tree_util.tree_leaves(example), strict=True
        ):
            assert (real.shape, real.dtype) == (expected.shape, expected.dtype)
        # Stacked exactly as the update stacks them (on the device, jitted).
        obs, next_obs = jax.jit(batch_observations, static_argnums=1)(batch, N_STEP)
        assert obs.shape == next_obs.shape == (BATCH, IMAGE, IMAGE, 3 * STACK)
        assert obs.dtype == next_obs.dtype == np.uint8
        for i in range(BATCH):
            t = index[_key(batch.action[i])]
            # The stacked observation the action was taken at, and the one n steps later.
            np.testing.assert_array_equal(obs[i], observations[t])
            np.testing.assert_array_equal(next_obs[i], observations[t + N_STEP])
            expected = sum(GAMMA**k * rewards[t + k] for k in range(N_STEP))
            assert batch.reward[i] == pytest.approx(expected, rel=1e-5, abs=1e-6)
            # Ready to multiply the bootstrapped value: gamma^n * prod of discounts.
            assert batch.discount[i] == pytest.approx(GAMMA**N_STEP)

        # The learner consumes the dataset and serves the global step with the policy.
        experiment = dataclasses.replace(
            experiment,
            environment_factory=functools.partial(_ENVIRONMENT_FACTORY, max_episode_frames=60),
            network_factory=functools.partial(network_factory, agent_config=config),
            environment_spec=environment_spec,
        )
        networks = experiment.network_factory(environment_spec)
        learner = learner_of(experiment, networks, dataset)
        learner.step()
        learner.step()
        assert learner.num_updates == 2
        (policy,) = learner.get_variables(["policy"])
        assert set(policy) == {"encoder", "actor", GLOBAL_AGENT_STEPS}
        assert int(policy[GLOBAL_AGENT_STEPS]) == 10 + (2 - 1) * 2

        # Actor and evaluator act with the learner's parameters, as the runners build them.
        actor, evaluator = actor_and_evaluator(experiment, client, learner, update_period=2)
        timestep = environment.reset()
        actor.observe_first(timestep)
        for _ in range(4):
            action = actor.select_action(timestep.observation)
            assert action.shape == (2,) and action.dtype == np.float32
            assert np.all(np.abs(action) <= 1.0)
            timestep = environment.step(action)
            actor.observe(action, timestep)
            actor.update()
        assert int(actor.state.steps) == 4
        greedy = [evaluator.select_action(timestep.observation) for _ in range(2)]
        np.testing.assert_array_equal(greedy[0], greedy[1])  # evaluation: the mean
        params = learner.get_variables(["policy"])[0]
        features = networks.encoder_apply(params["encoder"], timestep.observation[None])
        mean = np.asarray(networks.actor_apply(params["actor"], features))[0]
        np.testing.assert_allclose(greedy[0], mean, rtol=1e-5, atol=1e-6)
        # The actor saw the learner's update count as a global-step bound.
        pulled = actor._client.params
        assert int(pulled[GLOBAL_AGENT_STEPS]) == 10 + (2 - 1) * 2
    finally:
        server.stop()


# --- the global agent step -------------------------------------------------------------------


def test_global_agent_steps_come_from_the_learners_update_count(environment_spec):
    config = _tiny_agent_config()
    config.num_expl_steps = 1_000
    config.stddev_schedule.duration = 1_000  # stddev 0.1 from step 1000 on
    schedule = DrQBuilder(config, frame_stack=STACK, action_repeat=ACTION_REPEAT).replay_schedule()
    assert schedule.actor_steps_after_updates(0) == 0  # no update yet: nothing known
    assert schedule.actor_steps_after_updates(1) == 10  # first update at min_replay_size
    assert schedule.actor_steps_after_updates(501) == 10 + 500 * 2
    networks = make_networks(environment_spec.actions, config)
    policy = networks.init(jax.random.PRNGKey(0), environment_spec.observations.generate_value())
    policy = {"encoder": policy["encoder"], "actor": policy["actor"]}

    core = make_actor_core(networks, config)
    select = jax.jit(core.select_action)
    observation = np.random.default_rng(0).integers(0, 256, (IMAGE, IMAGE, 9), dtype=np.uint8)
    features = networks.encoder_apply(policy["encoder"], observation[None])
    mean = np.asarray(networks.actor_apply(policy["actor"], features))[0]

    def distances(learner_steps: int) -> list[float]:
        bound = schedule.actor_steps_after_updates(learner_steps)
        params = {**policy, GLOBAL_AGENT_STEPS: np.int32(bound)}
        state = core.init(jax.random.PRNGKey(3))  # a fresh actor: its own count is 0
        out = []
        for _ in range(6):
            action, state = select(params, observation, state)
            out.append(float(np.abs(np.asarray(action) - mean).max()))
        return out

    # Before any update: this actor's own steps, i.e. the uniform random phase.
    assert max(distances(0)) > 0.3
    # After 600 updates at least 10 + 599 * 2 agent steps were taken by all actors: past the
    # random phase and at the end of the noise schedule, although this actor took none.
    assert max(distances(600)) < 0.5


# --- experiment, environment, video ----------------------------------------------------------


def _tiny_experiment_config():
    config = make_config("reacher_easy")
    config.env.image_size = IMAGE
    config.env.max_episode_frames = 20
    config.agent.update(_tiny_agent_config())
    config.evaluation.episodes = 2
    config.env.video.every_evaluations = 1
    return config


def test_experiment_pickles_and_builds_its_parts(tmp_path):
    config = _tiny_experiment_config()
    experiment = make_experiment(config, workdir=str(tmp_path))
    # Launchpad ships the experiment to every node: plain pickle must do (no lambdas).
    clone = pickle.loads(pickle.dumps(experiment))
    environment = clone.environment_factory(5, True)
    timestep = environment.reset()
    assert timestep.observation.shape == (IMAGE, IMAGE, 9)
    length = 0
    while not timestep.last():
        timestep = environment.step(np.zeros(2, np.float32))
        length += 1
    assert length == 10 and timestep.discount == 1.0  # 20 frames at action repeat 2
    spec = clone.get_environment_spec()
    assert clone.network_factory(spec).action_dim == 2
    assert clone.builder.replay_schedule().min_replay_size == 10
    (make_video,) = clone.evaluation_observers
    video = make_video()
    assert isinstance(video, EvaluationVideo)
    assert make_experiment(config).evaluation_observers == ()  # no workdir, no videos
    config.env.video.every_evaluations = 0
    assert make_experiment(config, workdir=str(tmp_path)).evaluation_observers == ()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("env.action_repeat", 0, "env.action_repeat must be an integer >= 1, got 0; e.g."),
        ("env.frame_stack", 0, "env.frame_stack must be an integer >= 1, got 0; e.g."),
        ("env.max_episode_frames", -1, "env.max_episode_frames must be an integer >= 0"),
        ("env.video.fps", 0.0, "env.video.fps must be a number > 0"),
        ("agent.stddev_schedule.duration", 0, "--config.agent.stddev_schedule.duration=500000"),
    ],
)
def test_the_config_check_refuses_bad_env_and_agent_keys(key, value, expected):
    # The one check (both entry points run it first); the builder and environment trust it.
    config = make_config("reacher_hard")
    *sections, name = key.split(".")
    target = config
    for section in sections:
        target = target[section]
    target[name] = value
    with pytest.raises(ConfigError, match=re.escape(expected)):
        validate_config(config)


def test_video_records_the_first_episode_of_every_nth_evaluation(tmp_path):
    from PIL import Image

    video = EvaluationVideo(
        tmp_path / "videos", episodes_per_evaluation=2, every_evaluations=2, scale=2
    )
    environment = _environment(seed=2, max_episode_frames=10)
    rng = np.random.default_rng(0)
    for _episode in range(8):  # 4 evaluations of 2 episodes: videos of evaluations 0, 2
        timestep = environment.reset()
        video.observe_first(timestep)
        while not timestep.last():
            action = rng.uniform(-1, 1, size=2).astype(np.float32)
            timestep = environment.step(action)
            video.observe(timestep, action)
        video.episode_done(1.5)
    names = sorted(path.name for path in video.written)
    assert len(names) == 2
    assert "evaluation0000_return2" in names[0] and "evaluation0002_return2" in names[1]
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == names  # no temp files
    with Image.open(video.written[0]) as gif:
        assert gif.size == (2 * IMAGE, 2 * IMAGE)
        # The first observation and 5 agent steps at 25 fps (Pillow merges identical
        # consecutive frames into one longer one, so count time, not frames).
        durations = []
        for frame in range(gif.n_frames):
            gif.seek(frame)
            durations.append(gif.info["duration"])
        assert sum(durations) == 6 * 40
    with pytest.raises(ValueError, match="every_evaluations"):
        EvaluationVideo(tmp_path, episodes_per_evaluation=1, every_evaluations=0)


# --- tasks and configs -------------------------------------------------------------------------


def test_task_table_is_the_papers():
    assert set(PAPER_TASKS.values()) == set(TASK_DIFFICULTY)
    assert len(paper_task_names("easy")) == 9
    assert len(paper_task_names("medium")) == 11
    assert len(paper_task_names("hard")) == 3
    with pytest.raises(ConfigError, match="reacher_hard"):
        make_config("reacher_hardd")


def _check_resources(config) -> None:
    assert set(config.resources) == {
        "replay",
        "counter",
        "learner",
        "actor",
        "evaluator",
        "coordinator",
    }
    for group, mapping in config.resources.items():
        assert tuple(sorted(mapping)) == tuple(sorted(ResourceSpec.field_names())), group
        ResourceSpec.from_config(group, mapping)


@pytest.mark.parametrize("name", list(PAPER_TASKS))
def test_every_task_config_loads_and_validates(name):
    domain, task = PAPER_TASKS[name]
    config = _load_config(ROOT / "configs" / f"{name}.py")
    validate_experiment_config(config)
    validate_config(config)
    _check_resources(config)
    assert (config.env.domain, config.env.task) == (domain, task)
    assert config.num_actors == 1
    frames = {"easy": 1_100_000, "medium": 3_100_000, "hard": 30_100_000}
    assert config.max_actor_steps == frames[TASK_DIFFICULTY[(domain, task)]] // 2
    assert config.evaluation.every_actor_steps == 5_000
    agent = config.agent
    if domain == "walker":
        assert (agent.n_step, agent.batch_size) == (1, 512)
    else:
        assert (agent.n_step, agent.batch_size) == (3, 256)
    if domain == "humanoid":
        assert agent.learning_rate == pytest.approx(8e-5) and agent.feature_dim == 100
    else:
        assert agent.learning_rate == pytest.approx(1e-4) and agent.feature_dim == 50
    expected_replay = 100_000 if name == "quadruped_run" else 1_000_000
    assert agent.replay_buffer_size == expected_replay
    assert config.env.camera_id == (2 if domain == "quadruped" else 0)
    distributed = _load_config(ROOT / "configs" / f"{name}.py", "distributed")
    assert (distributed.num_actors, distributed.envs_per_actor) == ("auto", "auto")


def test_distributed_reacher_config():
    config = _load_config(ROOT / "configs" / "reacher_hard_distributed.py")
    validate_experiment_config(config)
    _check_resources(config)
    assert config.num_actors == "auto" and config.num_evaluators == 1
    assert config.max_actor_steps == 1_550_000
    specs_ = {g: ResourceSpec.from_config(g, m) for g, m in config.resources.items()}
    assert specs_["learner"].device == "gpu_if_available"
    for group in ("replay", "counter", "actor", "evaluator", "coordinator"):
        assert specs_[group].device == "cpu", group
    assert specs_["actor"].render == "egl" and specs_["evaluator"].render == "egl"
    assert specs_["actor"].cpu_threads == 1
    single = _load_config(ROOT / "configs" / "reacher_hard.py")
    assert single.num_actors == 1 and single.agent == config.agent
    with pytest.raises(ConfigError, match="distributed"):
        _load_config(ROOT / "configs" / "reacher_hard.py", "distribute")
    # `make run` launches this config.
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CONFIG\s*\?=\s*configs/reacher_hard_distributed\.py$", makefile, re.M)
    assert re.search(r"^WORKDIR\s*\?=\s*runs/reacher_hard_distributed$", makefile, re.M)
    assert "projects/drq_v2/lp_main.py --config $(CONFIG) --workdir $(WORKDIR)" in makefile


def test_command_line_overrides_reach_every_resource_field():
    path = ROOT / "configs" / "reacher_hard_distributed.py"
    argv = [
        "prog",
        f"--config={path}",
        "--config.resources.learner.gpu_memory=0.5",
        "--config.resources.learner.gpus=[0, 1]",
        "--config.resources.learner.preallocate=False",
        "--config.resources.learner.allocator=platform",
        "--config.resources.actor.render_gpu=0",
        "--config.resources.actor.cpu_threads=2",
        "--config.resources.evaluator.gpu_memory=grow",
        "--config.resources.replay.env={'A': '1'}",
        "--config.env.max_episode_frames=100",
    ]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
    config = values.config
    learner = ResourceSpec.from_config("learner", config.resources.learner)
    assert learner.gpu_memory == 0.5 and learner.gpus == (0, 1)
    assert learner.preallocate is False and learner.allocator == "platform"
    actor = ResourceSpec.from_config("actor", config.resources.actor)
    assert actor.render_gpu == 0 and actor.cpu_threads == 2
    assert ResourceSpec.from_config("evaluator", config.resources.evaluator).gpu_memory == "grow"
    assert ResourceSpec.from_config("replay", config.resources.replay).env == {"A": "1"}
    assert config.env.max_episode_frames == 100
    with pytest.raises(ConfigError, match="not a ResourceSpec field"):
        resource_spec(gpu_memroy=0.5)
