"""The host n-step transition replay (magi_lp/replay/transition_replay.py): what a state agent
learns from in one process without Reverb.

Runs on both stacks. Where Reverb is installed, the transitions are compared with those Acme's
own `NStepTransitionAdder` writes into a real Reverb table from the same episodes.
"""

from __future__ import annotations

import importlib.util

import dm_env
import numpy as np
import pytest

from magi_lp.acme_api import specs, types
from magi_lp.replay.spec import TransitionReplaySpec
from magi_lp.replay.transition_replay import TransitionAdder, TransitionReplay

OBS = specs.Array((3,), np.float32, "observation")
ENV_SPEC = specs.EnvironmentSpec(
    observations=OBS,
    actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0, "action"),
    rewards=specs.Array((), np.float32, "reward"),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"),
)
GAMMA = 0.9


def _episodes(rng: np.random.Generator, lengths: list[int], terminal: list[bool]):
    """Episodes as (first timestep, [(action, next timestep)]) with distinct observations."""
    episodes = []
    for length, ends in zip(lengths, terminal, strict=True):
        first = dm_env.restart(rng.normal(size=3).astype(np.float32))
        steps = []
        for t in range(length):
            action = rng.uniform(-1, 1, size=2).astype(np.float32)
            observation = rng.normal(size=3).astype(np.float32)
            reward = np.float32(rng.normal())
            if t == length - 1:
                step = (
                    dm_env.termination(reward, observation)
                    if ends
                    else dm_env.truncation(reward, observation)
                )
            else:
                step = dm_env.transition(reward, observation)
            steps.append((action, step._replace(discount=np.float32(step.discount))))
        episodes.append((first, steps))
    return episodes


def _feed(adder, episodes) -> None:
    for first, steps in episodes:
        adder.add_first(first)
        for action, step in steps:
            adder.add(action, step)


def _expected(episodes, n: int) -> list[types.Transition]:
    """The n-step transitions, each (s_t, a_t) once, computed from the definition."""
    out = []
    for first, steps in episodes:
        observations = [first.observation] + [step.observation for _, step in steps]
        for t in range(len(steps)):
            window = steps[t : t + n]
            reward, discount = 0.0, 1.0
            for k, (_, step) in enumerate(window):
                reward += GAMMA**k * discount * float(step.reward)
                discount *= float(step.discount)
            discount *= GAMMA ** (len(window) - 1)
            out.append(
                types.Transition(
                    observations[t],
                    steps[t][0],
                    np.float32(reward),
                    np.float32(discount),
                    observations[t + len(window)],
                    (),
                )
            )
    return out


def _rows(replay: TransitionReplay) -> list[types.Transition]:
    data = replay.save()["data"]
    return [
        types.Transition(**{k: (v[i] if k != "extras" else ()) for k, v in data.items()})
        for i in range(replay.size)
    ]


def _key(t: types.Transition) -> tuple:
    return tuple(
        np.round(np.asarray(x, np.float64), 5).tobytes()
        for x in (t.observation, t.action, t.reward, t.discount, t.next_observation)
    )


@pytest.mark.parametrize("n", [1, 3])
def test_adder_writes_each_step_once_with_acme_n_step_arithmetic(n):
    rng = np.random.default_rng(n)
    # Episodes shorter and longer than n; a termination (discount 0) and a truncation.
    episodes = _episodes(rng, [2, 7, 5], [True, False, True])
    replay = TransitionReplay(TransitionReplaySpec(100, 4, n, GAMMA), ENV_SPEC)
    _feed(TransitionAdder(replay, n, GAMMA), episodes)
    expected = _expected(episodes, n)
    assert replay.size == len(expected) == 14
    for got, want in zip(_rows(replay), expected, strict=True):
        for field in ("observation", "action", "reward", "discount", "next_observation"):
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), rtol=1e-5)
    # A terminal step's transitions never bootstrap; a truncated episode's do.
    assert _rows(replay)[1].discount == 0.0
    assert _rows(replay)[8].discount > 0.0


