"""The actor-environment loop, with a stop check on every step.

Acme's `EnvironmentLoop` only checks for termination between episodes; inside a Launchpad
node that makes a stop wait for the rest of an episode (seconds with pixel rendering). This
loop checks `should_stop()` before every step, counts steps through an Acme counter (so the
coordinator sees them), and logs one row per episode with return, length and frames/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import dm_env
import numpy as np
from acme import core
from acme.utils import counting, loggers


class ActingLoop:
    """Runs episodes of `actor` in `environment`."""

    def __init__(
        self,
        environment: dm_env.Environment,
        actor: core.Actor,
        counter: counting.Counter | None = None,
        logger: loggers.Logger | None = None,
        *,
        should_update: bool = True,
        frames_per_step: int = 1,
        observers: Sequence[Any] = (),
    ):
        """Creates the loop.

        Args:
          environment: the (seeded) environment.
          actor: the actor; `update()` is called after every step when `should_update`.
          counter: counts `steps` and `episodes`; give it a child counter with a prefix
            (`Counter(parent, prefix="actor")`) so the program sees `actor_steps`.
          logger: gets one row per episode.
          should_update: whether to let the actor refresh parameters after each step.
          frames_per_step: environment frames per agent step (action repeat), so logs can
            report frames as papers do.
          observers: objects with `observe_first(timestep)`, `observe(timestep, action)` and
            `episode_done(episode_return)`; e.g. a video recorder.
        """
        self._environment = environment
        self._actor = actor
        self._counter = counter or counting.Counter()
        self._logger = logger or loggers.NoOpLogger()
        self._should_update = should_update
        self._frames_per_step = frames_per_step
        self._observers = list(observers)

    def close(self) -> None:
        """Closes the logger and the environment (in-process runs; nodes just exit)."""
        self._logger.close()
        self._environment.close()

    @property
    def actor(self) -> core.Actor:
        """The actor this loop drives."""
        return self._actor

    def run_episode(self, should_stop: Callable[[], bool] = lambda: False) -> dict | None:
        """Runs one episode; returns its log row, or None when stopped part-way."""
        start = time.monotonic()
        timestep = self._environment.reset()
        self._actor.observe_first(timestep)
        for observer in self._observers:
            observer.observe_first(timestep)
        episode_return = 0.0
        steps = 0
        while not timestep.last():
            if should_stop():
                return None
            action = self._actor.select_action(timestep.observation)
            timestep = self._environment.step(action)
            self._actor.observe(action, next_timestep=timestep)
            for observer in self._observers:
                observer.observe(timestep, action)
            if self._should_update:
                self._actor.update()
            episode_return += float(np.sum(timestep.reward))
            steps += 1
        for observer in self._observers:
            observer.episode_done(episode_return)
        counts = self._counter.increment(steps=steps, episodes=1)
        elapsed = time.monotonic() - start
        row = {
            "episode_length": steps,
            "episode_return": episode_return,
            "steps_per_second": steps / max(elapsed, 1e-9),
            "frames_per_second": steps * self._frames_per_step / max(elapsed, 1e-9),
            **counts,
        }
        self._logger.write(row)
        return row

    def run(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        num_episodes: int | None = None,
    ) -> list[dict]:
        """Runs episodes until `should_stop()` or `num_episodes` are done."""
        rows = []
        while num_episodes is None or len(rows) < num_episodes:
            if should_stop():
                break
            row = self.run_episode(should_stop)
            if row is None:
                break
            rows.append(row)
        return rows
