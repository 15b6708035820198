"""Steps moved in batches on the served path (issue 67, item 2): an actor's k environments'
steps go to the replay node's `StepQueue` in one call, gathered up to a count and a time
(`StepSender`), sent whenever the acting loop reports its counts, and counted only once the
queue took them; the learner's parameters are put into Ray's object store once per version
(`ray_nodes.SHARED_ANSWERS`).

Runs without Launchpad, Reverb or a Ray cluster (the Ray calls are stood in for).
"""

from __future__ import annotations

import threading
import time

import dm_env
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from magi_lp.acme_api import counting, specs
from magi_lp.agent.actor import BatchedActor, GenericActor, OneEnvironment
from magi_lp.agent.actor_core import ActorCore
from magi_lp.errors import ConfigError
from magi_lp.replay import step_batch
from magi_lp.replay.schedule import RatioGate, ReplaySchedule
from magi_lp.replay.served_queue import StepQueue
from magi_lp.replay.spec import WriteAbandonedError
from magi_lp.replay.step_queue import (
    SEND_SECS,
    SEND_STEPS,
    ServedFrameAdder,
    StepDrainer,
    StepSender,
)
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.acting_loop import ActingLoop
from magi_lp.runtime.config import DISTRIBUTED_COUNT_EVERY, ReplaySettings
from magi_lp.runtime.nodes import far_from_limit
from tests.agent_harness import actor_node_stopping_after
from tests.test_frame_store import STACK, C, H, W, make_spec
from tests.test_served_replay import Remote

ACTION_SPEC = specs.BoundedArray((2,), np.float32, -1.0, 1.0)
FRAME = np.zeros((H, W, C), np.uint8)
OBSERVATION = np.concatenate([FRAME] * STACK, axis=-1)


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Pixels(dm_env.Environment):
    """Episodes of `length` steps of stacked blank frames."""

    def __init__(self, length: int):
        self._length, self._t = length, 0

    def reset(self) -> dm_env.TimeStep:
        self._t = 0
        return dm_env.restart(OBSERVATION)

    def step(self, action) -> dm_env.TimeStep:
        self._t += 1
        if self._t >= self._length:
            return dm_env.truncation(np.float32(1.0), OBSERVATION, np.float32(1.0))
        return dm_env.transition(np.float32(1.0), OBSERVATION, np.float32(1.0))

    def observation_spec(self):
        return specs.Array(OBSERVATION.shape, np.uint8)

    def action_spec(self):
        return ACTION_SPEC


def _core() -> ActorCore:
    def select_action(params, observation, state):
        del params, observation
        return jnp.zeros(2, jnp.float32), state

    return ActorCore(init=lambda key: {"key": key}, select_action=select_action)


class _Builder:
    def frame_replay(self, environment_spec):
        del environment_spec
        return make_spec(capacity=500)


def _store(send_steps: int = SEND_STEPS, send_secs: float = SEND_SECS, envs: int = 3):
    config = ml_collections.ConfigDict(
        {
            "num_actors": 1,
            "envs_per_actor": envs,
            "seed": 0,
            "replay": {
                "store": "device",
                "queue_steps": 10_000,
                "send_steps": send_steps,
                "send_secs": send_secs,
            },
        }
    )
    return resolve_store(_Builder(), config, transport="served")


def _item(first: bool = False) -> dict:
    return {"first": np.bool_(first), "frame": FRAME}


def _loop(
    k: int, queue, *, should_stop=lambda: False, count_every: int = 20, follow=None, **bounds
):
    remote = Remote(queue)
    adders = _store(envs=k, **bounds).make_adders(None, remote, range(k), should_stop)
    keys = list(jax.random.split(jax.random.PRNGKey(0), k))
    actor = (
        BatchedActor(_core(), keys, None, adders)
        if k > 1
        else OneEnvironment(GenericActor(_core(), keys[0], None, adders[0]))
    )
    counter = counting.Counter(time_delta=0.0)
    environments = [Pixels(length=7 + j) for j in range(k)]
    loop = ActingLoop(
        environments, actor, counter, count_every=count_every, counts_follow_sends=follow
    )
    return loop, counter, remote


def _steps_in(queue: StepQueue) -> int:
    """Environment steps the queue took (its items but the episodes' first frames)."""
    saved = queue.save()["steps"]
    return int(np.sum(~np.asarray(saved["first"])))


