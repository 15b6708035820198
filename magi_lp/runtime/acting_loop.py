"""The actor-environment loop, with a stop check on every step.

Acme's `EnvironmentLoop` only checks for termination between episodes, and counts an
episode's steps when it ends; inside a Launchpad node that makes a stop wait for the rest of an
episode (seconds with pixel rendering), and a step limit, an evaluation point or a status line
lag by up to an episode (500 agent steps on dm_control). This loop checks `should_stop()`
before every step and counts steps as they happen through an Acme counter (so the coordinator
sees them): every step in one process, every `count_every` steps (and at every episode's end)
where the counter is a remote node, or with each batch an actor sends (`counts_follow_sends`).
It logs one row per episode with return, length and frames/s. It runs k environments of one
actor (`config.envs_per_actor`): a `BatchedActor` chooses their k actions in one call; an
`acme.core.Actor` (one environment) comes wrapped in `OneEnvironment`, so k = 1 is the same
loop, not a second one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dm_env
import numpy as np

from magi_lp.acme_api import core, counting, loggers
from magi_lp.agent.actor import BatchedActor, OneEnvironment


@dataclasses.dataclass
class _Episode:
    """One environment's episode in progress."""

    timestep: dm_env.TimeStep
    started: float  # time.monotonic() at reset
    loop_steps_at_start: int  # the loop's steps (all environments) at reset
    seconds_at_start: dict[str, float]  # the loop's time per part (`TIME_PARTS`) at reset
    steps: int = 0
    episode_return: float = 0.0


TIME_PARTS = ("policy", "env", "observe", "params")
"""Where the loop's time goes, logged per episode as `<part>_ms`: the loop's time in that
part over the episode, per environment step of the loop (all k environments together, so
the parts add up to about 1000 / the loop's environment steps per second): `policy`, the
batched action choice (on an accelerator it waits for the actions, and so for work queued
before them, such as `main.py`'s update); `env`, the environment steps (physics and
rendering); `observe`, the actor's and observers' `observe` (replay writes; `main.py`'s
learner update); `params`, the parameter pull."""


