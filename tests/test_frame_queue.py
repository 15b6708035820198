"""The device store's transport and replay ratio, with a real Reverb queue: steps go through
the queue once and reach the store in order; the learner's `RatioGate` holds a fast writer
back (the queue fills and the writer's inserts block) and a fast learner waits for steps,
each exactly at the schedule's numbers; a stop ends every wait at once. The same drain on the
served queue (no Reverb): tests/test_served_replay.py."""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest

from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator, StoreAdder
from magi_lp.replay.schedule import RatioGate, ReplaySchedule
from tests.test_frame_store import as_keys, episodes, feed, make_spec, reference
from tests.test_served_replay import (
    Writer,
    assert_the_learner_stalls_at_the_schedule,
    learner_side_of,
    settle,
)

reverb = pytest.importorskip("reverb")
from magi_lp.replay.frame_queue import (  # noqa: E402  (after the Reverb check)
    QueueDrainer,
    QueueFrameAdder,
    make_step_queue_table,
)

QUEUE = "steps"
SCHEDULE = ReplaySchedule(min_replay_size=10, actor_steps_per_update=2, batch_size=4)
ERROR_BUFFER = 6


@pytest.fixture
def queue():
    server = reverb.Server([make_step_queue_table(QUEUE, max_steps=20)])
    yield reverb.Client(f"localhost:{server.port}")
    server.stop()


@pytest.fixture
def start_writer():
    """Starts a `Writer` of `steps` steps through `adder` (default: a `QueueFrameAdder` of
    `client`'s queue told to stop by the writer's finish), pausing at `pause_at`; finishes
    every one it started at the test's end, before the queue and the drains go."""
    started = []

    def start(
        client, spec, steps: int, *, adder=None, stop=None, pause_at: int | None = None
    ) -> Writer:
        stop = stop or threading.Event()
        adder = adder or QueueFrameAdder(client, QUEUE, 0, spec, should_stop=stop.is_set)
        writer = Writer(adder, stop, steps)
        writer.pause_at = pause_at
        started.append(writer)
        writer.start()
        return writer

    yield start
    for writer in started:
        writer.finish()


@pytest.fixture
def drainers():
    """Closes every drain a test started, failed or not (a reader left blocked in C++ at
    the process's exit aborts it)."""
    started = []
    yield started
    for drainer in started:
        drainer.close()


def learner_side(client, spec, drainers, writers: int = 1):
    return learner_side_of(
        lambda store, gate: QueueDrainer(client, QUEUE, store, gate),
        spec,
        drainers,
        writers,
        ERROR_BUFFER,
    )


@pytest.mark.integration
def test_the_queue_carries_each_step_once_in_order(queue, drainers):
    """Two writers through the queue give the store the same transitions as direct writes."""
    spec = make_spec(capacity=500)
    data = [episodes(21, [12, 3, 20]), episodes(22, [15, 9])]
    store = DeviceFrameStore(spec, writers=2)
    gate = RatioGate(SCHEDULE, error_buffer=10_000)  # no hold-back here
    drainer = QueueDrainer(queue, QUEUE, store, gate)
    drainers.append(drainer)
    drainer.start()
    adders = [QueueFrameAdder(queue, QUEUE, w, spec) for w in range(2)]
    feed(adders, data)
    for adder in adders:
        adder.close()
    steps = sum(len(ep) for eps in data for ep in eps)
    assert settle(lambda: drainer.steps, steps) == steps
    drainer.close()
    got = store.transitions_at(0)
    want = reference(data)
    assert sorted(as_keys(got.frames, got.action, got.reward, got.discount)) == sorted(
        as_keys(*zip(*want, strict=True))
    )