def test_the_sender_sends_once_the_count_bound_is_reached():
    queue = StepQueue(make_spec(), max_steps=100)
    remote = Remote(queue)
    sender = StepSender(remote, send_steps=3, send_secs=10.0, clock=Clock())
    for i in range(7):
        sender.add(_item(first=i == 0))
    assert remote.calls == 2 and queue.info()["inserted"] == 6 and sender.pending == 1
    assert sender.take_sent() == 6  # the 7th goes now: 7 items, the first a reset
    assert remote.calls == 3 and queue.info()["inserted"] == 7
    assert sender.take_sent() == 0 and remote.calls == 3  # nothing waits: no call


def test_the_sender_sends_its_steps_in_columns():
    """One call carries one array per field (a frame column), not an object per step."""
    queue = StepQueue(make_spec(), max_steps=100)
    calls = []

    class Recording:
        def insert_batch(self, batch, **named):
            calls.append(batch)
            return queue.insert_batch(batch, **named)

    sender = StepSender(Recording(), send_steps=4, send_secs=10.0, clock=Clock())
    for i in range(4):
        sender.add(_item(first=i == 0))
    assert [batch["frame"].shape for batch in calls] == [(4, H, W, C)]
    assert sender.take_sent() == 3 and queue.info()["inserted"] == 4


def test_the_sender_sends_a_slow_environments_steps_after_the_time_bound():
    queue = StepQueue(make_spec(), max_steps=100)
    clock = Clock()
    sender = StepSender(Remote(queue), send_steps=1000, send_secs=0.5, clock=clock)
    sender.add(_item())
    clock.now = 0.4
    sender.add(_item())
    assert queue.info()["inserted"] == 0
    clock.now = 0.55  # the oldest waited past the bound: both go with the third
    sender.add(_item())
    assert queue.info()["inserted"] == 3 and sender.pending == 0
    clock.now = 5.0  # the bound counts from the oldest waiting, not the last send
    sender.add(_item())
    assert queue.info()["inserted"] == 3
    clock.now = 5.6
    sender.add(_item())
    assert queue.info()["inserted"] == 5


def test_an_actors_k_environments_share_one_call():
    queue = StepQueue(make_spec(), max_steps=10_000)
    loop, _, remote = _loop(4, queue, send_steps=16, send_secs=60.0)
    loop.step()  # 4 first items and 4 steps: 8 items, under the bound
    assert remote.calls == 0 and queue.info()["inserted"] == 0
    loop.step()  # 12 items
    loop.step()  # 16: one call for the four environments
    assert remote.calls == 1 and queue.info()["inserted"] == 16
    for _ in range(4):  # 16 steps more (no episode ended yet: 7 steps the shortest)
        loop.step()
    assert remote.calls == 2 and queue.info()["inserted"] == 32


def test_counts_are_exactly_the_steps_the_queue_took_and_pending_steps_are_never_counted():
    """A kill loses only what was never counted: at every report the loop's counts equal the
    steps in the queue, and what waits to be sent between reports is not counted."""
    queue = StepQueue(make_spec(), max_steps=10_000)
    loop, counter, _ = _loop(3, queue, count_every=5, send_steps=1000, send_secs=60.0)
    reports = 0
    for taken in range(1, 30):
        before = dict(loop.counts)
        loop.step()
        counted = counter.get_counts().get("steps", 0)
        assert counted <= _steps_in(queue), taken  # never ahead of the replay
        if loop.counts != before:  # a report (every 5 steps, or an episode's end)
            reports += 1
            assert counted == _steps_in(queue) == 3 * taken, taken
    assert reports >= 6
    assert counter.get_counts()["episodes"] == loop.counts["episodes"] >= 3


def test_a_stop_sends_the_buffer_before_the_actor_reports_its_counts():
    queue = StepQueue(make_spec(), max_steps=10_000)
    loop, counter, _ = _loop(3, queue, count_every=20, send_steps=1000, send_secs=60.0)
    node, _ = actor_node_stopping_after(loop, 5)  # the program stops after 5 loop steps
    assert queue.info()["inserted"] == 0
    node.run()
    assert counter.get_counts()["steps"] == _steps_in(queue) == 3 * 5
    assert queue.info()["inserted"] == 3 * 5 + 3  # and the three episodes' first frames


