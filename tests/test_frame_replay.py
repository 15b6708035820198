"""Samples from the frame-efficient replay equal transitions computed directly from episodes.

Tiny episodes with distinctive 8x8x3 frames (channel 0 = episode, channel 1 = step,
channel 2 = pixel position) go through a frame-stacking wrapper's logic into
`FrameStackAdder` and a real Reverb server; every sample must equal the reference
computed in numpy from the recorded stacked observations: stacks (with start padding),
action, n-step discounted reward and gamma^n * prod(discounts).
"""

from __future__ import annotations

import collections
import time

import dm_env
import numpy as np
import portpicker
import pytest
import reverb
from acme import specs

from magi_lp.errors import ConfigError
from magi_lp.replay.frame_replay import (
    FrameStackAdder,
    default_chunk_length,
    frame_replay_signature,
    make_frame_replay_dataset,
    make_frame_replay_table,
)
from magi_lp.replay.frame_window import frame_shape_from_observation, window_observations
from tests.agent_harness import n_step_transitions, queue_dataset

H, W, C = 8, 8, 3
ACTION_SPEC = specs.BoundedArray((2,), np.float32, -1.0, 1.0, name="action")
GAMMA = 0.9


def render(episode: int, step: int) -> np.ndarray:
    frame = np.empty((H, W, C), np.uint8)
    frame[..., 0] = episode
    frame[..., 1] = step
    frame[..., 2] = np.arange(H * W, dtype=np.uint8).reshape(H, W)
    return frame


def record_episode(episode: int, length: int, frame_stack: int, rng, terminal: bool):
    """Stacked observations as a frame-stacking wrapper gives them, plus step data."""
    frames = collections.deque([render(episode, 0)] * frame_stack, maxlen=frame_stack)
    observations = [np.concatenate(frames, axis=-1)]
    actions, rewards, discounts = [], [], []
    for step in range(1, length + 1):
        frames.append(render(episode, step))
        observations.append(np.concatenate(frames, axis=-1))
        actions.append(rng.uniform(-1, 1, size=2).astype(np.float32))
        rewards.append(np.float32(rng.uniform(0, 1)))
        discounts.append(np.float32(rng.choice([1.0, 0.5])))
    if terminal:
        discounts[-1] = np.float32(0.0)
    return dict(
        episode=episode,
        observations=observations,
        actions=actions,
        rewards=rewards,
        discounts=discounts,
    )


def feed(adder: FrameStackAdder, episode: dict) -> None:
    observations = episode["observations"]
    adder.add_first(dm_env.restart(observations[0]))
    for t, action in enumerate(episode["actions"]):
        last = t == len(episode["actions"]) - 1
        timestep = dm_env.TimeStep(
            step_type=dm_env.StepType.LAST if last else dm_env.StepType.MID,
            reward=episode["rewards"][t],
            discount=episode["discounts"][t],
            observation=observations[t + 1],
        )
        adder.add(action, timestep)


def write_all(client, table: str, episodes: list[dict], **adder_kwargs) -> None:
    """Writes `episodes` through one `FrameStackAdder` and closes it (flushing its items)."""
    adder = FrameStackAdder(client, table, **adder_kwargs)
    for episode in episodes:
        feed(adder, episode)
    adder.close()


def reference_transitions(episodes: list[dict], n_step: int) -> dict:
    """(episode, t) -> the n-step transition, computed directly from the episodes."""
    return {
        (episode["episode"], t): transition
        for episode in episodes
        for t, transition in n_step_transitions(episode, n_step, GAMMA).items()
    }


def identify(observation: np.ndarray) -> tuple[int, int]:
    """Episode and step of a stacked observation, read from its newest frame."""
    return int(observation[0, 0, -3]), int(observation[0, 0, -2])


def check_sample(reference: dict, obs, action, reward, discount, next_obs) -> tuple:
    key = identify(obs)
    assert key in reference, f"sampled transition {key} is not a valid transition"
    ref_obs, ref_action, ref_reward, ref_discount, ref_next = reference[key]
    np.testing.assert_array_equal(obs, ref_obs)
    np.testing.assert_array_equal(next_obs, ref_next)
    np.testing.assert_array_equal(action, ref_action)
    np.testing.assert_allclose(reward, ref_reward, rtol=1e-5)
    np.testing.assert_allclose(discount, ref_discount, rtol=1e-5)
    return key


# Episode lengths: ordinary ones, one exactly n_step long (a single transition), and ones
# shorter than n_step (no transition at all).
def make_episodes(frame_stack: int, n_step: int) -> list[dict]:
    rng = np.random.default_rng(0)
    lengths = [9, n_step, max(n_step - 1, 0), 6, 1]
    episodes = []
    for index, length in enumerate(lengths):
        if length == 0:
            continue
        episodes.append(record_episode(index, length, frame_stack, rng, terminal=index == 3))
    return episodes


