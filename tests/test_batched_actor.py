"""The batched actor (`envs_per_actor`): k environments, one jitted action choice per step.

The frame-replay check extends tests/test_frame_replay.py to k streams: k pixel environments
with episodes of different lengths (so they end at different steps) feed k FrameStackAdders
through one `BatchedActor` into one Reverb table; every transition the replay gives back must
equal the one computed directly from that environment's recorded episode, each exactly once,
and no item may hold frames of two environments.
"""

from __future__ import annotations

import collections
import time

import dm_env
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reverb
from acme import specs
from acme.utils import counting

from magi_lp.agent.actor import BatchedActor
from magi_lp.agent.actor_core import ActorCore
from magi_lp.replay.frame_replay import FrameStackAdder, frame_replay_signature
from magi_lp.runtime.acting_loop import ActingLoop
from magi_lp.runtime.single_process import run_single_process
from tests.agent_harness import actor_node_stopping_after, n_step_transitions, queue_dataset
from tests.runtime_toys import toy_config, toy_experiment

H, W, C = 6, 6, 3
ACTION_SPEC = specs.BoundedArray((2,), np.float32, -1.0, 1.0, name="action")
GAMMA = 0.9
FRAME_STACK, N_STEP = 3, 2


class StackedPixels(dm_env.Environment):
    """Episodes of set lengths whose frames say where they are: channel 0 = environment,
    1 = episode, 2 = step. Observations are stacked as a frame-stacking wrapper gives them
    (oldest first, a new episode padded with its first frame); everything is recorded."""

    def __init__(self, environment: int, lengths: list[int], seed: int):
        self._environment = environment
        self._lengths = lengths
        self._rng = np.random.default_rng(seed)
        self._frames: collections.deque = collections.deque(maxlen=FRAME_STACK)
        self.episodes: list[dict] = []

    def _frame(self, step: int) -> np.ndarray:
        frame = np.empty((H, W, C), np.uint8)
        frame[..., 0] = self._environment
        frame[..., 1] = len(self.episodes) - 1
        frame[..., 2] = step
        return frame

    def _observation(self) -> np.ndarray:
        return np.concatenate(self._frames, axis=-1)

    def reset(self) -> dm_env.TimeStep:
        self.episodes.append({"observations": [], "actions": [], "rewards": [], "discounts": []})
        self._frames.extend([self._frame(0)] * FRAME_STACK)
        self.episodes[-1]["observations"].append(self._observation())
        return dm_env.restart(self._observation())

    def step(self, action) -> dm_env.TimeStep:
        episode = self.episodes[-1]
        step = len(episode["actions"]) + 1
        self._frames.append(self._frame(step))
        reward = np.float32(self._rng.uniform(0, 1))
        discount = np.float32(self._rng.choice([1.0, 0.5]))
        episode["observations"].append(self._observation())
        episode["actions"].append(np.array(action, np.float32))
        episode["rewards"].append(reward)
        episode["discounts"].append(discount)
        length = self._lengths[(len(self.episodes) - 1) % len(self._lengths)]
        if step >= length:
            return dm_env.truncation(reward, self._observation(), discount)
        return dm_env.transition(reward, self._observation(), discount)

    def observation_spec(self):
        return specs.Array((H, W, C * FRAME_STACK), np.uint8)

    def action_spec(self):
        return ACTION_SPEC


def _uniform_core() -> ActorCore:
    """Uniform actions from each environment's own key; counts its steps."""

    def init(key):
        return {"key": key, "steps": jnp.zeros((), jnp.int32)}

    def select_action(params, observation, state):
        del params, observation
        key, sub = jax.random.split(state["key"])
        action = jax.random.uniform(sub, (2,), jnp.float32, -1.0, 1.0)
        return action, {"key": key, "steps": state["steps"] + 1}

    return ActorCore(init=init, select_action=select_action)


def _reference(environment: int, episodes: list[dict]) -> dict:
    """(environment, episode, t) -> the n-step transition, DrQ-v2 style."""
    return {
        (environment, index, t): transition
        for index, episode in enumerate(episodes)
        for t, transition in n_step_transitions(episode, N_STEP, GAMMA).items()
    }


@pytest.fixture
def replay():
    signature = frame_replay_signature(
        (H, W, C), ACTION_SPEC, frame_stack=FRAME_STACK, n_step=N_STEP
    )
    server = reverb.Server([reverb.Table.queue("q", 10_000, signature=signature)])
    yield reverb.Client(f"localhost:{server.port}")
    server.stop()


