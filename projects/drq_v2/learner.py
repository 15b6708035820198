"""`DrQLearner`: the Acme-style learner around DrQ-v2's jitted update (`learning.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from acme import core

from projects.drq_v2.learning import (
    TrainingState,
    init_training_state,
    make_update_fn,
    policy_params,
)
from projects.drq_v2.networks import DrQNetworks


class DrQLearner(core.Learner):
    """Acme `Learner` over the jitted update: pulls a batch, updates, logs, counts.

    Variables by name: 'policy' -> {'encoder', 'actor'} (what actors pull), 'encoder',
    'actor', 'critic', 'params' -> all three.
    """

    def __init__(
        self,
        networks: DrQNetworks,
        config: ml_collections.ConfigDict,
        iterator: Iterator[Any],
        key: jax.Array,
        obs_example: Any,
        counter: Any | None = None,
        logger: Any | None = None,
    ):
        self._update = make_update_fn(networks, config)
        self._iterator = iterator
        self._state = init_training_state(networks, config, key, obs_example)
        self._counter = counter
        self._logger = logger
        self._timestamp: float | None = None

    def step(self) -> None:
        batch = next(self._iterator)
        # The replay may wrap transitions in a ReplaySample(info, data).
        batch = getattr(batch, "data", batch)
        self._state, metrics = self._update(self._state, batch)
        now = time.time()
        elapsed = 0.0 if self._timestamp is None else now - self._timestamp
        self._timestamp = now
        # The runners hand the learner a counter prefixed "learner": these become the
        # program's `learner_steps` and `learner_walltime`.
        counts = (
            self._counter.increment(steps=1, walltime=elapsed) if self._counter is not None else {}
        )
        if self._logger is not None:
            self._logger.write({**jax.device_get(metrics), **counts})

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        params = self._state.params
        variables = {
            "policy": policy_params(self._state),
            "encoder": params["encoder"],
            "actor": params["actor"],
            "critic": params["critic"],
            "params": params,
        }
        return [variables[name] for name in names]

    def save(self) -> TrainingState:
        return self._state

    def restore(self, state: TrainingState) -> None:
        self._state = state

    @property
    def state(self) -> TrainingState:
        return self._state

    @property
    def num_updates(self) -> int:
        return int(np.asarray(self._state.steps))
