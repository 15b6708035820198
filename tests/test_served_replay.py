"""The replay without Reverb (transport 'served'): the device store's step queue
(magi_lp/replay/step_queue.py) and the host transition table (magi_lp/replay/transition_table.py),
served by a replay node and called through handles, and the stores that use them
(magi_lp/replay/stores, `resolve_store(..., transport='served')`).

Threads stand in for the nodes' processes, and `Remote` for an engine's handle: every call's
arguments and answer are pickled (as a remote call copies them) and the answer's arrays come
back read-only (as Ray hands them). Runs on both stacks; where Reverb is installed the
transitions are also compared with the official samplers' (the Reverb frame replay, Acme's
`NStepTransitionAdder`), by the checks the device store and the host replay already have.
"""

from __future__ import annotations

import ast
import importlib.util
import pickle
import threading
import time
from pathlib import Path

import dm_env
import jax
import ml_collections
import numpy as np
import pytest
import tree

from magi_lp.acme_api import specs
from magi_lp.errors import ConfigError
from magi_lp.replay import step_batch
from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator
from magi_lp.replay.schedule import RatioGate, ReplaySchedule
from magi_lp.replay.served_queue import StepQueue
from magi_lp.replay.spec import TransitionReplaySpec, WriteAbandonedError
from magi_lp.replay.step_queue import (
    ServedFrameAdder,
    ServedStepSource,
    StepDrainer,
    failure_of,
    step_example,
)
from magi_lp.replay.stores import resolve_store
from magi_lp.replay.transition_replay import TransitionAdder, TransitionReplay
from magi_lp.replay.transition_table import (
    ServedTransitionAdder,
    TransitionSampler,
    TransitionTable,
)
from tests.test_frame_store import (
    N_STEP,
    STACK,
    as_keys,
    episodes,
    feed,
    make_spec,
    reference,
    reverb_frame_replay_keys,
)
from tests.test_transition_replay import (
    ENV_SPEC,
    GAMMA,
    _episodes,
    _expected,
    _feed,
    _key,
    _rows,
    acme_n_step_transitions,
)

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = ReplaySchedule(min_replay_size=10, actor_steps_per_update=2, batch_size=4)
ERROR_BUFFER = 6
FRAME = np.zeros((6, 5, 3), np.uint8)
OBSERVATION = np.concatenate([FRAME] * STACK, axis=-1)


# -- stand-ins for the engine and the nodes -----------------------------------------------


def _read_only(value):
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    return value


class Remote:
    """A handle as an engine gives it: each call's arguments and answer pickled, the
    answer's arrays read-only."""

    def __init__(self, server):
        self._server = server
        self.calls = 0

    def __getattr__(self, name):
        method = getattr(self._server, name)

        def call(*args, **named):
            self.calls += 1
            answer = method(*pickle.loads(pickle.dumps(args)), **pickle.loads(pickle.dumps(named)))
            return tree.map_structure(_read_only, pickle.loads(pickle.dumps(answer)))

        return call


class Writer(threading.Thread):
    """Writes `steps` steps of one long pixel episode through `adder` (or, with `transitions`,
    a state episode), counting them, until `finish()`: a write the replay holds back is then
    given up (`WriteAbandonedError`)."""

    def __init__(self, adder, stop: threading.Event, steps: int, *, pixels: bool = True):
        super().__init__(daemon=True)
        self.adder, self.stop, self.steps, self.pixels = adder, stop, steps, pixels
        self.written = 0
        self.go = threading.Event()
        self.go.set()
        self.pause_at: int | None = None
        self.abandoned = False

    def run(self) -> None:
        observation = OBSERVATION if self.pixels else np.zeros(3, np.float32)
        action = np.zeros(2, np.float32)
        try:
            self.adder.add_first(dm_env.restart(observation))
            for _ in range(self.steps):
                if self.pause_at is not None and self.written >= self.pause_at:
                    self.go.clear()
                    self.go.wait()
                if self.stop.is_set():
                    return
                self.adder.add(action, dm_env.transition(np.float32(1.0), observation))
                self.written += 1
        except WriteAbandonedError:
            self.abandoned = True

    def finish(self, timeout: float = 5.0) -> float:
        """Stops the writer; the seconds it took to end."""
        start = time.monotonic()
        self.stop.set()
        self.go.set()
        self.join(timeout)
        return time.monotonic() - start


def settle(read, expect=None, seconds: float = 60.0, quiet: float = 1.0):
    """Waits until `read()` stops changing for `quiet` seconds; returns its value. With
    `expect`, first until it reads that (within `seconds`): on a busy machine a thread can
    stall for longer than `quiet` before it gets there, which read as settled too early."""
    deadline = time.monotonic() + seconds
    while expect is not None and read() != expect and time.monotonic() < deadline:
        time.sleep(0.05)
    value, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return value
    return value


