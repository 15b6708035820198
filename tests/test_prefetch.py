"""DevicePrefetcher: batches on the device, in order, ahead of the consumer but bounded, and
the learner's log of how long each step waited for its batch."""

from __future__ import annotations

import collections
import threading
import time

import jax
import numpy as np
import pytest
from acme.utils import loggers

from magi_lp.agent.learner import JaxLearner
from magi_lp.agent.prefetch import DevicePrefetcher


class CountingSource:
    """Batches 0, 1, 2, ... (optionally `length` of them); counts how many were taken."""

    def __init__(self, length: int | None = None, fail_at: int | None = None):
        self.taken = 0
        self._length = length
        self._fail_at = fail_at

    def __iter__(self):
        return self

    def __next__(self):
        if self._fail_at is not None and self.taken == self._fail_at:
            raise RuntimeError("replay went away")
        if self._length is not None and self.taken >= self._length:
            raise StopIteration
        batch = {"x": np.full((2, 3), self.taken, np.float32)}
        self.taken += 1
        return batch


def _wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_batches_arrive_in_order_on_the_device_and_replay_samples_are_unwrapped():
    ReplaySample = collections.namedtuple("ReplaySample", ["info", "data"])
    source = (ReplaySample(info={"key": np.uint64(i)}, data={"x": np.full(3, i)}) for i in range(5))
    prefetcher = DevicePrefetcher(source, size=2)
    values = []
    for batch in prefetcher:
        assert set(batch) == {"x"}  # the info stays behind
        assert isinstance(batch["x"], jax.Array)
        values.append(int(batch["x"][0]))
    assert values == [0, 1, 2, 3, 4]
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_nothing_is_taken_before_the_first_next_and_at_most_size_plus_one_after():
    source = CountingSource()
    prefetcher = DevicePrefetcher(source, size=3)
    time.sleep(0.2)
    assert source.taken == 0  # lazily started: no sampling before learning wants a batch
    assert int(next(prefetcher)["x"][0, 0]) == 0
    # 3 ready batches, plus one taken and waiting for room: then the thread blocks.
    _wait_until(lambda: source.taken == 1 + 3 + 1)
    time.sleep(0.2)
    assert source.taken == 5
    prefetcher.close()


def test_a_source_error_is_raised_by_the_next_that_would_return_its_batch():
    prefetcher = DevicePrefetcher(CountingSource(fail_at=2), size=2)
    assert int(next(prefetcher)["x"][0, 0]) == 0
    assert int(next(prefetcher)["x"][0, 0]) == 1
    with pytest.raises(RuntimeError, match="replay went away"):
        next(prefetcher)
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_waiting_for_a_slow_source_is_measured():
    release = threading.Event()

    def source():
        release.wait()
        yield {"x": np.zeros(1)}

    prefetcher = DevicePrefetcher(source(), size=1)
    threading.Timer(0.3, release.set).start()
    next(prefetcher)
    assert prefetcher.last_wait_seconds >= 0.25
    assert prefetcher.wait_seconds == prefetcher.last_wait_seconds
    with pytest.raises(ValueError, match="size"):
        DevicePrefetcher(iter([]), size=0)


class SumLearner(JaxLearner):
    """A JaxLearner whose state is the sum of the batches it saw."""

    def variables(self, state):
        return {"total": state}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_learner_logs_how_long_each_step_waited_for_its_batch(prefetch):
    rows = []

    class Rows(loggers.Logger):
        def write(self, data):
            rows.append(data)

        def close(self):
            pass

    update = jax.jit(lambda state, batch: (state + batch["x"].sum(), {"sum": batch["x"].sum()}))
    learner = SumLearner(
        update,
        np.float32(0.0),
        CountingSource(length=4),
        logger=Rows(),
        prefetch=prefetch,
    )
    for _ in range(4):
        learner.step()
    assert float(learner.get_variables(["total"])[0]) == 6 * (0 + 1 + 2 + 3)
    assert [float(row["sum"]) for row in rows] == [0.0, 6.0, 12.0, 18.0]
    for row in rows:
        assert row["batch_wait_ms"] >= 0.0
        assert 0.0 <= row["batch_wait_fraction"] <= 1.0