def test_k_environments_write_k_streams_the_frame_replay_rebuilds_exactly(replay):
    lengths = [[5, 7], [3, 9, 4], [6]]  # episodes end at different steps in each environment
    environments = [StackedPixels(i, lengths[i], seed=i) for i in range(3)]
    adders = [
        FrameStackAdder(replay, "q", frame_stack=FRAME_STACK, n_step=N_STEP, chunk_length=4)
        for _ in environments
    ]
    actor = BatchedActor(
        _uniform_core(), list(jax.random.split(jax.random.PRNGKey(0), 3)), None, adders
    )
    counter = counting.Counter(time_delta=0.0)
    loop = ActingLoop(environments, actor, counter)
    rows = loop.run(num_episodes=6)
    loop.run(should_stop=lambda: sum(len(e.episodes) for e in environments) >= 10)
    for adder in adders:
        adder.close()

    # Counters count every environment's steps as they happen (episodes in progress at the
    # stop included) and the episodes that ended; rows say which environment each ran in.
    ended = [
        len(episode["actions"])
        for env, wanted in zip(environments, lengths, strict=True)
        for index, episode in enumerate(env.episodes)
        if len(episode["actions"]) == wanted[index % len(wanted)]
    ]
    taken = sum(len(episode["actions"]) for env in environments for episode in env.episodes)
    assert len(ended) >= 6 and taken > sum(ended)  # (and episodes in progress at the stop)
    assert counter.get_counts()["episodes"] == len(ended)
    assert counter.get_counts()["steps"] == taken
    assert {row["environment"] for row in rows} == {0, 1, 2}
    # Each environment has its own actor state: its own key and its own step count.
    steps = np.asarray(actor.state["steps"])
    assert steps.shape == (3,) and len(set(steps.tolist())) == 1
    actions = [env.episodes[0]["actions"][0] for env in environments]
    assert not np.array_equal(actions[0], actions[1])

    reference = {}
    for index, environment in enumerate(environments):
        reference.update(_reference(index, environment.episodes))
    assert replay.server_info()["q"].current_size == len(reference)
    dataset = queue_dataset(
        replay.server_address, "q", frame_stack=FRAME_STACK, n_step=N_STEP, discount=GAMMA
    )
    seen = []
    for batch in dataset:
        obs, next_obs = batch.observation[0], batch.next_observation[0]
        # Every frame of the item comes from one environment.
        assert len({int(v) for v in np.concatenate([obs, next_obs], -1)[0, 0, 0::C]}) == 1
        key = (int(obs[0, 0, -3]), int(obs[0, 0, -2]), int(obs[0, 0, -1]))
        assert key in reference, f"sampled transition {key} is not one that happened"
        ref_obs, ref_action, ref_reward, ref_discount, ref_next = reference[key]
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(next_obs, ref_next)
        np.testing.assert_array_equal(batch.action[0], ref_action)
        np.testing.assert_allclose(batch.reward[0], ref_reward, rtol=1e-5)
        np.testing.assert_allclose(batch.discount[0], ref_discount, rtol=1e-5)
        seen.append(key)
    assert sorted(seen) == sorted(reference)  # each transition exactly once