@pytest.fixture
def started():
    """Finishes (or closes) everything a test started, at its end, failed or not."""
    things = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Writer):
            thing.finish()
        else:
            thing.close()


def insert_steps(queue: StepQueue, items: list, timeout: float | None = None) -> int:
    """`queue.insert_batch` of a list of step items."""
    return queue.insert_batch(step_batch.stack(items), timeout) if items else 0


def take_steps(queue: StepQueue, max_items: int, timeout: float | None = None) -> list:
    """`queue.take_batch` as a list of step items ([]: none came, or closed)."""
    batch = queue.take_batch(max_items, timeout)
    return [] if batch is None else step_batch.rows(batch)


def _in_thread(target, *args) -> tuple[threading.Thread, list]:
    """Runs `target(*args)` on a daemon thread; the list gets its answer (or its error)."""
    out: list = []

    def run() -> None:
        try:
            out.append(target(*args))
        except BaseException as error:
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _step_items(spec, count: int, writer: int = 0) -> list[dict]:
    items = []
    for i in range(count):
        item = step_example(spec)
        item.update(writer=np.int32(writer), first=np.bool_(i == 0), reward=np.float32(i))
        item["frame"] = np.full(spec.frame_shape, i % 256, np.uint8)
        items.append(item)
    return items


# -- the served modules are engine-neutral ------------------------------------------------


def test_the_served_replay_imports_no_engine_and_no_reverb():
    """Any node process can hold them: no Reverb, Launchpad, Ray, Courier or TensorFlow, and
    no JAX (a replay node needs none)."""
    banned = {"reverb", "launchpad", "ray", "courier", "tensorflow", "jax", "jaxlib"}
    for module in ("step_queue", "served_queue", "step_batch", "transition_table"):
        source = (ROOT / "magi_lp" / "replay" / f"{module}.py").read_text()
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert not imported & banned, (module, imported & banned)


# -- the step queue -----------------------------------------------------------------------


def test_the_step_queue_is_a_bounded_fifo_that_says_what_it_took():
    spec = make_spec()
    queue = StepQueue(spec, max_steps=5)
    items = _step_items(spec, 8)
    start = time.monotonic()
    assert insert_steps(queue, items, 0.2) == 5  # the first five; the rest waited, then no
    assert 0.15 <= time.monotonic() - start < 1.0
    assert queue.info() == {"size": 5, "inserted": 5, "taken": 0, "max_steps": 5, "closed": False}
    got = take_steps(queue, 3)
    assert [float(item["reward"]) for item in got] == [0, 1, 2]
    assert insert_steps(queue, items[5:]) == 3
    got += take_steps(queue, 100)
    assert [float(item["reward"]) for item in got] == list(range(8))
    assert queue.info()["taken"] == 8
    start = time.monotonic()
    assert take_steps(queue, 10, 0.1) == []  # empty: waits its timeout, then none
    assert time.monotonic() - start < 1.0
    # A caller's timeout never exceeds the queue's own bound (BLOCK_S): no call hangs.
    insert_steps(queue, items[:5])
    start = time.monotonic()
    assert insert_steps(queue, items[:1], 3600) == 0
    assert time.monotonic() - start < queue.block_s + 0.5


def test_step_batches_are_the_items_in_columns():
    spec = make_spec(extras={"logp": jax.ShapeDtypeStruct((), np.float32)})
    items = _step_items(spec, 5)
    batch = step_batch.stack(items)
    assert batch["frame"].shape == (5, *spec.frame_shape) and batch["extras"]["logp"].shape == (5,)
    assert step_batch.length(batch) == 5 and step_batch.environment_steps(batch) == 4
    for want, got in zip(items, step_batch.rows(batch), strict=True):
        tree.map_structure(np.testing.assert_array_equal, want, got)
    joined = step_batch.join([step_batch.part(batch, 0, 2), step_batch.part(batch, 2)])
    tree.map_structure(np.testing.assert_array_equal, batch, joined)
    with pytest.raises(ValueError, match="at least one"):
        step_batch.stack([])


def test_the_step_queue_splits_and_joins_the_batches_it_holds_in_order():
    """Batches go in as they came and out at the size asked: a take splits the oldest batch
    or joins several, and the steps keep their order across them."""
    spec = make_spec()
    queue = StepQueue(spec, max_steps=100)
    items = _step_items(spec, 9)
    assert queue.insert_batch(step_batch.stack(items[:4])) == 4
    assert queue.insert_batch(step_batch.stack(items[4:])) == 5
    sizes, rewards = [], []
    for asked in (3, 4, 10):
        batch = queue.take_batch(asked)
        sizes.append(step_batch.length(batch))
        rewards += [float(r) for r in batch["reward"]]
    assert sizes == [3, 4, 2] and rewards == list(range(9))
    assert queue.take_batch(5, 0.05) is None and queue.info()["size"] == 0
    # A full queue takes the first part of a batch; the sender keeps the rest.
    small = StepQueue(spec, max_steps=3)
    assert small.insert_batch(step_batch.stack(items[:5]), 0.05) == 3
    assert [float(r) for r in small.save()["steps"]["reward"]] == [0, 1, 2]


