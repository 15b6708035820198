"""The same experiment in one process: for debugging, tests and small machines.

The builder, networks, learner, actor and evaluator are exactly those of the distributed
program (the same node classes, constructed in-process); only the transport differs: the
Reverb server runs in this process and one learner step is interleaved every
`ReplaySchedule.actor_steps_per_update` actor steps, which is the replay ratio the distributed
program's rate limiter enforces.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dm_env
import reverb
from acme import core

from magi_lp.agent.builder import ReplaySchedule
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.loggers import ProgressBar
from magi_lp.runtime.nodes import ActorNode, LearnerNode, frames_per_step, new_counter
from magi_lp.runtime.program import replay_checkpointer


@dataclasses.dataclass
class LocalRunResult:
    """What a single-process run did."""

    actor_steps: int
    learner_steps: int
    episodes: int
    evaluation_returns: list[float]
    resumed_from_step: int | None
    stopped_by_user: bool


class _LearningActor(core.Actor):
    """Wraps an actor so the learner steps as the replay schedule says, after each step."""

    def __init__(
        self,
        actor: core.Actor,
        learner: LearnerNode,
        schedule: ReplaySchedule,
        replay_client: reverb.Client,
        on_step: Any = None,
    ):
        self._actor = actor
        self._learner = learner
        self._schedule = schedule
        self._replay_client = replay_client
        self._replay_ready = False
        self._on_step = on_step
        # Counted from this process's start: replay starts empty on every (re)launch, so
        # learning restarts only once it holds `min_replay_size` items again.
        self.steps = 0
        self.updates = 0

    def _replay_has_items(self) -> bool:
        if not self._replay_ready:
            tables = self._replay_client.server_info().values()
            self._replay_ready = all(table.current_size > 0 for table in tables)
        return self._replay_ready

    def select_action(self, observation: Any) -> Any:
        return self._actor.select_action(observation)

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        self._actor.observe_first(timestep)

    def observe(self, action: Any, next_timestep: dm_env.TimeStep) -> None:
        self._actor.observe(action, next_timestep)
        self.steps += 1

    def update(self, wait: bool = False) -> None:
        due = self._schedule.updates_due(self.steps)
        if due > self.updates and not self._replay_has_items():
            # Adders write items late (an n-step window, a chunk still open); sampling an
            # empty table would block this one thread forever. Skip what is due until then.
            self.updates = due
        while self.updates < due:
            self._learner.step()
            self.updates += 1
        self._actor.update(wait)
        if self._on_step is not None:
            self._on_step()


def run_local(
    experiment: Experiment,
    *,
    workdir: str,
    logger_factory: Any,
    progress: bool = True,
) -> LocalRunResult:
    """Runs `experiment` in this process until `config.max_actor_steps` actor steps.

    Resumes from the latest checkpoint in `workdir` when there is one. Ctrl-C stops the run
    after a final checkpoint; the same command resumes it.
    """
    config = experiment.config
    builder = experiment.builder
    environment_spec = experiment.get_environment_spec()
    schedule = builder.replay_schedule()

    server = reverb.Server(
        builder.make_replay_tables(environment_spec, rate_limited=False),
        checkpointer=replay_checkpointer(workdir),
    )
    replay_client = reverb.Client(f"localhost:{server.port}")
    counter = new_counter()
    learner = LearnerNode(
        experiment, environment_spec, replay_client, counter, workdir, logger_factory
    )
    resumed_from = learner.runner.restored_step
    start_steps = int(counter.get_counts().get("actor_steps", 0))
    bar = ProgressBar(
        config.max_actor_steps,
        initial_steps=start_steps,
        frames_per_step=frames_per_step(experiment),
        disable=None if progress else True,
    )
    learning_actor: list[_LearningActor] = []

    def current_steps() -> int:
        # The counter only moves at episode ends; within an episode add this episode's steps.
        return start_steps + (learning_actor[0].steps if learning_actor else 0)

    def wrap(actor: core.Actor) -> core.Actor:
        learning_actor.append(
            _LearningActor(
                actor,
                learner,
                schedule,
                replay_client,
                on_step=lambda: bar.update(current_steps()),
            )
        )
        return learning_actor[0]

    actor = ActorNode(
        experiment,
        environment_spec,
        0,
        replay_client,
        learner,
        counter,
        logger_factory,
        actor_wrapper=wrap,
    )
    evaluator = None
    if config.num_evaluators > 0:
        evaluator = ActorNode(
            experiment,
            environment_spec,
            0,
            None,
            learner,
            counter,
            logger_factory,
            evaluation=True,
        )

    evaluation_returns: list[float] = []
    episodes = 0
    stopped_by_user = False
    next_evaluation = start_steps
    try:
        while int(counter.get_counts().get("actor_steps", 0)) < config.max_actor_steps:
            steps = int(counter.get_counts().get("actor_steps", 0))
            if evaluator is not None and steps >= next_evaluation:
                rows = evaluator.evaluate()
                evaluation_returns.extend(row["episode_return"] for row in rows)
                next_evaluation = steps + config.evaluation.every_actor_steps
            row = actor.loop.run_episode()
            episodes += 1
            bar.update(current_steps(), row["episode_return"])
        if evaluator is not None:
            rows = evaluator.evaluate()
            evaluation_returns.extend(row["episode_return"] for row in rows)
    except KeyboardInterrupt:
        stopped_by_user = True
    finally:
        bar.close()
        learner.runner.save()
        if config.checkpoint.reverb:
            replay_client.checkpoint()
        server.stop()

    return LocalRunResult(
        actor_steps=int(counter.get_counts().get("actor_steps", 0)),
        learner_steps=learner.runner.steps,
        episodes=episodes,
        evaluation_returns=evaluation_returns,
        resumed_from_step=resumed_from,
        stopped_by_user=stopped_by_user,
    )