class ActingLoop:
    """Runs k environments of one actor: one batched action choice per step, then k steps.

    Each environment has its own episodes: it is reset when its episode ends, while the
    others go on, and each ended episode gets its own log row (with the environment's
    index when k > 1). Environments are stepped one after the other in this thread: on the
    CPU an environment step (physics and rendering) is the work, and the node is given one
    core. Episodes in progress continue across `run` calls (a stop leaves them open; the
    adders close an unfinished episode when the environment next resets).
    """

    def __init__(
        self,
        environments: Sequence[dm_env.Environment],
        actor: BatchedActor | OneEnvironment | core.Actor,
        counter: counting.Counter | None = None,
        logger: loggers.Logger | None = None,
        *,
        should_update: bool = True,
        frames_per_step: int = 1,
        observers: Sequence[Any] = (),
        count_every: int = 1,
        counts_follow_sends: Callable[[Mapping[str, Any]], bool] | None = None,
    ):
        """Creates the loop.

        Args:
          environments: the k (separately seeded) environments.
          actor: acts for all k (`actor.num_environments` must be k); an `acme.core.Actor`
            acts for one and is wrapped in `OneEnvironment`.
          counter: counts `steps` (of every environment) and `episodes`; give it a child
            counter with a prefix (`Counter(parent, prefix="actor")`) so the program sees
            `actor_steps`.
          logger: gets one row per ended episode.
          should_update: whether to let the actor refresh parameters after each step.
          frames_per_step: environment frames per agent step (action repeat), so logs can
            report frames as papers do.
          observers: objects with `observe_first(timestep)`, `observe(timestep, action)` and
            `episode_done(episode_return)`, e.g. a video recorder; they see the steps of all
            k environments, interleaved (so one that follows an episode wants k = 1).
          count_every: loop steps between two increments of `counter` (an increment also
            comes with every ended episode). 1 counts every step exactly (an in-process
            counter: a dict update); a counter node in another process is a Courier call per
            increment, so distributed actors count in small batches: the program's counts
            then trail the truth by fewer than `count_every * k` steps per actor.
          counts_follow_sends: for an actor whose adders send in batches (`take_sent_steps`:
            the served step queue's), whether, given the counts last answered, the loop counts
            with the sends: an increment only after a step that sent (and at an episode's
            end), of what the replay took, nothing sent for it; a call to the counter per
            batch, and batches as large as the sender's bounds. Where it says False (near a
            step limit: `runtime.nodes.far_from_limit`) and by default, every `count_every`
            loop steps sends what waits and counts it.
        """
        if count_every < 1:
            raise ValueError(f"count_every must be >= 1, got {count_every}")
        if isinstance(actor, core.Actor):
            actor = OneEnvironment(actor)
        if actor.num_environments != len(environments):
            raise ValueError(
                f"the actor acts for {actor.num_environments} environments, "
                f"the loop was given {len(environments)}"
            )
        self._environments = list(environments)
        self._actor = actor
        self._counter = counter or counting.Counter()
        self._logger = logger or loggers.NoOpLogger()
        self._should_update = should_update
        self._frames_per_step = frames_per_step
        self._observers = list(observers)
        self._episodes: list[_Episode | None] = [None] * len(self._environments)
        self._steps = 0  # every environment's steps, since the loop was made
        self._count_every = count_every
        self._counts_follow_sends = counts_follow_sends
        self._uncounted = 0  # loop steps (k environment steps each) not yet counted
        self.counts: dict[str, Any] = {}  # the counter's counts after the last increment
        self._seconds = dict.fromkeys(TIME_PARTS, 0.0)  # the loop's time per part
        self._evaluation: dict[str, int] = {}  # the rows' evaluation columns, if evaluating

    def start_evaluation(self, at: int) -> None:
        """The episodes that end from now on are those of the evaluation at `at` actor steps
        (its point on the schedule, or the limit): their rows carry `evaluation_at` and
        `evaluation_episode` (1, 2, ...), so an evaluation's rows are found by its point,
        and a second attempt at one point (a relaunch after a stop cut the first) by its
        episode numbers starting at 1 again."""
        self._evaluation = {"evaluation_at": int(at), "evaluation_episode": 0}

    def close(self) -> None:
        """Ends the actor's episodes in progress in replay, then closes the logger and the
        environments (in-process runs, before their replay stops; nodes just exit)."""
        self._actor.close()
        self._logger.close()
        for environment in self._environments:
            environment.close()

    @property
    def actor(self) -> BatchedActor | OneEnvironment:
        """The actor this loop drives."""
        return self._actor

    def _start(self, index: int) -> _Episode:
        timestep = self._environments[index].reset()
        self._actor.observe_first(index, timestep)
        for observer in self._observers:
            observer.observe_first(timestep)
        episode = _Episode(timestep, time.monotonic(), self._steps, dict(self._seconds))
        self._episodes[index] = episode
        return episode

    def step(self) -> list[dict]:
        """One step of every environment; returns the log rows of the episodes it ended."""
        episodes = [e if e is not None else self._start(i) for i, e in enumerate(self._episodes)]
        seconds = self._seconds
        clock = time.perf_counter()
        actions = self._actor.select_actions([e.timestep.observation for e in episodes])
        now = time.perf_counter()
        seconds["policy"] += now - clock
        ended = []
        for index, (environment, episode) in enumerate(
            zip(self._environments, episodes, strict=True)
        ):
            action = actions[index]
            clock = now
            timestep = environment.step(action)
            now = time.perf_counter()
            seconds["env"] += now - clock
            clock = now
            self._actor.observe(index, action, next_timestep=timestep)
            for observer in self._observers:
                observer.observe(timestep, action)
            now = time.perf_counter()
            seconds["observe"] += now - clock
            episode.timestep = timestep
            reward = timestep.reward  # a scalar as a rule (np.sum of one costs 5 us a step)
            episode.episode_return += float(reward if np.ndim(reward) == 0 else np.sum(reward))
            episode.steps += 1
            if timestep.last():
                ended.append(index)
        self._steps += len(episodes)
        self._uncounted += 1
        if self._should_update:
            self._actor.update()
            seconds["params"] += time.perf_counter() - now
        self._count(len(ended))
        if not ended:
            return []
        counts = self.counts
        now = time.monotonic()
        rows = []
        for index in ended:
            episode = episodes[index]
            self._episodes[index] = None
            if self._evaluation:
                self._evaluation["evaluation_episode"] += 1
            for observer in self._observers:
                observer.episode_done(episode.episode_return)
            elapsed = max(now - episode.started, 1e-9)
            loop_steps = self._steps - episode.loop_steps_at_start
            row = {
                **({"environment": index} if len(self._environments) > 1 else {}),
                "episode_length": episode.steps,
                "episode_return": episode.episode_return,
                "steps_per_second": episode.steps / elapsed,
                # The process's frames/s over this episode: all k environments together.
                "frames_per_second": loop_steps * self._frames_per_step / elapsed,
                **{
                    f"{part}_ms": 1000.0
                    * (self._seconds[part] - episode.seconds_at_start[part])
                    / max(loop_steps, 1)
                    for part in TIME_PARTS
                },
                **counts,
                **self._evaluation,
            }
            self._logger.write(row)
            rows.append(row)
        return rows

    def _count(self, episodes: int) -> None:
        """After a step that ended `episodes` episodes: counts with the actor's sends where
        `counts_follow_sends` says so, else every `count_every` loop steps."""
        follow = self._counts_follow_sends
        if follow is not None and follow(self.counts):
            sent = self._take_sent(send=False)
            if sent is not None:  # an actor that sends in batches
                if sent or episodes:
                    self._increment(sent, episodes)
                return
            self._counts_follow_sends = None  # its steps are written as they come
        if episodes or self._uncounted >= self._count_every:
            self.flush_counts(episodes=episodes)

    def _take_sent(self, send: bool) -> int | None:
        take = getattr(self._actor, "take_sent_steps", None)
        return None if take is None else take(send)

    def _increment(self, steps: int, episodes: int) -> dict[str, Any]:
        self.counts = self._counter.increment(steps=steps, episodes=episodes)
        self._uncounted = 0
        return self.counts

    def flush_counts(self, episodes: int = 0) -> dict[str, Any]:
        """Gives the counter the steps taken since the last increment (and `episodes` ended
        episodes); returns and keeps (`counts`) the counts it answers with.

        An actor whose adders send in batches (`take_sent_steps`: the served step queue's)
        first sends what they hold, and the steps counted are those its replay took: what
        waits unsent is never counted (a kill loses only uncounted steps), and what a stop
        drops is not counted either.
        """
        sent = self._take_sent(send=True)
        steps = self._uncounted * len(self._environments) if sent is None else sent
        return self._increment(steps, episodes)

    def run(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        num_episodes: int | None = None,
    ) -> list[dict]:
        """Steps until `should_stop()`, or until at least `num_episodes` episodes ended.

        Returns the rows of the episodes that ended (a step may end several at once).
        """
        rows: list[dict] = []
        while num_episodes is None or len(rows) < num_episodes:
            if should_stop():
                break
            rows.extend(self.step())
        return rows