def test_the_step_queue_saves_and_restores_what_it_holds():
    spec = make_spec(extras={"logp": jax.ShapeDtypeStruct((), np.float32)})
    queue = StepQueue(spec, max_steps=10)
    assert queue.save()["steps"]["frame"].shape == (0, *spec.frame_shape)  # empty: same tree
    items = _step_items(spec, 6, writer=3)
    insert_steps(queue, items)
    take_steps(queue, 2)
    saved = pickle.loads(pickle.dumps(queue.save()))
    assert saved["steps"]["frame"].shape == (4, *spec.frame_shape)
    restored = StepQueue(spec, max_steps=10)
    restored.restore(saved)
    assert restored.info() == queue.info()
    for want, got in zip(items[2:], take_steps(restored, 10), strict=True):
        tree.map_structure(np.testing.assert_array_equal, want, got)


def test_close_ends_every_wait_of_the_queue_and_the_table_within_a_second():
    """Writers waiting on a full queue and on the limiter, the drain on an empty queue and the
    learner on a table below its minimum: one `close()` each ends them all at once (their
    own timeouts are long here, so only the close can end them)."""
    spec = make_spec()
    full = StepQueue(spec, max_steps=2, block_s=60)
    insert_steps(full, _step_items(spec, 2))
    empty = StepQueue(spec, max_steps=2, block_s=60)
    table = TransitionTable(
        TransitionReplaySpec(100, 4, 1, GAMMA), ENV_SPEC, SCHEDULE, error_buffer=1, block_s=60
    )
    transitions = [_rows_of_episodes(1)[0]] * (SCHEDULE.min_replay_size + 1)
    assert table.insert(transitions, 0) == SCHEDULE.min_replay_size + 1  # at its limit now
    waits = [_in_thread(insert_steps, full, _step_items(spec, 1), 60) for _ in range(3)]
    waits += [_in_thread(take_steps, empty, 1, 60) for _ in range(2)]
    waits += [_in_thread(table.insert, transitions[:1], 60) for _ in range(2)]
    below = TransitionTable(TransitionReplaySpec(100, 4, 1, GAMMA), ENV_SPEC, SCHEDULE, block_s=60)
    waits += [_in_thread(below.sample, 60)]
    time.sleep(0.5)
    assert all(thread.is_alive() for thread, _ in waits)
    start = time.monotonic()
    for server in (full, empty, table, below):
        server.close()
    for thread, _ in waits:
        thread.join(1.0)
    assert time.monotonic() - start < 1.0
    assert [out for _, out in waits] == [[0], [0], [0], [[]], [[]], [0], [0], [None]]
    assert full.info()["closed"] and table.info()["closed"]


# -- the device store through the served queue --------------------------------------------


def _learner_side(queue_handle, spec, started, writers: int = 1, error_buffer=ERROR_BUFFER):
    return learner_side_of(
        lambda store, gate: StepDrainer(ServedStepSource(queue_handle), store, gate),
        spec,
        started,
        writers,
        error_buffer,
    )


def learner_side_of(make_drainer, spec, started, writers: int, error_buffer: int):
    """The learner's side of a queue: a device store, its gate, the drain that
    `make_drainer(store, gate)` makes (started, and put in `started` to be closed) and the
    learner's iterator. The same for every transport (test_frame_queue's Reverb queue)."""
    store = DeviceFrameStore(spec, writers=writers)
    gate = RatioGate(SCHEDULE, error_buffer=error_buffer)
    drainer = make_drainer(store, gate)
    started.append(drainer)
    store.flush()  # past the store's compile ahead: from here on, every wait is the gate's
    drainer.start()
    iterator = DeviceReplayIterator(
        store, jax.random.PRNGKey(0), gate=gate, failure=failure_of(drainer)
    )
    return store, gate, drainer, iterator


def _reverb_frame_replay(data) -> list[bytes]:
    """The transitions the official sampler (the Reverb frame replay's dataset) gives for
    `data`, as test_frame_store's bit-for-bit check reads them."""
    return reverb_frame_replay_keys(data)[1]


FRAME_DATA = [episodes(11, [7, 2, 12, 3, 30]), episodes(12, [9, 4, 11, 1, 25])]
"""Two writers' episodes, with terminations and episodes shorter than n (test_frame_store's
bit-for-bit check feeds these)."""