def test_steps_are_counted_as_they_happen_or_in_batches_of_count_every():
    environments = [StackedPixels(0, [7], seed=0), StackedPixels(1, [9], seed=1)]
    actor = BatchedActor(
        _uniform_core(), list(jax.random.split(jax.random.PRNGKey(0), 2)), None, [None] * 2
    )
    counter = counting.Counter(time_delta=0.0)
    increments = []
    increment = counter.increment
    counter.increment = lambda **counts: increments.append(counts) or increment(**counts)
    loop = ActingLoop(environments, actor, counter, count_every=3)
    for taken in range(1, 8):
        loop.step()
        # 2 environment steps per loop step; reported every 3 loop steps and when the first
        # environment's 7-step episode ends (loop step 7).
        reported = 2 * taken if taken in (3, 6, 7) else 2 * (taken // 3) * 3
        assert counter.get_counts().get("steps", 0) == reported, taken
    assert [c["steps"] for c in increments] == [6, 6, 2]
    assert [c["episodes"] for c in increments] == [0, 0, 1]
    assert loop.counts["steps"] == 14 and loop.counts["episodes"] == 1
    loop.step()
    assert loop.flush_counts()["steps"] == 16  # a stop reports what is left
    with pytest.raises(ValueError, match="count_every must be >= 1"):
        ActingLoop(environments, actor, counter, count_every=0)


def test_a_distributed_actor_reports_its_last_steps_at_a_stop():
    """Reported every `count_every` steps, the steps since the last report were never
    counted at a stop: the learner's final checkpoint lacked them and a relaunch took them
    again (up to DISTRIBUTED_COUNT_EVERY per environment and actor)."""
    environments = [StackedPixels(0, [7], seed=0), StackedPixels(1, [9], seed=1)]
    actor = BatchedActor(
        _uniform_core(), list(jax.random.split(jax.random.PRNGKey(0), 2)), None, [None] * 2
    )
    counter = counting.Counter(time_delta=0.0)
    loop = ActingLoop(environments, actor, counter, count_every=20)
    node, taken = actor_node_stopping_after(loop, 5)  # the program stops after 5 loop steps
    node.run()
    assert taken[0] == 5
    assert counter.get_counts()["steps"] == 2 * 5  # two environments a loop step


def test_each_episode_row_says_where_a_loop_step_s_time_went():
    # Each environment step sleeps 3 ms and each observer 2 ms: per environment step that is
    # at least 3 ms in `env` and 2 ms in `observe` (lower bounds only: a busy machine only
    # adds to them), and the parts add up to no more than the episode's wall time.
    class Slow(StackedPixels):
        def step(self, action):
            time.sleep(0.003)
            return super().step(action)

    class Observer:
        def observe_first(self, timestep):
            pass

        def observe(self, timestep, action):
            time.sleep(0.002)

        def episode_done(self, episode_return):
            pass

    environments = [Slow(0, [5], seed=0), Slow(1, [5], seed=1)]
    actor = BatchedActor(
        _uniform_core(), list(jax.random.split(jax.random.PRNGKey(0), 2)), None, [None] * 2
    )
    loop = ActingLoop(environments, actor, None, observers=[Observer()], should_update=False)
    rows = loop.run(num_episodes=2)
    assert len(rows) == 2
    for row in rows:
        assert row["env_ms"] >= 3.0 and row["observe_ms"] >= 2.0, row
        assert row["policy_ms"] > 0.0 and row["params_ms"] == 0.0, row
        parts = sum(row[f"{part}_ms"] for part in ("policy", "env", "observe", "params"))
        # The episode's wall time per environment step of the loop (2 environments' steps).
        assert parts <= 1.01 * 1000.0 / (2 * row["steps_per_second"]), row


def test_an_evaluations_rows_carry_its_point_and_each_episodes_place_in_it():
    environments = [StackedPixels(0, [3], seed=0)]
    actor = BatchedActor(_uniform_core(), [jax.random.PRNGKey(0)], None, [None])
    loop = ActingLoop(environments, actor, None, should_update=False)
    assert "evaluation_at" not in loop.run(num_episodes=1)[0]  # not an evaluation's
    loop.start_evaluation(100)
    first = loop.run(num_episodes=2)
    loop.start_evaluation(100)  # again at one point (a relaunch after a cut): counts from 1
    again = loop.run(num_episodes=1)
    assert [(r["evaluation_at"], r["evaluation_episode"]) for r in first + again] == [
        (100, 1),
        (100, 2),
        (100, 1),
    ]


def test_one_call_chooses_all_k_actions():
    calls = []
    core = _uniform_core()

    def select_action(params, observation, state):
        calls.append(observation.shape)  # runs at trace time only: once per compilation
        return core.select_action(params, observation, state)

    batched = ActorCore(init=core.init, select_action=select_action)
    actor = BatchedActor(
        batched, list(jax.random.split(jax.random.PRNGKey(1), 4)), None, [None] * 4
    )
    observations = [np.zeros((2,), np.float32)] * 4
    first = actor.select_actions(observations)
    second = actor.select_actions(observations)
    assert first.shape == (4, 2) and not np.array_equal(first, second)
    assert calls == [(2,)]  # traced once, per environment, under vmap


@pytest.mark.integration  # a single-process run on a real Reverb server, ~8 s
def test_single_process_run_with_several_environments_per_actor(tmp_path):
    config = toy_config(max_actor_steps=60)
    config.envs_per_actor = 3
    config.num_evaluators = 0
    config.debug.check_devices = True
    seeds = []
    experiment = toy_experiment(config)
    factory = experiment.environment_factory

    def recording_factory(seed, evaluation):
        seeds.append(seed)
        return factory(seed, evaluation)

    experiment.environment_factory = recording_factory
    result = run_single_process(
        experiment, workdir=str(tmp_path), logger_factory=_no_logs, progress=False
    )
    # 3 environments x 10-step episodes: the run stops after the first 60 counted steps.
    assert result.actor_steps == 60 and result.episodes == 6
    # Exactly what the replay schedule owes after 60 actor steps (all 3 writers counted).
    assert result.learner_steps == experiment.builder.replay_schedule().updates_due(60)
    assert len(set(seeds[1:])) == 3  # seeds[0]: the spec's throwaway environment


def _no_logs(label, steps_key=None, instance=None, *, time_delta=None):
    del label, steps_key, instance, time_delta
    from acme.utils import loggers

    return loggers.NoOpLogger()