@pytest.fixture
def server_factory():
    servers = []

    def make(tables):
        server = reverb.Server(tables)
        servers.append(server)
        return reverb.Client(f"localhost:{server.port}")

    yield make
    for server in servers:
        server.stop()


def observations(batch, n_step: int, stack_on_host: bool) -> tuple:
    """The stacked observations of a batch, stacked here (numpy) when the replay did not."""
    if stack_on_host:
        return batch.observation, batch.next_observation
    return window_observations(batch.frames, n_step)


@pytest.mark.parametrize("stack_on_host", [True, False], ids=["host_stacks", "window"])
@pytest.mark.parametrize("frame_stack,n_step", [(3, 3), (2, 1), (1, 4)])
def test_queue_samples_each_transition_once_and_equal_reference(
    server_factory, frame_stack, n_step, stack_on_host
):
    episodes = make_episodes(frame_stack, n_step)
    reference = reference_transitions(episodes, n_step)
    signature = frame_replay_signature(
        (H, W, C), ACTION_SPEC, frame_stack=frame_stack, n_step=n_step
    )
    client = server_factory([reverb.Table.queue("q", 1000, signature=signature)])
    write_all(client, "q", episodes, frame_stack=frame_stack, n_step=n_step, chunk_length=4)

    assert client.server_info()["q"].current_size == len(reference)
    dataset = queue_dataset(
        client.server_address,
        "q",
        frame_stack=frame_stack,
        n_step=n_step,
        discount=GAMMA,
        stack_on_host=stack_on_host,
    )
    seen = []
    for batch in dataset:
        if not stack_on_host:  # only the unique frames of the item travel
            assert batch.frames.shape == (1, frame_stack + n_step, H, W, C)
            assert batch.frames.dtype == np.uint8
        observation, next_observation = observations(batch, n_step, stack_on_host)
        assert observation.shape == (1, H, W, C * frame_stack)
        assert observation.dtype == np.uint8
        assert batch.reward.shape == batch.discount.shape == (1,)
        seen.append(
            check_sample(
                reference,
                observation[0],
                batch.action[0],
                batch.reward[0],
                batch.discount[0],
                next_observation[0],
            )
        )
    assert sorted(seen) == sorted(reference)
    # Starts and ends are among them: the padded first stack and the final observation.
    assert (0, 0) in seen and (0, 9 - n_step) in seen


@pytest.mark.parametrize("stack_on_host", [True, False], ids=["host_stacks", "window"])
def test_uniform_table_batches_equal_reference(server_factory, stack_on_host):
    frame_stack, n_step = 3, 3
    episodes = make_episodes(frame_stack, n_step)
    reference = reference_transitions(episodes, n_step)
    table = make_frame_replay_table(
        "replay",
        10_000,
        frame_shape=(H, W, C),
        action_spec=ACTION_SPEC,
        frame_stack=frame_stack,
        n_step=n_step,
    )
    client = server_factory([table])
    write_all(client, "replay", episodes, frame_stack=frame_stack, n_step=n_step)
    assert client.server_info()["replay"].current_size == len(reference)

    dataset = make_frame_replay_dataset(
        client.server_address,
        "replay",
        batch_size=16,
        frame_stack=frame_stack,
        n_step=n_step,
        discount=GAMMA,
        stack_on_host=stack_on_host,
    )
    seen = set()
    for _ in range(30):
        batch = next(dataset)
        assert batch.action.dtype == np.float32
        assert batch.reward.dtype == batch.discount.dtype == np.float32
        observation, next_observation = observations(batch, n_step, stack_on_host)
        for i in range(16):
            seen.add(
                check_sample(
                    reference,
                    observation[i],
                    batch.action[i],
                    batch.reward[i],
                    batch.discount[i],
                    next_observation[i],
                )
            )
    assert seen == set(reference)