def _through_the_served_queue(data, started) -> tuple[list[bytes], set[bytes]]:
    """`data` written by two adders through a served queue of 8 steps and drained into a
    device store: the transitions it holds, and those of a batch sampled from it."""
    spec = make_spec(capacity=500)
    queue = StepQueue(spec, max_steps=8)
    store, _, drainer, iterator = _learner_side(
        Remote(queue), spec, started, writers=2, error_buffer=10_000
    )
    adders = [ServedFrameAdder(Remote(queue), w, spec) for w in range(2)]
    feed(adders, data)  # the writes wait for the drain on the way
    for adder in adders:
        adder.close()
    steps = sum(len(ep) for eps in data for ep in eps)
    assert settle(lambda: drainer.steps, steps, quiet=0.5) == steps
    assert queue.info()["inserted"] == steps  # each step one item: a frame crosses once
    got = store.transitions_at(0)
    sampled = jax.device_get(next(iterator))
    drainer.close()
    return (
        as_keys(got.frames, got.action, got.reward, got.discount),
        set(as_keys(sampled.frames, sampled.action, sampled.reward, sampled.discount)),
    )


def test_the_served_queue_carries_each_step_once_to_the_reference_transitions(started):
    """Through the served queue the store holds exactly the transitions computed from the
    stacked observations, and the batches sampled are made of them."""
    held, sampled = _through_the_served_queue(FRAME_DATA, started)
    assert sorted(held) == sorted(as_keys(*zip(*reference(FRAME_DATA), strict=True)))
    assert sampled <= set(held)


@pytest.mark.integration  # a real Reverb server
@pytest.mark.skipif(importlib.util.find_spec("reverb") is None, reason="Reverb not installed")
def test_the_served_queue_gives_the_reverb_frame_replays_transitions_bit_for_bit(started):
    """The official sampler (the Reverb frame replay's dataset) and the device store fed
    through the served queue hold the same transitions, bit for bit: test_frame_store's
    check, on the served path."""
    held, _ = _through_the_served_queue(FRAME_DATA, started)
    official = _reverb_frame_replay(FRAME_DATA)
    assert len(official) == len(held) == len(reference(FRAME_DATA))
    assert sorted(official) == sorted(held)


def _writer_and_learner(started):
    """A served queue of 20 steps, the learner's side of it, and a writer of 400 steps
    through it (told to stop by its `finish()`), started."""
    spec = make_spec(capacity=500)
    queue = StepQueue(spec, max_steps=20)
    store, gate, drainer, iterator = _learner_side(Remote(queue), spec, started)
    stop = threading.Event()
    writer = Writer(ServedFrameAdder(Remote(queue), 0, spec, should_stop=stop.is_set), stop, 400)
    started.append(writer)
    writer.start()
    return queue, store, gate, drainer, iterator, writer


@pytest.mark.integration  # a writer and a learner on threads, held for seconds
def test_a_slow_learner_holds_the_served_writer_back_at_the_schedule(started):
    queue, _, gate, drainer, iterator, writer = _writer_and_learner(started)
    # No batch sampled: the drain stops at min_replay_size + error buffer transitions...
    held = SCHEDULE.min_replay_size + ERROR_BUFFER
    assert settle(lambda: gate.inserted, held) == held
    # ...then the queue fills and the writer's inserts wait.
    written = settle(lambda: writer.written)
    assert writer.is_alive() and queue.info()["size"] == 20
    # Drained + the queue (20) + the one waiting: nothing more got past.
    assert written <= drainer.steps + 20 + 1

    for _ in range(5):  # each batch lets 2 more transitions in, no more
        next(iterator)
    held = SCHEDULE.min_replay_size + 5 * 2 + ERROR_BUFFER
    assert settle(lambda: gate.inserted, held) == held
    assert settle(lambda: writer.written) > written

    # A stop: the writer waiting on the full queue gives its write up within a call...
    assert writer.finish() < 1.0
    assert not writer.is_alive() and writer.abandoned
    # ...and the drain and the learner's wait end at once.
    start = time.monotonic()
    drainer.close()
    assert time.monotonic() - start < 1.0
    with pytest.raises(StopIteration):
        next(iterator)


def test_a_stop_takes_what_the_queue_holds_into_the_store_past_the_ratio(started):
    """The actors counted every step in the queue: at a stop the learner takes them in before
    its final save (left there, the replay node's stop lost up to `replay.queue_steps`)."""
    queue, store, gate, drainer, iterator, writer = _writer_and_learner(started)
    held = SCHEDULE.min_replay_size + ERROR_BUFFER  # no batch sampled: the ratio holds it
    assert settle(lambda: gate.inserted, held) == held
    assert settle(lambda: queue.info()["size"], 20) == 20
    writer.finish()
    assert not writer.is_alive()
    before = drainer.steps
    assert before < writer.written + 1  # the first step's item too

    start = time.monotonic()
    taken = drainer.take_the_rest(quiet_s=0.5)
    assert time.monotonic() - start < 5.0
    assert taken == 20 == drainer.steps - before
    assert queue.info()["size"] == 0
    # Every step the writer got into the queue is in the store, and saved with it.
    assert drainer.steps == writer.written + 1
    saved = store.save()
    assert int(saved["counts"][2]) == writer.written + 1  # steps_added: frames, first included
    assert int(saved["counts"][0]) == gate.inserted > held
    with pytest.raises(StopIteration):  # no batch beside the last writes
        next(iterator)


