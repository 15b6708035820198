"""A variable client that keeps actors' parameters fresh without ever blocking acting.

Actors ask the learner (in-process, or through a Courier handle in another process) for
parameters every `update_period` calls to `update()`. The request runs on a background
thread; acting continues with the old parameters until the new ones arrive. Only the very
first fetch blocks, because an actor cannot act without parameters.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from absl import logging

from magi_lp.agent.builder import VariableSource


class VariableClient:
    """Pulls named variables from a `VariableSource`, asynchronously after the first fetch."""

    def __init__(
        self,
        source: VariableSource,
        names: Sequence[str] | str,
        update_period: int = 1,
    ):
        """Creates the client.

        Args:
          source: the learner, or a Courier handle to it.
          names: one collection name, or several; `params` then holds one value or a list.
          update_period: calls to `update()` between two fetches (>= 1).
        """
        if update_period < 1:
            raise ValueError(f"update_period must be >= 1, got {update_period}")
        self._source = source
        self._single = isinstance(names, str)
        self._names = [names] if self._single else list(names)
        self._update_period = update_period
        self._calls = 0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._future: concurrent.futures.Future | None = None
        self._params: Any = None

    @property
    def params(self) -> Any:
        """The latest parameters; fetches them (blocking) the first time."""
        if self._params is None:
            self.update_and_wait()
        return self._params

    def _fetch(self) -> Any:
        values = self._source.get_variables(self._names)
        return values[0] if self._single else list(values)

    def update(self, wait: bool = False) -> None:
        """Counts a call; every `update_period` calls starts a background fetch.

        Never blocks unless `wait` is set: a fetch still in flight is simply left to finish,
        and its result is installed on a later call.
        """
        if wait:
            self.update_and_wait()
            return
        self._calls += 1
        if self._future is not None and self._future.done():
            try:
                self._params = self._future.result()
            except Exception as error:  # a failed pull must not stop acting
                logging.warning("Parameter fetch failed, keeping old parameters: %s", error)
            self._future = None
        if self._calls >= self._update_period and self._future is None:
            self._calls = 0
            self._future = self._executor.submit(self._fetch)

    def update_and_wait(self) -> None:
        """Fetches parameters now and blocks until they are installed."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
        self._params = self._fetch()
        self._calls = 0

    def close(self) -> None:
        """Stops the background thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)