def test_what_a_stop_drops_is_not_counted():
    """A full queue at a stop: what it would not take is dropped, and only what it took is
    counted (a relaunch takes the dropped steps again, as steps never counted)."""
    queue = StepQueue(make_spec(), max_steps=10, block_s=0.05)
    stop = threading.Event()
    loop, _, _ = _loop(2, queue, should_stop=stop.is_set, count_every=1000, send_steps=64)
    for _ in range(6):  # 2 first items and 12 steps wait: under both bounds
        loop.step()
    assert queue.info()["inserted"] == 0
    stop.set()
    counts = loop.flush_counts()
    assert queue.info()["inserted"] == 10 and counts["steps"] == _steps_in(queue) == 8
    assert loop.flush_counts()["steps"] == 8  # the dropped steps never come back


def test_a_write_to_a_closed_queue_is_given_up_and_the_loop_counts_what_went():
    queue = StepQueue(make_spec(), max_steps=100)
    loop, _, _ = _loop(2, queue, count_every=1000, send_steps=6)
    loop.step()
    loop.step()  # 2 first items + 4 steps: sent
    queue.close()
    with pytest.raises(WriteAbandonedError):
        for _ in range(10):
            loop.step()
    assert loop.flush_counts()["steps"] == 4


def test_far_from_the_limit_the_counts_follow_the_sends():
    """Counting with the sends: a report only after a step that sent (or ended an episode),
    of exactly what the queue took; a report never sends, so batches reach the sender's
    bound (12 items here) even though `count_every` is 2 loop steps."""
    queue = StepQueue(make_spec(), max_steps=10_000)
    loop, counter, remote = _loop(
        3, queue, count_every=2, follow=lambda counts: True, send_steps=12, send_secs=60.0
    )
    reports = 0
    for _ in range(20):
        calls, counts = remote.calls, dict(loop.counts)
        loop.step()
        sent = remote.calls > calls
        if loop.counts != counts:  # a report: after a send, or an episode's end
            reports += 1
            ended = loop.counts["episodes"] > counts.get("episodes", 0)
            assert sent or ended
            assert counter.get_counts()["steps"] == _steps_in(queue)
        assert counter.get_counts().get("steps", 0) <= _steps_in(queue)
    # 3 first items and 60 steps (6 more first items at episodes' ends) in sends of 12.
    assert remote.calls == queue.info()["inserted"] // 12 == 5
    assert 5 <= reports <= 5 + 6  # the sends, and the steps that ended episodes
    assert loop.flush_counts()["steps"] == _steps_in(queue) == 60  # the rest, sent now


def test_near_the_limit_the_loop_sends_and_counts_every_count_every_steps():
    """Once `counts_follow_sends` says no (near the step limit), every `count_every` loop
    steps the loop sends what waits and counts it: the counts are exact at each report."""
    queue = StepQueue(make_spec(), max_steps=10_000)
    loop, counter, _ = _loop(
        3,
        queue,
        count_every=2,
        follow=lambda counts: counts.get("steps", 0) < 9,
        send_steps=12,
        send_secs=60.0,
    )
    for _ in range(3):  # 3 first items and 9 steps: one send of 12, counted with it
        loop.step()
    assert counter.get_counts()["steps"] == 9
    for taken in range(4, 12):
        loop.step()
        if taken % 2 == 1:  # every second loop step: sent and counted, nothing left out
            assert counter.get_counts()["steps"] == _steps_in(queue) == 3 * taken, taken


def test_the_rule_for_counting_with_the_sends_keeps_a_margin_before_the_limit():
    """Every actor's unsent batch and two reports' steps: within that of the limit an actor
    counts every `DISTRIBUTED_COUNT_EVERY` loop steps, as before batches."""
    far = far_from_limit(1000, actors=2, envs_per_actor=1, send_steps=256)
    margin = 2 * (256 + 2 * DISTRIBUTED_COUNT_EVERY)
    assert far({}) and far({"actor_steps": 999 - margin})
    assert not far({"actor_steps": 1000 - margin}) and not far({"actor_steps": 5000})
    resumed = far_from_limit(1000, actors=2, envs_per_actor=1, send_steps=256, resumed_at=600)
    assert not resumed({})  # before the first report: the counts the run resumed from
    assert far_from_limit(10**6, 1, 8, 256)({"actor_steps": 10**6 - 600})
    assert not far_from_limit(10**6, 1, 8, 256)({"actor_steps": 10**6 - 576})


def test_the_queue_says_when_there_is_room():
    queue = StepQueue(make_spec(), max_steps=4, block_s=0.05)
    assert queue.wait_for_room(3) == 4 and queue.wait_for_room(10) == 4  # at most the bound
    queue.insert_batch(step_batch.stack([_item(first=True)] + [_item()] * 3))
    start = time.monotonic()
    assert queue.wait_for_room(1) == 0  # full: no room after the (short) wait
    assert time.monotonic() - start >= 0.04
    queue.take_batch(3)
    assert queue.wait_for_room(1) == 3
    queue.close()
    assert queue.wait_for_room(1) == -1