def test_the_rest_is_nothing_once_the_drain_has_ended(started):
    spec = make_spec(capacity=500)
    queue = StepQueue(spec, max_steps=20)
    _, _, drainer, _ = _learner_side(Remote(queue), spec, started)
    drainer.close()
    insert_steps(queue, _step_items(spec, 3))
    assert drainer.take_the_rest() == 0
    assert queue.info()["size"] == 3


@pytest.mark.integration  # a writer and a learner on threads, held for seconds
def test_a_slow_served_writer_stalls_the_learner_at_the_schedule(started):
    spec = make_spec(capacity=500)
    queue = StepQueue(spec, max_steps=20)
    _, gate, drainer, iterator = _learner_side(Remote(queue), spec, started)
    stop = threading.Event()
    writer = Writer(ServedFrameAdder(Remote(queue), 0, spec, should_stop=stop.is_set), stop, 400)
    writer.pause_at = 30  # 1 + 30 steps: 28 transitions
    started.append(writer)
    writer.start()
    assert_the_learner_stalls_at_the_schedule(writer, gate, drainer, iterator)


def assert_the_learner_stalls_at_the_schedule(writer, gate, drainer, iterator) -> None:
    """A writer paused at 30 steps (28 transitions), then let on to 50: the learner takes
    exactly the updates `SCHEDULE` allows each time and waits, until the drain closes. The
    same on every transport of the steps (the served queue here, Reverb's in
    test_frame_queue)."""
    batches = []
    learner = threading.Thread(target=lambda: [batches.append(1) for _ in iterator], daemon=True)
    learner.start()
    assert settle(lambda: writer.written, 30) == 30  # paused
    assert settle(lambda: gate.inserted, 28) == 28
    # Exactly the updates 28 inserted transitions allow: (28 - 10) // 2 + 1 = 10.
    assert settle(lambda: len(batches), 10) == SCHEDULE.updates_due(28) == 10
    assert learner.is_alive()  # waiting for steps, not sampling ahead

    writer.pause_at = 50
    writer.go.set()
    assert settle(lambda: writer.written, 50) == 50
    assert settle(lambda: gate.inserted, 48) == 48
    assert settle(lambda: len(batches), 20) == SCHEDULE.updates_due(48) == 20

    drainer.close()
    learner.join(timeout=30.0)  # at once when it works; a busy machine may be slow
    assert not learner.is_alive()  # the stop ended the learner's wait


def test_a_writer_to_a_closed_queue_gives_up_though_nobody_said_stop_and_batches_flush_at_close():
    spec = make_spec()
    queue = StepQueue(spec, max_steps=1)
    adder = ServedFrameAdder(Remote(queue), 0, spec)  # never told to stop
    adder.add_first(dm_env.restart(OBSERVATION))
    queue.close()
    with pytest.raises(WriteAbandonedError):
        adder.add(np.zeros(2, np.float32), dm_env.transition(1.0, OBSERVATION))
    # Steps sent in batches: what is pending at the close goes, or is dropped once closed.
    batched = ServedFrameAdder(Remote(queue), 0, spec, send_every=4)
    batched.add_first(dm_env.restart(OBSERVATION))
    batched.close()
    open_queue = StepQueue(spec, max_steps=10)
    batched = ServedFrameAdder(Remote(open_queue), 0, spec, send_every=4)
    batched.add_first(dm_env.restart(OBSERVATION))
    batched.add(np.zeros(2, np.float32), dm_env.transition(1.0, OBSERVATION))
    assert open_queue.info()["inserted"] == 0
    batched.close()
    assert open_queue.info()["inserted"] == 2


# -- the host transition table ------------------------------------------------------------


def _rows_of_episodes(seed: int, lengths=(5, 7), n: int = 1) -> list:
    """Transitions of a few episodes, as the host replay's n-step adder makes them."""
    replay = TransitionReplay(TransitionReplaySpec(1000, 4, n, GAMMA), ENV_SPEC)
    _feed(
        TransitionAdder(replay, n, GAMMA),
        _episodes(np.random.default_rng(seed), list(lengths), [True, False]),
    )
    return _rows(replay)


def _table(schedule=SCHEDULE, error_buffer=ERROR_BUFFER, capacity=1000, **kwargs):
    return TransitionTable(
        TransitionReplaySpec(capacity, schedule.batch_size, 1, GAMMA),
        ENV_SPEC,
        schedule,
        error_buffer=error_buffer,
        **kwargs,
    )


