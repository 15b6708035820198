"""Batches put on the learner's device ahead of the update that needs them.

A jitted update on a GPU takes milliseconds; if the learner pulls a batch from the replay
iterator and copies it to the device only when the update asks for it, sampling, the copy
and the update run one after the other. `DevicePrefetcher` pulls and copies on a background
thread, keeping up to `size` batches on the device, so the update finds its batch there
whenever sampling keeps up, and the wait it does see says how data-bound the learner is.
"""

from __future__ import annotations

import collections.abc
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
from absl import logging

_END = object()  # the source iterator is exhausted


class _Failure:
    """An exception raised by the source iterator, delivered to the consumer in order."""

    def __init__(self, error: BaseException):
        self.error = error


def replay_data(batch: Any) -> Any:
    """A `reverb.ReplaySample(info, data)`'s data; anything else as it is."""
    if hasattr(batch, "info") and hasattr(batch, "data"):
        return batch.data
    return batch


class DevicePrefetcher(collections.abc.Iterator):
    """Iterates over `iterator`'s batches, each already put on the device.

    The background thread starts on the first `next()`, so nothing is sampled before the
    learner wants its first batch. It keeps at most `size` batches ready (on the device)
    plus the one it is preparing. An exception of the source iterator is raised by the
    `next()` that would have returned the batch; its end ends this iterator.
    """

    def __init__(
        self,
        iterator: Iterator[Any],
        *,
        size: int = 2,
        put: Callable[[Any], Any] = jax.device_put,
    ):
        """Creates the prefetcher.

        Args:
          iterator: the source of batches (numpy pytrees, or `reverb.ReplaySample`s whose
            `data` is kept).
          size: batches kept ready on the device (>= 1).
          put: puts a batch where the update runs; the default device by default (a data-
            parallel learner passes one that shards the batch over its devices).
        """
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._iterator = iterator
        self._put = put
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._done = False
        self.wait_seconds = 0.0
        """Seconds `next()` has spent waiting for a batch, in all."""
        self.last_wait_seconds = 0.0
        """Seconds the latest `next()` waited."""

    def _fill(self) -> None:
        try:
            for index, batch in enumerate(self._iterator):
                item = self._put(replay_data(batch))
                if index == 0:
                    logging.info("DevicePrefetcher: first batch sampled and on the device")
                if not self._offer(item):
                    return
            self._offer(_END)
        except BaseException as error:  # delivered to the consumer
            self._offer(_Failure(error))

    def _offer(self, item: Any) -> bool:
        """Queues `item`, waiting for room; False once `close()` was called."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._fill, name="magi_lp-device-prefetch", daemon=True
            )
            self._thread.start()
        start = time.perf_counter()
        item = self._queue.get()
        self.last_wait_seconds = time.perf_counter() - start
        self.wait_seconds += self.last_wait_seconds
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stops the background thread after the batch it is preparing."""
        self._stop.set()
        self._done = True
