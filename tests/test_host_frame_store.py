"""Store 'host' (magi_lp/replay/stores/host_frames.py) as the runners use it: through the
served step queue to the reference transitions (and, where Reverb is installed, the official
sampler's, bit for bit), its learner side checkpointed and restored as the learner runner
does it (`restore_target`: the saved shapes as they are), and in one process.

The store's own checks (the same transitions as the device store, eviction, sampling, the
arena) are in tests/test_frame_store.py, which runs them on both frame stores."""

from __future__ import annotations

import importlib.util

import ml_collections
import numpy as np
import pytest

from magi_lp.replay.compressed_frames import CompressedFrameStore, HostReplayIterator
from magi_lp.replay.frame_store import StoreAdder
from magi_lp.replay.schedule import ReplaySchedule
from magi_lp.replay.stores import resolve_store
from magi_lp.replay.stores.host_frames import HostFramesLearnerReplay, HostFrameStore
from magi_lp.runtime.checkpointing import Checkpointer
from tests.test_frame_store import as_keys, episodes, feed, make_spec, reference
from tests.test_served_replay import FRAME_DATA, Remote, settle

SCHEDULE = ReplaySchedule(min_replay_size=10, actor_steps_per_update=2, batch_size=4)


class Builder:
    """A pixel agent's answers to what the host store asks its builder."""

    def __init__(self, capacity: int = 500):
        self.spec = make_spec(capacity=capacity)

    def frame_replay(self, environment_spec):
        return self.spec

    def transition_replay(self, environment_spec):
        return None

    def replay_schedule(self):
        return SCHEDULE


def config(actors: int = 2) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "num_actors": actors,
            "envs_per_actor": 1,
            "seed": 0,
            "replay": {"store": "host", "queue_steps": 8},
        }
    )


def keys(transitions) -> list[bytes]:
    return as_keys(transitions.frames, transitions.action, transitions.reward, transitions.discount)


@pytest.fixture
def served():
    """The host store on the 'served' transport: the replay node's queue, the learner's
    side through a pickling handle (its drain started), closed at the end."""
    store = resolve_store(Builder(), config(), transport="served")
    assert type(store) is HostFrameStore
    queue = store.make_server(None)
    replay = store.make_learner_replay(None, Remote(queue), None)
    replay.start()
    yield store, queue, replay
    replay.close()
    queue.close()


def _through_the_queue(served) -> list[bytes]:
    store, queue, replay = served
    adders = [store.make_adder(None, Remote(queue), w) for w in range(2)]
    feed(adders, FRAME_DATA)  # the writes wait for the drain on the way
    for adder in adders:
        adder.close()
    steps = sum(len(ep) for eps in FRAME_DATA for ep in eps)
    assert settle(lambda: replay.drainer.steps, steps, quiet=0.5) == steps
    assert queue.info()["inserted"] == steps  # each step one item: a frame crosses once
    return keys(replay.store.transitions_at())


def test_the_served_queue_carries_each_step_once_to_the_reference_transitions(served):
    held = _through_the_queue(served)
    assert sorted(held) == sorted(keys_of_reference(FRAME_DATA))
    _, _, replay = served
    batch = next(replay.iterator)  # the ratio lets the learner sample: it holds > min size
    assert set(keys(batch)) <= set(held)
    assert replay.info()["replay_frame_bytes"] > 0


def keys_of_reference(data) -> list[bytes]:
    return as_keys(*zip(*reference(data), strict=True))


@pytest.mark.integration  # a real Reverb server
@pytest.mark.skipif(importlib.util.find_spec("reverb") is None, reason="Reverb not installed")
def test_the_served_host_store_gives_the_official_samplers_transitions_bit_for_bit(served):
    from tests.test_served_replay import _reverb_frame_replay

    held = _through_the_queue(served)
    official = _reverb_frame_replay(FRAME_DATA)
    assert len(official) == len(held) == len(reference(FRAME_DATA))
    assert sorted(official) == sorted(held)


def test_the_learner_side_checkpoints_and_resumes_as_the_learner_runner_does(tmp_path):
    """Saved beside a learner checkpoint and restored into a fresh learner side with its
    `restore_target` (`LearnerRunner`: None, the saved shapes, the arena's bytes in use):
    the same transitions, the ratio's counts back, and writing goes on."""
    store = HostFrameStore(Builder(capacity=40), config(), single_process=True)
    replay = store.make_learner_replay(None, None, None)
    adders = [store.make_adder(None, replay, w) for w in range(2)]
    assert all(type(adder) is StoreAdder for adder in adders)
    feed(adders, [episodes(7, [25, 9]), episodes(8, [22])])
    next(replay.iterator)
    before = keys(replay.store.transitions_at())
    with replay.holding_writes():
        Checkpointer(tmp_path).save(1, replay.save())

    fresh = store.make_learner_replay(None, None, None)
    assert fresh.restore_target() is None
    saved, _ = Checkpointer(tmp_path).restore(fresh.restore_target())
    assert len(saved["arena"]) == replay.store.save()["arena"].nbytes
    fresh.restore(saved)
    assert keys(fresh.store.transitions_at()) == before
    assert fresh.info()["replay_inserted"] == replay.info()["replay_inserted"]
    assert fresh.info()["replay_sampled"] == replay.info()["replay_sampled"] == 8
    # Writing on, the resumed store holds what the store that never stopped holds.
    more = [episodes(9, [30]), episodes(10, [30])]
    for side in (replay, fresh):
        feed([store.make_adder(None, side, w) for w in range(2)], more)
    after = keys(fresh.store.transitions_at())
    assert after == keys(replay.store.transitions_at())
    assert set(keys_of_reference(more)[-20:]) <= set(after) and not set(before) <= set(after)


def test_one_process_samples_off_the_learners_thread_through_its_prefetcher():
    """Not `on_device`: `JaxLearner` wraps the iterator in its prefetch thread."""
    store = HostFrameStore(Builder(), config(), single_process=True)
    replay = store.make_learner_replay(None, None, None)
    assert type(replay) is HostFramesLearnerReplay
    assert not getattr(replay.iterator, "on_device", False)
    assert not replay.has_items()
    feed([store.make_adder(None, replay, 0)], [episodes(1, [12])])
    assert replay.has_items()
    batch = next(replay.iterator)
    assert batch.frames.dtype == np.uint8 and batch.frames.shape == (8, 6, 6, 5, 3)
    assert store.nbytes() == 0 and store.host_nbytes() > 0  # nothing on the device


def test_the_iterator_raises_the_drains_error_instead_of_waiting():
    from magi_lp.replay.schedule import RatioGate

    gate = RatioGate(SCHEDULE)
    failure = RuntimeError("the drain died")
    iterator = HostReplayIterator(
        CompressedFrameStore(make_spec()), gate=gate, failure=lambda: failure
    )
    with pytest.raises(RuntimeError, match="the drain died"):
        next(iterator)