def test_the_table_samples_nothing_below_its_minimum_size():
    table = _table()
    transition = _rows_of_episodes(2)[0]
    assert table.insert([transition] * (SCHEDULE.min_replay_size - 1)) == 9
    start = time.monotonic()
    assert table.sample(0.2) is None  # below min_replay_size: waits its timeout, then none
    assert 0.15 <= time.monotonic() - start < 1.0
    assert table.insert([transition]) == 1
    batch = table.sample(0.2)
    assert batch.observation.shape == (SCHEDULE.batch_size, 3)
    assert table.info()["sampled_batches"] == 1


def test_the_table_limits_samples_per_insert_by_the_schedules_rule():
    """Inserts stop where `RatioGate` says (min_replay_size + error buffer before any batch,
    then actor_steps_per_update more per batch), and batches stop at `updates_due`; the
    default error buffer is the schedule's (`error_buffer_factor` updates' worth, the slack of
    its Reverb limiter)."""
    transition = _rows_of_episodes(3)[0]
    table = _table()
    rule = RatioGate(SCHEDULE, error_buffer=ERROR_BUFFER)
    assert table.insert([transition] * 100, 0.2) == rule.insert_limit() == 16
    assert table.info()["insert_limit"] == 16
    batches = 0
    while table.sample(0.05) is not None:
        batches += 1
    assert batches == SCHEDULE.updates_due(16) == 4  # (16 - 10) // 2 + 1
    assert table.insert([transition] * 100, 0.2) == 4 * 2  # each batch let 2 more in
    while table.sample(0.05) is not None:
        batches += 1
    assert batches == SCHEDULE.updates_due(24) == 8

    default = TransitionTable(TransitionReplaySpec(1000, 4, 1, GAMMA), ENV_SPEC, SCHEDULE)
    assert default.gate.error_buffer == RatioGate(SCHEDULE).error_buffer == 200
    assert default.insert([transition] * 300, 0.2) == 10 + 200


def test_a_table_insert_asked_again_takes_its_transitions_once():
    """An engine that lost an insert's answer asks it again (Ray: "may or may not have been
    executed"): the transitions the table took from that sender count, and go in once."""
    rows = _rows_of_episodes(5, lengths=(9, 10))
    table = _table()
    assert table.insert(rows[:6], sender="a", offset=0) == 6
    assert table.insert(rows[:6], sender="a", offset=0) == 6  # asked again
    assert table.info()["inserted"] == 6
    # At the limiter's limit (16) the next call takes 10 of 12; asked again once the learner
    # sampled, it takes the other 2 and says 12.
    assert table.insert(rows[6:18], 0.05, sender="a", offset=6) == 10
    assert table.sample(0.1) is not None
    assert table.insert(rows[6:18], 0.05, sender="a", offset=6) == 12
    assert table.info()["inserted"] == 18
    held = table.save()["data"]  # in the order they came, each once
    for field in ("observation", "action", "next_observation"):
        sent = np.stack([getattr(row, field) for row in rows[:18]])
        np.testing.assert_array_equal(held[field][:18], sent)
    with pytest.raises(ValueError, match="took only 18 of its items"):
        table.insert(rows[:1], sender="a", offset=20)


def test_the_table_saves_and_restores_its_transitions_and_the_limiters_counts():
    rows = _rows_of_episodes(4, lengths=(9, 8))
    table = _table(capacity=12)
    assert table.insert(rows) == 16  # at the limiter's limit, and past the capacity (FIFO)
    for _ in range(3):
        assert table.sample(0.1) is not None
    saved = pickle.loads(pickle.dumps(table.save()))
    restored = _table(capacity=12)
    restored.restore(saved)
    assert restored.info() == table.info()
    tree.map_structure(np.testing.assert_array_equal, restored.save(), table.save())
    # The limiter goes on from the restored counts: 3 batches allowed 6 more inserts.
    assert restored.insert(rows[:1] * 10, 0.1) == 6
    assert table.insert(rows[:1] * 10, 0.1) == 6


TD3_N = 3
TD3_EPISODES = _episodes(np.random.default_rng(7), [2, 6, 4], [True, False, True])
"""Episodes shorter and longer than n, with terminations (test_transition_replay's check)."""


def _through_the_served_table(started) -> tuple[set, set]:
    """TD3_EPISODES written by an adder through a served table: its transitions in order
    (also checked equal to the host replay's), and those of a batch the learner samples."""
    schedule = ReplaySchedule(min_replay_size=1, actor_steps_per_update=1, batch_size=4)
    table = _table(schedule, error_buffer=10_000)
    _feed(ServedTransitionAdder(Remote(table), TD3_N, GAMMA), TD3_EPISODES)
    direct = TransitionReplay(TransitionReplaySpec(1000, 4, TD3_N, GAMMA), ENV_SPEC)
    _feed(TransitionAdder(direct, TD3_N, GAMMA), TD3_EPISODES)
    served = TransitionReplay(TransitionReplaySpec(1000, 4, TD3_N, GAMMA), ENV_SPEC)
    served.restore(table.save())
    assert [_key(t) for t in _rows(served)] == [_key(t) for t in _rows(direct)]
    sampler = TransitionSampler(Remote(table))
    started.append(sampler)
    batch = next(sampler)
    return {_key(t) for t in _rows(served)}, {_key(t) for t in _rows_from_batch(batch)}


