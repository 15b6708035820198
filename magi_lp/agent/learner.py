"""Learners: what the runners drive (`Learner`), and a base for a jitted update (`JaxLearner`).

A magi_lp learner is Acme's `core.Learner` (`step()`, `get_variables(names)`) plus its whole
training state as a pytree (`save()` / `restore(state)`), so that the toolkit, not the agent,
owns checkpointing.

Most agents are one jitted `update(state, batch) -> (state, metrics)`. `JaxLearner` is the
part of such a learner that is the same for every agent: pull a batch, update, count the
step, log the metrics; restore with a structure check. An agent subclasses it and says which
variables actors may pull (`variables(state)`). When the process sees several devices, the
update runs data-parallel over all of them (`magi_lp.agent.data_parallel`), with no agent code.
"""

from __future__ import annotations

import abc
import collections
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
from absl import logging

from magi_lp import console
from magi_lp.acme_api import core, counting, loggers
from magi_lp.agent import data_parallel
from magi_lp.agent.contract import check_pair
from magi_lp.agent.device_check import DeviceCheck
from magi_lp.agent.prefetch import DevicePrefetcher, replay_data
from magi_lp.agent.variable_client import call_in_background

State = TypeVar("State")
UpdateFn = Callable[[Any, Any], tuple[Any, Mapping[str, Any]]]


MAX_UPDATES_IN_FLIGHT = 2
"""Updates dispatched but not finished before `step()` waits for the oldest."""


def _compile(update: UpdateFn, state: Any, example_batch: Any) -> Any:
    start = time.monotonic()
    compiled = update.lower(state, example_batch).compile()
    logging.info("JaxLearner: update compiled ahead in %.1f s", time.monotonic() - start)
    return compiled