def test_fifo_capacity_uniform_sampling_and_restore():
    rng = np.random.default_rng(0)
    spec = TransitionReplaySpec(capacity=8, batch_size=4000, n_step=1, discount=GAMMA)
    replay = TransitionReplay(spec, ENV_SPEC, seed=1)
    adder = TransitionAdder(replay, 1, GAMMA)
    episodes = _episodes(rng, [12], [False])
    _feed(adder, episodes)
    assert (replay.size, replay.inserted) == (8, 12)
    # The 8 newest transitions are kept.
    kept = {_key(t) for t in _rows(replay)}
    assert kept == {_key(t) for t in _expected(episodes, 1)[4:]}
    batch = replay.sample()
    assert batch.observation.shape == (4000, 3) and batch.reward.shape == (4000,)
    rows = {tuple(o): i for i, o in enumerate(replay.save()["data"]["observation"].tolist())}
    counts = np.bincount([rows[tuple(o)] for o in batch.observation.tolist()], minlength=8)
    assert counts.min() > 4000 / 8 * 0.8, counts  # every row drawn, about equally

    restored = TransitionReplay(spec, ENV_SPEC, seed=1)
    restored.restore(replay.save())
    assert (restored.size, restored.inserted, restored.sampled_batches) == (8, 12, 1)
    assert {_key(t) for t in _rows(restored)} == kept


def test_adder_refuses_steps_outside_an_episode():
    replay = TransitionReplay(TransitionReplaySpec(8, 2, 1, GAMMA), ENV_SPEC)
    adder = TransitionAdder(replay, 1, GAMMA)
    step = dm_env.transition(np.float32(0), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="add before add_first"):
        adder.add(np.zeros(2, np.float32), step)
    with pytest.raises(ValueError, match="first step"):
        adder.add_first(step)


@pytest.mark.integration  # a real Reverb server
@pytest.mark.skipif(importlib.util.find_spec("reverb") is None, reason="Reverb not installed")
def test_same_transitions_as_acme_n_step_adder_on_reverb():
    """Acme's adder writes the same transitions, plus its extra (s_0 -> s_k), k < n."""
    n = 3
    rng = np.random.default_rng(7)
    episodes = _episodes(rng, [2, 6, 4], [True, False, True])
    acme_rows = acme_n_step_transitions(episodes, n)
    replay = TransitionReplay(TransitionReplaySpec(100, 4, n, GAMMA), ENV_SPEC)
    _feed(TransitionAdder(replay, n, GAMMA), episodes)
    ours = {_key(t) for t in _rows(replay)}
    theirs = {_key(t) for t in acme_rows}
    assert ours <= theirs
    # What Acme adds besides: one shorter transition from s_0 per k < n where k < length.
    extra = theirs - ours
    assert len(extra) == sum(min(n - 1, len(steps) - 1) for _, steps in episodes)
    starts = {np.round(first.observation.astype(np.float64), 5).tobytes() for first, _ in episodes}
    assert all(key[0] in starts for key in extra)


def acme_n_step_transitions(episodes, n: int) -> list[types.Transition]:
    """The transitions Acme's own `NStepTransitionAdder` writes from `episodes` into a real
    Reverb table (each item read once, oldest first): the reference the toolkit's n-step
    replays are checked against (here, and test_served_replay's served table)."""
    import reverb
    from acme.adders import reverb as adders_reverb

    table = reverb.Table(
        "t",
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        1000,
        reverb.rate_limiters.MinSize(1),
        max_times_sampled=1,  # each item read once, oldest first
        signature=adders_reverb.NStepTransitionAdder.signature(ENV_SPEC),
    )
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        adder = adders_reverb.NStepTransitionAdder(client, n, GAMMA, priority_fns={"t": None})
        _feed(adder, episodes)
        adder.reset()  # flushes what it still holds
        size = client.server_info()["t"].current_size
        dataset = reverb.TrajectoryDataset.from_table_signature(
            f"localhost:{server.port}", "t", max_in_flight_samples_per_worker=1
        )
        return [
            types.Transition(*(np.asarray(x) for x in sample.data[:5]), ())
            for sample in dataset.take(size).as_numpy_iterator()
        ]
    finally:
        server.stop()