def test_served_transitions_are_the_host_replays_with_acmes_n_step_arithmetic(started):
    """Through the served table, each (s_t, a_t) once with Acme's n-step return and discount
    (the host replay's transitions, computed from the definition), and the learner's batches
    are made of them."""
    held, sampled = _through_the_served_table(started)
    assert held == {_key(t) for t in _expected(TD3_EPISODES, TD3_N)}
    assert len(held) == 12 and sampled <= held


@pytest.mark.integration  # a real Reverb server
@pytest.mark.skipif(importlib.util.find_spec("reverb") is None, reason="Reverb not installed")
def test_served_transitions_are_acmes_n_step_adders_on_reverb(started):
    """Acme's `NStepTransitionAdder` on Reverb (the official sampler) writes the served
    table's transitions, plus its shorter ones from s_0: test_transition_replay's check."""
    held, _ = _through_the_served_table(started)
    theirs = {_key(t) for t in acme_n_step_transitions(TD3_EPISODES, TD3_N)}
    assert held <= theirs
    extra = theirs - held
    assert len(extra) == sum(min(TD3_N - 1, len(steps) - 1) for _, steps in TD3_EPISODES)


def _rows_from_batch(batch) -> list:
    from magi_lp.acme_api import types

    return [
        types.Transition(*(np.asarray(field)[i] for field in batch[:5]), ())
        for i in range(len(batch.reward))
    ]


def test_a_served_td3_writer_held_back_by_the_limiter_gives_up_at_a_stop(started):
    table = _table()
    stop = threading.Event()
    adder = ServedTransitionAdder(Remote(table), 1, GAMMA, should_stop=stop.is_set)
    writer = Writer(adder, stop, 10_000, pixels=False)
    started.append(writer)
    writer.start()
    assert settle(lambda: writer.written, 16) == 16  # min_replay_size + error buffer, then held
    assert writer.is_alive()
    assert writer.finish() < 1.0
    assert not writer.is_alive() and writer.abandoned


def test_the_learners_sampler_ends_at_its_close_or_the_tables():
    for close_table in (False, True):
        table = _table()  # empty: the learner waits
        sampler = TransitionSampler(Remote(table))
        thread, out = _in_thread(next, sampler)
        time.sleep(0.3)
        assert thread.is_alive()
        start = time.monotonic()
        (table if close_table else sampler).close()
        thread.join(1.0)
        assert time.monotonic() - start < 1.0
        assert isinstance(out[0], StopIteration)


# -- the stores on the served transport ---------------------------------------------------

PIXEL_ENV_SPEC = specs.EnvironmentSpec(
    observations=specs.Array(OBSERVATION.shape, np.uint8),
    actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)


class _Builder:
    """The replay methods of an agent's builder: pixels (`frame_replay`), or states with a
    host replay (`transition_replay`), or neither (its own Reverb tables)."""

    def __init__(self, kind: str):
        self.kind = kind

    def frame_replay(self, environment_spec):
        del environment_spec
        return make_spec(capacity=500) if self.kind == "pixels" else None

    def transition_replay(self, environment_spec):
        del environment_spec
        return TransitionReplaySpec(1000, 4, 3, GAMMA) if self.kind == "states" else None

    def replay_schedule(self):
        return SCHEDULE


def _config(store: str = "auto", num_actors: int = 2) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {
            "num_actors": num_actors,
            "envs_per_actor": 1,
            "seed": 3,
            "replay": {"store": store, "queue_steps": 20},
        }
    )