def test_a_held_back_batch_waits_for_room_by_a_small_call_not_by_travelling_again():
    """A full queue: the sender sends the rest of its batch once there is room for it,
    asking with `wait_for_room` meanwhile, instead of sending the batch every wait."""
    queue = StepQueue(make_spec(), max_steps=4, block_s=0.05)
    calls: list[str] = []

    class Recording:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(queue, name)

    sender = StepSender(Recording(), send_steps=6, send_secs=60.0, clock=Clock())
    drain = threading.Timer(0.3, lambda: queue.take_batch(4))
    drain.start()
    for i in range(6):
        sender.add(_item(first=i == 0))
    drain.join()
    assert calls.count("insert_batch") == 2 and calls.count("wait_for_room") >= 3
    assert queue.info()["inserted"] == 6 and sender.take_sent() == 5


class _Items:
    """A drain's source that always has steps: one endless episode, each take recorded."""

    def __init__(self):
        self.takes: list[int] = []
        self.name = "endless"

    def take(self, max_steps: int) -> list[dict]:
        first = not self.takes
        self.takes.append(max_steps)
        return [
            {"writer": 0, "first": first and i == 0, "last": False, "frame": FRAME}
            | {"action": 0, "reward": 0.0, "discount": 1.0}
            for i in range(max_steps)
        ]

    def hurry(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Counting:
    """A store that counts: each step completes one transition."""

    def add_first(self, writer, frame) -> None:
        pass

    def in_episode(self, writer) -> bool:
        return True

    def add(self, writer, *args, **kwargs) -> int:
        return 1

    def flush(self) -> None:
        pass


def test_a_drain_the_ratio_holds_back_takes_in_chunks_within_the_same_ratio():
    """With `min_take`, a drain the replay ratio holds back waits for room for that many
    (at most half the error buffer) instead of taking the two steps each sampled batch lets
    in, one remote call each; the ratio's rule is as before: never past its insert limit,
    and the learner never waits for data the ratio would let in."""
    schedule = ReplaySchedule(min_replay_size=10, actor_steps_per_update=2, batch_size=4)
    gate = RatioGate(schedule)  # an error buffer of 200 transitions
    source = _Items()
    drainer = StepDrainer(source, _Counting(), gate, max_take=256, min_take=256)
    drainer.start()
    try:
        for _ in range(400):  # the learner: 400 batches, each 2 ms after it is due
            assert gate.wait_to_sample()
            assert gate.inserted <= gate.insert_limit()
            time.sleep(0.002)
        time.sleep(0.2)
    finally:
        drainer.close()
    assert source.takes[0] == 210  # the first: min_replay_size + the error buffer
    later = source.takes[1:]  # 400 batches needed 808 transitions in: in a few takes
    assert all(take >= 100 for take in later) and sum(later) >= 808 - 210, later
    assert gate.inserted <= gate.insert_limit()


def test_the_send_bounds_are_config_keys_with_checked_values():
    assert (ReplaySettings().send_steps, ReplaySettings().send_secs) == (SEND_STEPS, SEND_SECS)
    with pytest.raises(ConfigError, match="send_steps"):
        ReplaySettings(send_steps=0)
    with pytest.raises(ConfigError, match="send_secs"):
        ReplaySettings(send_secs=-1.0)
    assert _store(send_steps=7, send_secs=0.25).send_bounds() == {
        "send_steps": 7,
        "send_secs": 0.25,
    }
    with pytest.raises(ValueError, match="send_steps >= 1"):
        StepSender(None, send_steps=0)
    # A one-writer adder of the store sends in batches too (its own sender).
    queue = StepQueue(make_spec(), max_steps=100)
    adder = _store(send_steps=3).make_adder(None, Remote(queue), 0)
    assert isinstance(adder, ServedFrameAdder)
    adder.add_first(dm_env.restart(OBSERVATION))
    adder.add(np.zeros(2, np.float32), dm_env.transition(np.float32(1.0), OBSERVATION))
    assert queue.info()["inserted"] == 0
    adder.add(np.zeros(2, np.float32), dm_env.transition(np.float32(1.0), OBSERVATION))
    assert queue.info()["inserted"] == 3


# -- parameters by reference ----------------------------------------------------------------


def test_the_learner_answers_one_object_per_version():
    from magi_lp.agent.learner import JaxLearner

    class Learner(JaxLearner):
        def variables(self, state):
            return {"w": state}

    batches = iter([{"b": np.float32(i)} for i in range(3)])
    update = jax.jit(lambda state, batch: (state + batch["b"], {}))
    learner = Learner(update, jnp.zeros(3), batches, prefetch=0)
    first = learner.get_variables(["w"])
    assert learner.get_variables(["w"]) is first  # no update: the same version
    assert learner.get_variables(("w",)) is first
    learner.step()
    again = learner.get_variables(["w"])
    assert again is not first and again[0] is learner.state
    assert learner.get_variables(["w"]) is again


class _FakeRay:
    """`ray.put` and `ray.get` as the node actor and its client use them, counted."""

    def __init__(self) -> None:
        self.puts: list = []

    def put(self, value):
        self.puts.append(value)
        return ("ref", len(self.puts) - 1)

    def get(self, value, timeout=None):
        if isinstance(value, tuple) and value[:1] == ("ref",):
            return self.puts[value[1]]
        return value


def test_a_shared_answer_is_put_once_per_version_and_fetched_by_reference(monkeypatch):
    pytest.importorskip("ray")  # the current stack's engine
    from magi_lp.engines import ray_nodes

    fake = _FakeRay()
    monkeypatch.setattr(ray_nodes.ray, "put", fake.put)
    monkeypatch.setattr(ray_nodes.ray, "get", fake.get)
    clock = Clock()
    monkeypatch.setattr(ray_nodes.time, "monotonic", clock)

    class Learner:
        def __init__(self) -> None:
            self.values = ["params v0"]
            self.asked = 0

        def get_variables(self, names):
            self.asked += 1
            return self.values

        def step(self):
            self.values = [f"params v{self.asked}"]

    node = ray_nodes._NodeActor.__new__(ray_nodes._NodeActor)
    node._node, node._shared, node._shared_lock = Learner(), {}, threading.Lock()

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, method, *args, **kwargs):
            return getattr(node, self.name)(method, *args, **kwargs)

    handle = type("Handle", (), {"call": Method("call"), "call_shared": Method("call_shared")})()
    clients = [ray_nodes.NodeClient(handle, ["get_variables", "replay_info"]) for _ in range(5)]
    answers = [client.get_variables(["policy"]) for client in clients]
    assert answers == [["params v0"]] * 5 and len(fake.puts) == 1  # five pulls, one put
    assert node._node.asked == 1  # within SHARED_FOR_S: not asked again
    clock.now += 2 * ray_nodes.SHARED_FOR_S
    assert clients[0].get_variables(["policy"]) == ["params v0"]
    assert node._node.asked == 2 and len(fake.puts) == 1  # the same object: its reference kept
    node._node.step()
    clock.now += 2 * ray_nodes.SHARED_FOR_S
    assert [c.get_variables(["policy"]) for c in clients] == [["params v2"]] * 5
    assert len(fake.puts) == 2  # a new version: one more put for all five
    assert "get_variables" in ray_nodes.SHARED_ANSWERS

    # Other methods are plain calls: answered in the reply, nothing put.
    node._node.replay_info = lambda: {"size": 1}
    assert clients[0].replay_info() == {"size": 1} and len(fake.puts) == 2