@pytest.mark.integration
def test_a_slow_learner_holds_the_writer_back_at_the_schedule(queue, drainers, start_writer):
    spec = make_spec(capacity=500)
    _, gate, drainer, iterator = learner_side(queue, spec, drainers)
    writer = start_writer(queue, spec, steps=400)
    # No batch sampled: the drain stops at min_replay_size + error buffer transitions...
    held = SCHEDULE.min_replay_size + ERROR_BUFFER
    assert settle(lambda: gate.inserted, held) == held
    # ...then the queue fills and the writer's inserts block.
    written = settle(lambda: writer.written)
    assert writer.is_alive() and written < 100
    # Drained + the queue (20) + what the drain's reader fetched ahead (4) + the adder's
    # unconfirmed inserts (8) + the one blocked: nothing more got past.
    assert written <= drainer.steps + 20 + 4 + 8 + 1

    for _ in range(5):  # each batch lets 2 more transitions in, no more
        next(iterator)
    held = SCHEDULE.min_replay_size + 5 * 2 + ERROR_BUFFER
    assert settle(lambda: gate.inserted, held) == held
    assert settle(lambda: writer.written) > written

    # A stop: the writer blocked on the full queue gives its write up within its poll...
    written = settle(lambda: writer.written)
    start = time.monotonic()
    writer.finish()
    assert not writer.is_alive() and writer.abandoned
    assert time.monotonic() - start < 2.0
    # ...and the drain and the learner's wait end at once.
    start = time.monotonic()
    drainer.close()
    assert time.monotonic() - start < 2.0
    with pytest.raises(StopIteration):
        next(iterator)


@pytest.mark.integration
def test_a_stop_takes_what_the_reverb_queue_holds_into_the_store(queue, drainers, start_writer):
    """At a stop (the writers gone) the learner takes every step the queue still holds,
    though the ratio held them back and a Reverb read waits on: it ends once none has come
    for its quiet time."""
    spec = make_spec(capacity=500)
    store, gate, drainer, iterator = learner_side(queue, spec, drainers)
    writer = start_writer(queue, spec, steps=400)
    held = SCHEDULE.min_replay_size + ERROR_BUFFER
    assert settle(lambda: gate.inserted, held) == held
    assert settle(lambda: queue.server_info()[QUEUE].current_size, 20) == 20
    writer.finish()
    assert not writer.is_alive()
    before = drainer.steps

    start = time.monotonic()
    taken = drainer.take_the_rest(quiet_s=0.5)
    assert time.monotonic() - start < 5.0
    table = queue.server_info()[QUEUE]
    sent = table.rate_limiter_info.insert_stats.completed  # every item the queue took
    assert taken >= 20 and drainer.steps == before + taken == sent
    assert table.current_size == 0
    assert store.save()["counts"][2] == sent  # steps_added: each item one frame
    with pytest.raises(StopIteration):
        next(iterator)


@pytest.mark.integration
def test_a_slow_writer_stalls_the_learner_at_the_schedule(queue, drainers, start_writer):
    spec = make_spec(capacity=500)
    _store, gate, drainer, iterator = learner_side(queue, spec, drainers)
    writer = start_writer(queue, spec, steps=400, pause_at=30)  # 1 + 30 steps: 28 transitions
    assert_the_learner_stalls_at_the_schedule(writer, gate, drainer, iterator)


def test_direct_writes_need_no_queue_and_sample_without_a_gate():
    """The single-process path: the actor's adder writes into the store; no Reverb."""
    spec = make_spec(capacity=100)
    store = DeviceFrameStore(spec, writers=1)
    feed([StoreAdder(store, 0)], [episodes(31, [12])])
    batch = next(DeviceReplayIterator(store, jax.random.PRNGKey(1)))
    assert batch.frames.shape == (spec.batch_size, spec.window, *spec.frame_shape)


@pytest.mark.integration
def test_a_writer_held_back_by_the_reverb_rate_limiter_gives_up_at_a_stop(start_writer):
    """The Reverb store's adder, blocked by its table's rate limiter (nobody samples), ends
    within its poll once told to stop: no node needs SIGKILL for it."""
    from magi_lp.replay.frame_replay import FrameStackAdder, make_frame_replay_table

    spec = make_spec(capacity=500)
    from acme import specs

    table = make_frame_replay_table(
        "frames",
        500,
        frame_shape=spec.frame_shape,
        action_spec=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
        frame_stack=3,
        n_step=3,
        rate_limiter=SCHEDULE.rate_limiter(),
    )
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        stop = threading.Event()
        adder = FrameStackAdder(client, "frames", frame_stack=3, n_step=3, should_stop=stop.is_set)
        writer = start_writer(client, spec, steps=10_000, adder=adder, stop=stop)
        written = settle(lambda: writer.written)
        assert writer.is_alive() and written < 2_000  # held back by the limiter
        start = time.monotonic()
        writer.finish()
        assert not writer.is_alive() and writer.abandoned
        assert time.monotonic() - start < 2.0
    finally:
        server.stop()