def test_resolve_store_takes_the_engines_transport_and_refuses_what_needs_reverb():
    from magi_lp.replay.stores.device import DeviceStore
    from magi_lp.replay.stores.host import HostTransitions

    pixels = resolve_store(_Builder("pixels"), _config(), transport="served")
    assert isinstance(pixels, DeviceStore) and pixels.served and not pixels.uses_reverb
    assert pixels.make_tables(PIXEL_ENV_SPEC) == []
    queue = pixels.make_server(PIXEL_ENV_SPEC)
    assert isinstance(queue, StepQueue) and queue.max_steps == 20
    states = resolve_store(_Builder("states"), _config(), transport="served")
    assert isinstance(states, HostTransitions) and not states.uses_reverb
    assert isinstance(states.make_server(ENV_SPEC), TransitionTable)

    # Reverb's transport, and one process, are as they were: no server to serve.
    reverb_device = resolve_store(_Builder("pixels"), _config("device"))
    assert reverb_device.uses_reverb and reverb_device.make_server(PIXEL_ENV_SPEC) is None
    for transport in ("reverb", "served"):
        one = resolve_store(
            _Builder("states"), _config("device"), single_process=True, transport=transport
        )
        assert isinstance(one, HostTransitions) and one.make_server(ENV_SPEC) is None
        device = resolve_store(
            _Builder("pixels"), _config("device"), single_process=True, transport=transport
        )
        assert not device.uses_reverb and device.make_server(PIXEL_ENV_SPEC) is None

    with pytest.raises(ConfigError, match=r"replay\.store must be 'device', 'host' or 'auto'"):
        resolve_store(_Builder("pixels"), _config("reverb"), transport="served")
    with pytest.raises(
        ConfigError, match=r"Reverb tables \(make_replay_tables\) need the Launchpad engine"
    ):
        resolve_store(_Builder("neither"), _config(), transport="served")
    with pytest.raises(ConfigError, match="the replay transport must be 'reverb' or 'served'"):
        resolve_store(_Builder("pixels"), _config(), transport="grpc")


def test_the_served_device_store_end_to_end_in_threads(started):
    """The replay node's queue, two actors' adders and the learner's side, all made by the
    store and joined only by handles: the learner samples by the schedule, and a stop ends
    the writers and the learner without a hang."""
    store = resolve_store(_Builder("pixels"), _config(num_actors=2), transport="served")
    queue = store.make_server(PIXEL_ENV_SPEC)
    started.append(queue)
    replay = store.make_learner_replay(PIXEL_ENV_SPEC, Remote(queue), jax.random.PRNGKey(1))
    started.append(replay)
    assert replay.client is None and replay.saves
    replay.store.flush()
    replay.start()
    stop = threading.Event()
    for w in range(2):
        adder = store.make_adder(PIXEL_ENV_SPEC, Remote(queue), w, should_stop=stop.is_set)
        assert isinstance(adder, ServedFrameAdder)
        writer = Writer(adder, stop, 10_000)
        started.append(writer)
        writer.start()
    batches = [next(replay.iterator) for _ in range(5)]
    assert batches[0].frames.shape == (8, STACK + N_STEP, *FRAME.shape)  # make_spec's batch
    gate = replay.gate
    assert gate.sampled == 5 and gate.inserted <= gate.insert_limit()
    info = replay.info()
    assert info["replay_sampled"] == 5 * 8 and info["replay_inserted"] >= 1
    start = time.monotonic()
    stop.set()
    replay.close()
    queue.close()
    for writer in [t for t in started if isinstance(t, Writer)]:
        writer.join(1.0)
        assert not writer.is_alive()
    assert time.monotonic() - start < 1.5
    with pytest.raises(StopIteration):
        next(replay.iterator)


def test_the_served_host_transitions_end_to_end_in_threads(started):
    """TD3's replay node table, an actor's adder and the learner's side, made by the store:
    the learner gets batches by the schedule, its checkpoint (`checkpoint.replay`) saves and
    restores the replay node's table, and a stop ends everyone."""
    store = resolve_store(_Builder("states"), _config(num_actors=1), transport="served")
    table = store.make_server(ENV_SPEC)
    started.append(table)
    replay = store.make_learner_replay(ENV_SPEC, Remote(table), None)
    started.append(replay)
    assert replay.saves and replay.client is None
    stop = threading.Event()
    adder = store.make_adder(ENV_SPEC, Remote(table), 0, should_stop=stop.is_set)
    assert isinstance(adder, ServedTransitionAdder)
    writer = Writer(adder, stop, 10_000, pixels=False)
    started.append(writer)
    writer.start()
    for _ in range(3):
        batch = next(replay.iterator)
    assert batch.observation.shape == (4, 3)
    # Held back at min_replay_size + the default error buffer (200) + 2 per batch sampled.
    assert (
        settle(lambda: replay.info()["replay_inserted"], 10 + 200 + 3 * 2, quiet=0.5)
        == 10 + 200 + 3 * 2
    )
    saved = replay.save()
    info = table.info()

    fresh = store.make_server(ENV_SPEC)
    again = store.make_learner_replay(ENV_SPEC, Remote(fresh), None)
    again.restore(saved)
    assert fresh.info() == {**info, "closed": False}
    assert writer.finish() < 1.0 and writer.abandoned
    start = time.monotonic()
    thread, out = _in_thread(next, again.iterator)  # the fresh table: 3 batches are due
    thread.join(1.0)
    assert out and out[0].observation.shape == (4, 3)
    fresh.close()
    again.close()
    thread, out = _in_thread(next, again.iterator)
    thread.join(1.0)
    assert isinstance(out[0], StopIteration) and time.monotonic() - start < 2.0