def test_counts_without_batched_adders_are_the_loops_own():
    """Evaluators and Reverb's adders write each step as it comes: the loop counts its steps
    as before (`sent_steps` says None)."""
    actor = BatchedActor(
        _core(), list(jax.random.split(jax.random.PRNGKey(0), 2)), None, [None] * 2
    )
    assert actor.take_sent_steps() is None
    counter = counting.Counter(time_delta=0.0)
    loop = ActingLoop([Pixels(50), Pixels(50)], actor, counter, count_every=3)
    for _ in range(3):
        loop.step()
    assert counter.get_counts()["steps"] == 6


# -- a call asked twice (its answer lost) moves its steps once --------------------------------


def _numbered(start: int, count: int) -> list[dict]:
    """Step items whose frames say their number (0 is an episode's first)."""
    return [
        {"first": np.bool_(i == 0), "frame": np.full((H, W, C), i % 251, np.uint8)}
        for i in range(start, start + count)
    ]


def _numbers(batch) -> list[int]:
    return [int(frame[0, 0, 0]) for frame in batch["frame"]]


def test_an_insert_asked_again_puts_its_steps_in_once():
    queue = StepQueue(make_spec(), max_steps=6)
    first, second = step_batch.stack(_numbered(0, 4)), step_batch.stack(_numbered(4, 5))
    assert queue.insert_batch(first, sender="a", offset=0) == 4
    assert queue.insert_batch(first, sender="a", offset=0) == 4  # its answer was lost
    assert queue.info()["size"] == 4
    assert queue.insert_batch(second, sender="a", offset=4, timeout=0.05) == 2  # full
    assert _numbers(queue.take_batch(3)) == [0, 1, 2]
    # The same call again (it took 2 of 5): the 2 count, the other 3 go in after them.
    assert queue.insert_batch(second, sender="a", offset=4) == 5
    assert _numbers(queue.take_batch(10)) == [3, 4, 5, 6, 7, 8]
    # Another sender's steps are its own; a sender's steps past what the queue has are refused.
    assert queue.insert_batch(first, sender="b", offset=0) == 4
    with pytest.raises(ValueError, match="took only 9 of its items"):
        queue.insert_batch(first, sender="a", offset=12)