def _with_sharding(tree: Any, sharding: Any) -> Any:
    """Shapes (arrays or ShapeDtypeStructs) as ShapeDtypeStructs placed by `sharding`."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
    )


class Learner(core.Learner):
    """A learner the runners can drive, checkpoint and serve parameters from."""

    @abc.abstractmethod
    def save(self) -> Any:
        """Returns the full training state as a pytree of arrays.

        Called after every step: the runner keeps each whole step's state for its next
        checkpoint, so return the arrays themselves, not copies (and an update that donates
        its input state would delete what the runner keeps)."""

    @abc.abstractmethod
    def restore(self, state: Any) -> None:
        """Replaces the training state with one returned by `save()`."""


class JaxLearner(Learner, Generic[State]):
    """A learner around one jitted `update(state, batch) -> (new state, metrics)`.

    Each `step()` takes the next batch (a `reverb.ReplaySample` is unwrapped to its data),
    dispatches the update, counts one step (and the seconds since the previous one as
    `walltime`) and logs the metrics together with the counts and how long the step waited
    for its batch: `batch_wait_ms`, and `batch_wait_fraction` of the time since the previous
    step (near 0: update-bound; near 1: data-bound). `step()` returns once the update is
    dispatched, with at most `MAX_UPDATES_IN_FLIGHT` unfinished: metrics stay on the device
    until a log row that is kept reads them.

    Devices: with one device the update runs as given. A process that sees several devices
    of JAX's default backend (the plan's `gpus: n` or `cpu_devices: n`) runs it
    data-parallel over all of them (`data_parallel`): the state is replicated, each batch
    split, and the prefetcher puts batches on the devices already split.
    """

    def __init__(
        self,
        update: UpdateFn,
        state: State | Callable[[], State],
        iterator: Iterator[Any],
        *,
        counter: counting.Counter | None = None,
        logger: loggers.Logger | None = None,
        prefetch: int = 2,
        example_batch: Any = None,
    ):
        """Creates the learner.

        Args:
          update: the agent's update, already jitted.
          state: the initial training state (a pytree of arrays), or a function that makes
            it: then, with `example_batch`, the update compiles while the state is made.
          iterator: training batches.
          counter: counts `steps` and `walltime`.
          logger: gets one row of metrics and counts per step.
          prefetch: batches a background thread keeps ready on the learner's device
            (`magi_lp.agent.prefetch.DevicePrefetcher`), so sampling and the copy overlap
            the update; 0 pulls each batch when the update needs it. Ignored for an
            iterator whose batches are already on the device (`on_device = True`).
          example_batch: optional pytree of `jax.ShapeDtypeStruct` shaped exactly like the
            batches: the update is compiled ahead, on a background thread, while the
            replay is still filling (the first `step()` waits for it).
        """
        self.data_parallel = data_parallel.local_data_parallel("learner")
        if self.data_parallel is not None:
            update = self.data_parallel.wrap(update)
            console.say(self.data_parallel.describe(), source="learner")
        self._compiling = None
        # Compiling ahead needs the batch's placement; a data-parallel update compiles at
        # its first call, with the split batch it is given.
        # A replay on the learner's device hands out batches committed to it (jit outputs),
        # unlike host batches. JAX 0.4.30 reuses a program compiled ahead with `lower()`
        # for uncommitted arguments only, so such a learner compiles for the placement of
        # its state and batches and calls that compiled program itself.
        batch_sharding = getattr(iterator, "batch_sharding", None)
        self._committed = batch_sharding is not None and self.data_parallel is None
        self._device = jax.local_devices()[0]
        self._compiled: Any = None
        if example_batch is not None and self.data_parallel is None:
            state_shape = jax.eval_shape(state) if callable(state) else state
            if self._committed:
                state_shape = _with_sharding(
                    state_shape, jax.sharding.SingleDeviceSharding(self._device)
                )
                example_batch = _with_sharding(example_batch, batch_sharding)
            self._compiling = call_in_background(
                functools.partial(_compile, update, state_shape, example_batch)
            )
        self._update = update
        state = state() if callable(state) else state
        if self.data_parallel is not None:
            state = self.data_parallel.put_state(state)
        elif self._committed:
            # Committed from the start, as every update's output is: one program serves all.
            state = jax.device_put(state, self._device)
        self._state = state
        put = jax.device_put if self.data_parallel is None else self.data_parallel.put_batch
        # A replay on the learner's own device (magi_lp.replay.frame_store) hands out batches
        # already there, split as the update wants them: nothing to copy or prefetch.
        if getattr(iterator, "on_device", False):
            prefetch = 0
        self.prefetch_depth = prefetch
        """Batches kept ready on the device ahead of the update (0: none)."""
        self._iterator = (
            DevicePrefetcher(iterator, size=prefetch, put=put) if prefetch else iterator
        )
        self._step_end: float | None = None
        self._in_flight: collections.deque = collections.deque()
        self._counter = counter or counting.Counter()
        self._logger = logger or loggers.NoOpLogger()
        self._timestamp: float | None = None
        self._device_check: DeviceCheck | None = None
        self._served: tuple[Any, tuple[str, ...], list[Any]] | None = None  # get_variables'

    def check_devices(self, node: str = "learner") -> None:
        """Turns on device-check mode (`config.debug.check_devices`): every update checks
        that the state, the metrics and device batches live on all of this process's
        devices, and that host batches are numpy (`magi_lp.agent.device_check`)."""
        self._device_check = DeviceCheck.for_node(node, all_devices=True)

    def compiled_update(self, example_batch: Any) -> Any:
        """The update compiled for this learner's state and `example_batch` (a pytree of
        `jax.ShapeDtypeStruct`) on its first device, without running it: what the GPU
        memory reckoning reads XLA's memory analysis from (`magi_lp.runtime.program_memory`).
        The program compiled ahead at construction is reused when it is for the same batch."""
        compiling, self._compiling = self._compiling, None
        if compiling is not None and compiling.exception() is None:
            compiled = compiling.result()
            try:
                ahead = [a.shape for a in jax.tree_util.tree_leaves(compiled.args_info[0][1])]
            except (AttributeError, IndexError, TypeError):  # another jax's layout
                ahead = None
            if ahead == [a.shape for a in jax.tree_util.tree_leaves(example_batch)]:
                return compiled
        return _compile(self._update, self._state, example_batch)

    @abc.abstractmethod
    def variables(self, state: State) -> Mapping[str, Any]:
        """The variable collections actors and evaluators may pull, by name."""

    def step(self) -> None:
        start = time.perf_counter()
        batch = replay_data(next(self._iterator))
        waited = time.perf_counter() - start
        if self._compiling is not None:  # the first batch came while compiling ahead
            compiling, self._compiling = self._compiling, None
            if compiling.exception() is not None:  # then the call compiles
                logging.warning("Compiling the update ahead failed: %s", compiling.exception())
            elif self._committed:
                self._compiled = compiling.result()
        check = self._device_check
        if check is not None:
            check.check("update input state", self._state)
            check.check("update input batch", batch, host_ok=True)
        result = self._call_update(batch)
        check_pair(result, f"{type(self).__name__}'s update", "new state", "metrics")
        self._state, metrics = result
        if check is not None:
            check.check("update output state", self._state)
            check.check("update output metrics", metrics)
        now = time.time()
        elapsed = 0.0 if self._timestamp is None else now - self._timestamp
        self._timestamp = now
        counts = self._counter.increment(steps=1, walltime=elapsed)
        # The update runs asynchronously: the caller (in one process, the acting loop) goes
        # on while the device works. At most `MAX_UPDATES_IN_FLIGHT` are queued, so batches
        # never pile up on the device; metrics are read only by the log rows that are kept.
        self._in_flight.append(metrics)
        if len(self._in_flight) > MAX_UPDATES_IN_FLIGHT:
            jax.block_until_ready(self._in_flight.popleft())
        end = time.perf_counter()
        step_s = end - (start if self._step_end is None else self._step_end)
        self._step_end = end
        waiting = {"batch_wait_ms": 1e3 * waited, "batch_wait_fraction": waited / step_s}
        self._logger.write({**metrics, **counts, **waiting})

    def _call_update(self, batch: Any) -> tuple[Any, Any]:
        if self._compiled is not None:
            try:
                return self._compiled(self._state, batch)
            except (TypeError, ValueError) as error:  # placed otherwise: let jit compile
                logging.warning("Update compiled ahead does not fit this batch: %s", error)
                self._compiled = None
        return self._update(self._state, batch)

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """The variables `names` of the current state. Asked again before the next update,
        it answers the same list object: an engine that shares answers (Ray's
        `magi_lp.engines.ray_nodes`) then serializes one version once for every actor."""
        state, names = self._state, tuple(names)
        served = self._served
        if served is not None and served[0] is state and served[1] == names:
            return served[2]
        variables = self.variables(state)
        missing = [name for name in names if name not in variables]
        if missing:
            raise KeyError(f"no variables {missing}; this learner serves {sorted(variables)}")
        values = [variables[name] for name in names]
        self._served = (state, names, values)
        return values

    def save(self) -> State:
        return self._state

    def restore(self, state: State) -> None:
        leaves, treedef = jax.tree_util.tree_flatten(state)
        expected = jax.tree_util.tree_structure(self._state)
        if treedef != expected:
            raise ValueError(
                f"{type(self).__name__}.restore got a state shaped unlike save()'s: "
                f"{treedef} != {expected}; restore with save()'s output as the target."
            )
        # Device arrays again: a checkpointer may hand back numpy leaves.
        state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(x) for x in leaves])
        if self.data_parallel is not None:
            state = self.data_parallel.put_state(state)
        elif self._committed:
            state = jax.device_put(state, self._device)  # as __init__ placed it
        self._state = state

    @property
    def state(self) -> State:
        """The current training state."""
        return self._state
