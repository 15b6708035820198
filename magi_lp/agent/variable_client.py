"""A variable client that keeps actors' parameters fresh without ever blocking acting.

Actors ask the learner (in-process, or through a Courier handle in another process) for
parameters every `update_period` calls to `update()`. The request runs on a background
thread; acting continues with the old parameters until the new ones arrive. Only the very
first fetch blocks, because an actor cannot act without parameters. Fetched values are put on
this process's default device once per pull (a Courier pull returns numpy arrays, which a
jitted policy would otherwise copy to the device at every step).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import logging


def call_in_background(function: Callable[[], Any]) -> concurrent.futures.Future:
    """Runs `function` on a daemon thread; its result or exception arrives in the future.

    A daemon thread, not a `ThreadPoolExecutor`: the interpreter joins executor threads at
    exit, and a call to a server that is already gone (a Courier RPC to a stopped node)
    may never return, which would hang the process's exit.
    """
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(function())
        except BaseException as error:  # delivered to whoever reads the future
            future.set_exception(error)

    threading.Thread(target=run, name="magi_lp-background-call", daemon=True).start()
    return future


class VariableClient:
    """Pulls named variables from a `VariableSource`, asynchronously after the first fetch."""

    def __init__(
        self,
        source: Any,
        names: Sequence[str] | str,
        update_period: int = 1,
    ):
        """Creates the client.

        Args:
          source: a `VariableSource`: the learner, or a Courier handle to it.
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
        self._future: concurrent.futures.Future | None = None
        self._params: Any = None
        self._fetched = False

    @property
    def params(self) -> Any:
        """The latest parameters; fetches them (blocking) the first time, or waits for the
        fetch `request()` started."""
        if self._params is None:
            if self._future is not None:
                future, self._future = self._future, None
                self._params = future.result()
            else:
                self.update_and_wait()
        return self._params

    def request(self) -> None:
        """Starts a background fetch now unless one is in flight (e.g. the first one, while
        the actor compiles its policy); `params` or a later `update()` installs it."""
        if self._future is None:
            self._future = call_in_background(self._fetch)

    def _fetch(self) -> Any:
        values = list(self._source.get_variables(self._names))
        if jax.local_device_count() > 1:
            # On this process's first device, explicitly: in one process the learner's
            # arrays may be replicated over several devices (a data-parallel learner), and a
            # policy given those would run on all of them.
            values = jax.device_put(values, jax.local_devices()[0])
        else:
            # Uncommitted, as the policy's warm-up compiled it (`GenericActor.warm_up`): a
            # committed placement would be another jit cache entry, another compile.
            values = jax.device_put(values)
        if not self._fetched:
            self._fetched = True
            logging.info("VariableClient: first parameters fetched (%s)", ", ".join(self._names))
        return values[0] if self._single else values

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
            self._future = call_in_background(self._fetch)

    def update_and_wait(self) -> None:
        """Fetches parameters now and blocks until they are installed."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
        self._params = self._fetch()
        self._calls = 0

    def close(self) -> None:
        """Forgets a fetch still in flight (its daemon thread ends with the call)."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