def test_an_insert_asked_again_while_the_first_waits_for_room_puts_its_steps_in_once():
    queue = StepQueue(make_spec(), max_steps=4, block_s=5.0)
    queue.insert_batch(step_batch.stack(_numbered(0, 4)), sender="a", offset=0)
    batch = step_batch.stack(_numbered(4, 3))
    answers = []
    calls = [
        threading.Thread(
            target=lambda: answers.append(queue.insert_batch(batch, 5.0, sender="a", offset=4))
        )
        for _ in range(2)
    ]
    for call in calls:
        call.start()
        time.sleep(0.1)  # the first waits for room, then the second (its answer was lost)
    taken = _numbers(queue.take_batch(4))
    for call in calls:
        call.join(10)
    taken += _numbers(queue.take_batch(10, 0.05))
    assert answers == [3, 3] and taken == list(range(7))


def test_a_take_asked_again_is_answered_the_same_steps():
    queue = StepQueue(make_spec(), max_steps=20)
    queue.insert_batch(step_batch.stack(_numbered(0, 6)))
    assert _numbers(queue.take_batch(4, taker="d", ask=1)) == [0, 1, 2, 3]
    assert _numbers(queue.take_batch(4, taker="d", ask=1)) == [0, 1, 2, 3]  # answer lost
    assert _numbers(queue.take_batch(4, taker="d", ask=2)) == [4, 5]
    # Asked again while the first asking still waits for steps: both get the same ones.
    answers = []
    takes = [
        threading.Thread(
            target=lambda: answers.append(_numbers(queue.take_batch(9, 5.0, taker="d", ask=3)))
        )
        for _ in range(2)
    ]
    for take in takes:
        take.start()
        time.sleep(0.1)
    queue.insert_batch(step_batch.stack(_numbered(6, 3)))
    for take in takes:
        take.join(10)
    assert answers == [[6, 7, 8], [6, 7, 8]]
    queue.insert_batch(step_batch.stack(_numbered(9, 1)))
    assert _numbers(queue.take_batch(9, taker="d", ask=4)) == [9]  # nothing lost, nothing twice
    with pytest.raises(ValueError, match="ask number counts from 1"):
        queue.take_batch(1, taker="d", ask=0)


def test_steps_cross_a_lost_answer_once_each_way_through_the_ray_client(monkeypatch):
    """The real sender, queue, drain source and Ray node client: Ray says the replay node is
    unreachable after it ran an insert and after it ran a take (a blip: "may or may not have
    been executed"); the client asks again, and every step reaches the drain once, in order."""
    pytest.importorskip("ray")  # the current stack's engine
    from magi_lp.replay.step_queue import ServedStepSource
    from tests.ray_blips import lossy_client

    queue = StepQueue(make_spec(), max_steps=100)
    client, made = lossy_client(
        monkeypatch,
        queue,
        ["insert_batch", "wait_for_room", "take_batch"],
        {"insert_batch": {2}, "take_batch": {1}},  # the calls whose answers Ray loses
    )
    sender = StepSender(client, send_steps=4, send_secs=10.0, clock=Clock())
    for item in _numbered(0, 12):
        sender.add(item)
    source = ServedStepSource(client, timeout_s=0.05)
    got = []
    while len(got) < 12 and (steps := source.take(5)):
        got += [int(step["frame"][0, 0, 0]) for step in steps]
    assert got == list(range(12)) and queue.info()["size"] == 0
    assert made == {"insert_batch": 4, "take_batch": 4}  # a lost answer each way, asked again