def test_extras_are_stored_with_the_action(server_factory):
    extras_spec = {"log_prob": specs.Array((), np.float32)}
    signature = frame_replay_signature(
        (H, W, C), ACTION_SPEC, frame_stack=2, n_step=2, extras_spec=extras_spec
    )
    client = server_factory([reverb.Table.queue("q", 100, signature=signature)])
    adder = FrameStackAdder(client, "q", frame_stack=2, n_step=2)
    episode = record_episode(0, 4, 2, np.random.default_rng(1), terminal=False)
    adder.add_first(dm_env.restart(episode["observations"][0]))
    for t, action in enumerate(episode["actions"]):
        step = dm_env.transition if t < 3 else dm_env.termination
        timestep = step(episode["rewards"][t], episode["observations"][t + 1])
        adder.add(action, timestep, extras={"log_prob": np.float32(t)})
    adder.close()
    dataset = queue_dataset(client.server_address, "q", frame_stack=2, n_step=2, discount=GAMMA)
    pairs = sorted((identify(b.observation[0])[1], float(b.extras["log_prob"][0])) for b in dataset)
    assert pairs == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_adder_refuses_observations_stacked_differently(server_factory):
    signature = frame_replay_signature((H, W, C), ACTION_SPEC, frame_stack=3, n_step=1)
    client = server_factory([reverb.Table.queue("q", 100, signature=signature)])
    adder = FrameStackAdder(client, "q", frame_stack=3, n_step=1)
    zero_padded = np.concatenate([np.zeros((H, W, 2 * C), np.uint8), render(0, 0)], -1)
    with pytest.raises(ValueError, match="repeat its first frame"):
        adder.add_first(dm_env.restart(zero_padded))
    newest_first = np.concatenate([render(0, 0)] * 3, -1)
    adder.add_first(dm_env.restart(newest_first))
    wrong_order = np.concatenate([render(0, 1), render(0, 0), render(0, 0)], -1)
    with pytest.raises(ValueError, match="shifted by one frame"):
        adder.add(np.zeros(2, np.float32), dm_env.transition(0.0, wrong_order))
    with pytest.raises(ValueError, match=r"\[H, W, 9\]"):
        adder.add(np.zeros(2, np.float32), dm_env.transition(0.0, render(0, 1)))


def test_config_mistakes_are_config_errors():
    with pytest.raises(ConfigError, match="frame_stack"):
        frame_replay_signature((H, W, C), ACTION_SPEC, frame_stack=0, n_step=1)
    with pytest.raises(ConfigError, match="frame_stack"):
        frame_shape_from_observation((84, 84, 9), 2)
    assert frame_shape_from_observation((84, 84, 9), 3) == (84, 84, 3)


def test_default_chunk_length_spans_two_snappy_blocks():
    assert default_chunk_length(84 * 84 * 3) == 6
    assert default_chunk_length(8 * 8 * 3) == 32
    assert default_chunk_length(256 * 256 * 3) == 1


def test_dataset_checks_arguments_at_once_but_connects_on_the_first_batch():
    with pytest.raises(ConfigError, match="discount"):
        make_frame_replay_dataset(
            "localhost:1", "q", batch_size=4, frame_stack=3, n_step=3, discount=1.5
        )
    # No server listens there yet: building the iterator must not connect (nor wait) ...
    port = portpicker.pick_unused_port()
    start = time.monotonic()
    dataset = make_frame_replay_dataset(
        f"localhost:{port}",
        "q",
        batch_size=2,
        frame_stack=3,
        n_step=1,
        discount=GAMMA,
        num_parallel_calls=1,
    )
    assert time.monotonic() - start < 30
    # ... and the first batch comes from the server that starts there afterwards.
    signature = frame_replay_signature((H, W, C), ACTION_SPEC, frame_stack=3, n_step=1)
    server = reverb.Server([reverb.Table.queue("q", 100, signature=signature)], port=port)
    try:
        client = reverb.Client(f"localhost:{port}")
        write_all(client, "q", make_episodes(3, 1)[:1], frame_stack=3, n_step=1, chunk_length=4)
        batch = next(iter(dataset))
        assert batch.reward.shape == batch.discount.shape == (2,)
        assert batch.action.shape == (2, *ACTION_SPEC.shape)
    finally:
        server.stop()


@pytest.mark.parametrize("eager_items", [0, 4])
def test_eager_items_reach_the_table_before_their_chunk_fills(server_factory, eager_items):
    table = make_frame_replay_table(
        "replay", 100, frame_shape=(H, W, C), action_spec=ACTION_SPEC, frame_stack=3, n_step=1
    )
    client = server_factory([table])
    adder = FrameStackAdder(
        client, "replay", frame_stack=3, n_step=1, chunk_length=32, eager_items=eager_items
    )
    episode = record_episode(0, 9, 3, np.random.default_rng(2), terminal=False)
    adder.add_first(dm_env.restart(episode["observations"][0]))
    for t in range(6):  # 6 items, none of whose 32-step chunks is full
        timestep = dm_env.transition(episode["rewards"][t], episode["observations"][t + 1])
        adder.add(episode["actions"][t], timestep)
    # Eager: the first 4 are in the table already; otherwise they wait for the chunk.
    assert client.server_info()["replay"].current_size == eager_items
    adder.close()
    assert client.server_info()["replay"].current_size == 6
    with pytest.raises(ConfigError, match="eager_items"):
        FrameStackAdder(client, "replay", frame_stack=3, n_step=1, eager_items=-1)
