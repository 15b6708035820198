"""A host-memory n-step transition replay: what a state-based agent (TD3) learns from in one
process without Reverb (Python 3.12 and current JAX, or replay.store=device).

The data is what Acme's `NStepTransitionAdder` writes into Reverb, so the agent's learner
reads the same batch either way (`acme.types.Transition`, each field batched on axis 0):

    observation       the observation at t
    action            the action taken at t
    reward            R = r_t + g d_t r_{t+1} + ... + g^(m-1) d_t...d_{t+m-2} r_{t+m-1}
    discount          D = g^(m-1) d_t ... d_{t+m-1}   (the learner applies g once more)
    next_observation  the observation at t+m
    extras            the extras given with the action at t

with m = n, or fewer steps where the episode ends first. One difference: Acme also writes
the shorter transitions (s_0 -> s_1), ..., (s_0 -> s_{n-1}) at the start of an episode;
this replay writes each (s_t, a_t) once.

Storage is one preallocated NumPy array per field and leaf (FIFO over `capacity`
transitions), sampled uniformly with replacement; sampling a batch is a gather on the host.
"""

from __future__ import annotations

import collections
from typing import Any

import dm_env
import numpy as np
import tree

from magi_lp.acme_api import adders, specs, types
from magi_lp.replay.spec import TransitionReplaySpec


def _zeros(spec: specs.Array, capacity: int) -> np.ndarray:
    return np.zeros((capacity, *spec.shape), dtype=spec.dtype)


class TransitionReplay:
    """n-step transitions in host memory: FIFO inserts, uniform batches, save and restore."""

    def __init__(
        self,
        spec: TransitionReplaySpec,
        environment_spec: specs.EnvironmentSpec,
        *,
        extras_spec: Any = (),
        seed: int = 0,
    ):
        self.spec = spec
        capacity = int(spec.capacity)
        scalar = specs.Array((), np.float32)
        self._data = types.Transition(
            observation=tree.map_structure(
                lambda s: _zeros(s, capacity), environment_spec.observations
            ),
            action=tree.map_structure(lambda s: _zeros(s, capacity), environment_spec.actions),
            reward=_zeros(scalar, capacity),
            discount=_zeros(scalar, capacity),
            next_observation=tree.map_structure(
                lambda s: _zeros(s, capacity), environment_spec.observations
            ),
            extras=tree.map_structure(lambda s: _zeros(s, capacity), extras_spec),
        )
        self._seed = int(seed)
        self._rng = np.random.default_rng(seed)
        self.inserted = 0
        self.sampled_batches = 0

    @property
    def size(self) -> int:
        """Transitions held now."""
        return min(self.inserted, int(self.spec.capacity))

    def ready(self, min_size: int = 1) -> bool:
        """Whether it holds `min_size` transitions (at least one batch's worth of rows)."""
        return self.size >= max(1, min_size)

    def insert(self, transition: types.Transition) -> None:
        """Writes one transition over the oldest (FIFO)."""
        row = self.inserted % int(self.spec.capacity)

        def write(column: np.ndarray, value: Any) -> None:
            column[row] = value

        tree.map_structure(write, self._data, transition)
        self.inserted += 1

    def sample(self) -> types.Transition:
        """A uniform batch (with replacement) of `spec.batch_size` transitions."""
        if self.size == 0:
            raise RuntimeError("sample() from an empty TransitionReplay")
        rows = self._rng.integers(0, self.size, size=int(self.spec.batch_size))
        self.sampled_batches += 1
        return tree.map_structure(lambda column: column[rows], self._data)

    def save(self) -> dict[str, Any]:
        """The whole replay as arrays (all rows, so that the shapes never change)."""
        return {
            "data": self._data._asdict(),
            "counts": np.asarray([self.inserted, self.sampled_batches], np.int64),
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Takes back what `save` gave (same spec and environment); sampling goes on from a
        generator seeded by the seed and the restored counts."""

        def copy(column: np.ndarray, value: Any) -> None:
            column[...] = np.asarray(value)

        tree.map_structure(copy, self._data._asdict(), dict(saved["data"]))
        self.inserted, self.sampled_batches = (int(v) for v in np.asarray(saved["counts"]))
        self._rng = np.random.default_rng([self._seed, self.inserted, self.sampled_batches])


class TransitionAdder(adders.Adder):
    """An Acme adder that turns one environment's steps into n-step transitions.

    `add_first` opens an episode, `add` takes each action and the step it led to; a
    transition is written once n steps follow its first observation, and at the episode's
    end every remaining shorter one is (see the module docstring for the arithmetic).
    """

    def __init__(self, replay: TransitionReplay, n_step: int, discount: float):
        if n_step < 1:
            raise ValueError("n_step must be >= 1")
        self._replay = replay
        self._n = int(n_step)
        self._g = np.float32(discount)
        self._observation: Any = None  # the window's first observation
        self._window: collections.deque = collections.deque()

    def reset(self) -> None:
        self._observation = None
        self._window.clear()

    def add_first(self, timestep: dm_env.TimeStep) -> None:
        if not timestep.first():
            raise ValueError("add_first needs the first step of an episode")
        self.reset()
        self._observation = timestep.observation

    def add(
        self,
        action: types.NestedArray,
        next_timestep: dm_env.TimeStep,
        extras: types.NestedArray = (),
    ) -> None:
        if self._observation is None and not self._window:
            raise ValueError("add before add_first")
        self._window.append((action, next_timestep, extras))
        if len(self._window) == self._n:
            self._write_oldest()
        if next_timestep.last():
            while self._window:
                self._write_oldest()
            self.reset()

    def _write_oldest(self) -> None:
        """Writes the transition from the window's first observation over all its steps."""
        reward = np.float32(0.0)
        discount = np.float32(1.0)
        for k, (_, step, _) in enumerate(self._window):
            if k:
                discount *= self._g
            reward += discount * np.float32(step.reward)
            discount *= np.float32(step.discount)
        arrival = self._window[-1][1].observation
        action, first_step, extras = self._window.popleft()
        self._replay.insert(
            types.Transition(
                observation=self._observation,
                action=action,
                reward=reward,
                discount=discount,
                next_observation=arrival,
                extras=extras,
            )
        )
        self._observation = first_step.observation
