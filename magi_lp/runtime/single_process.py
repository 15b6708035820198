"""The same experiment in one process: for debugging, tests and small machines.

The learner, actor and evaluator are built exactly as in the distributed program
(`magi_lp.runtime.nodes.make_learner_runner` / `make_acting_loop`); only the transport
differs. On the device frame store (`replay.store`='device') the actor writes into the
learner's store directly: no Reverb server, no TensorFlow. Otherwise the Reverb server runs
in this process, and this runner rebuilds the replay tables without their rate limiters (as
Acme's `run_experiment` does). Either way one thread that must never block on a table
interleaves acting and learning itself, one learner step every
`ReplaySchedule.actor_steps_per_update` actor steps: the replay ratio the distributed
program's rate limiter (or the learner's `RatioGate`) enforces. With
`envs_per_actor` = k the one actor steps k environments (a `BatchedActor`), and the
schedule counts the steps of all of them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import dm_env

from magi_lp.launch.interrupts import stop_deferred
from magi_lp.replay.schedule import ReplaySchedule
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime import checkpointing, seeding
from magi_lp.runtime.control_nodes import new_counter
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.learner_runner import LearnerRunner
from magi_lp.runtime.loggers import ProgressBar
from magi_lp.runtime.nodes import (
    evaluate,
    first_evaluation_at,
    make_acting_loop,
    make_learner_runner,
    next_evaluation_after,
    resume_point,
)


@dataclasses.dataclass
class SingleProcessResult:
    """What a single-process run did."""

    actor_steps: int
    learner_steps: int
    episodes: int
    evaluation_returns: list[float]
    resumed_from_step: int | None
    stopped_by_user: bool


class InterleavedLearning:
    """An acting-loop observer that takes the learner steps the replay schedule owes.

    After each actor step (the adder has written it) it steps the learner until the number
    of updates matches `schedule.updates_due(steps)`, then the actor pulls parameters.
    """

    def __init__(
        self,
        learner: LearnerRunner,
        schedule: ReplaySchedule,
        has_items: Callable[[], bool],
        on_step: Callable[[int], None] | None = None,
        *,
        steps: int = 0,
        updates: int = 0,
    ):
        """`steps` and `updates` are the counts the schedule goes on from: the run's actor
        steps and learner updates when the replay was restored with them (a resumed run then
        keeps the uninterrupted run's ratio), 0 and 0 when the replay starts empty (learning
        restarts once it holds `min_replay_size` items again, as the distributed program's
        rate limiter has it)."""
        self._learner = learner
        self._schedule = schedule
        self._has_items = has_items
        self._replay_ready = False
        self._on_step = on_step
        self._start_steps = steps
        self.steps = steps
        self.updates = updates

    def _replay_has_items(self) -> bool:
        if not self._replay_ready:
            self._replay_ready = self._has_items()
        return self._replay_ready

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        del timestep

    def observe(self, timestep: dm_env.TimeStep, action: Any) -> None:
        del timestep, action
        self.steps += 1
        due = self._schedule.updates_due(self.steps)
        if due > self.updates and not self._replay_has_items():
            # Adders write items late (an n-step window, a chunk still open); sampling an
            # empty table would block this one thread forever. Skip what is due until then.
            self.updates = due
        while self.updates < due:
            self._learner.step()
            self.updates += 1
        if self._on_step is not None:
            self._on_step(self.steps - self._start_steps)

    def episode_done(self, episode_return: float) -> None:
        del episode_return


def run_single_process(
    experiment: Experiment,
    *,
    workdir: str,
    logger_factory: Any,
    progress: bool = True,
) -> SingleProcessResult:
    """Runs `experiment` in this process until exactly `config.max_actor_steps` actor steps
    (with `envs_per_actor` = k, within k - 1 of it: the k environments step together).

    Resumes from the latest checkpoint in `workdir` when there is one. Ctrl-C stops the run
    after a final checkpoint; the same command resumes it.
    """
    config = experiment.config
    builder = experiment.builder
    environment_spec = experiment.get_environment_spec()
    schedule = builder.replay_schedule()

    server = client = None
    store = resolve_store(builder, config, single_process=True)
    if store.uses_reverb:
        import reverb

        from magi_lp.replay.reverb_seam import without_rate_limit
        from magi_lp.runtime.program import replay_checkpointer

        tables = store.make_tables(environment_spec)
        server = reverb.Server(
            [without_rate_limit(t) for t in tables], checkpointer=replay_checkpointer(workdir)
        )
        client = reverb.Client(f"localhost:{server.port}")
    # Otherwise a toolkit store the actor writes directly (device frames, host transitions).
    # A resumed run's replay sampling, actor and evaluator draw fresh streams (`seeding`).
    resumed_at = resume_point(experiment, workdir)
    replay = store.make_learner_replay(
        environment_spec, client, seeding.node_key(config.seed, "replay", resumed_at=resumed_at)
    )
    counter = new_counter()
    learner = make_learner_runner(
        experiment, environment_spec, replay, counter, workdir, logger_factory
    )
    start_steps = int(counter.get_counts().get("actor_steps", 0))
    bar = ProgressBar(
        config.max_actor_steps,
        initial_steps=start_steps,
        frames_per_step=experiment.frames_per_step,
        disable=None if progress else True,
    )
    # A replay restored from the checkpoint holds what the run wrote up to it: the schedule
    # goes on from the run's counts. An empty one (no replay checkpoint) starts it again.
    restored = start_steps > 0 and replay.has_items()
    learning = InterleavedLearning(
        learner,
        schedule,
        replay.has_items,
        on_step=lambda steps: bar.update(start_steps + steps),
        steps=start_steps if restored else 0,
        updates=learner.steps if restored else 0,
    )
    actor = make_acting_loop(
        experiment,
        environment_spec,
        0,
        store,
        replay,
        learner,
        counter,
        logger_factory,
        observers=[learning],
        resumed_at=resumed_at,
    )
    evaluator = None
    if config.num_evaluators > 0:
        evaluator = make_acting_loop(
            experiment,
            environment_spec,
            0,
            None,
            None,
            learner,
            counter,
            logger_factory,
            evaluation=True,
            resumed_at=resumed_at,
        )

    def actor_steps() -> int:
        return int(counter.get_counts().get("actor_steps", 0))

    evaluation_returns: list[float] = []
    episodes = 0
    stopped_by_user = False
    every = int(config.evaluation.every_actor_steps)
    limit = int(config.max_actor_steps)
    # Evaluations at 0 and every multiple of `every`, and at the limit; the actor counts
    # every step, so each happens at exactly that many actor steps (mid-episode, as the
    # official DrQ-v2's does; the training episode goes on after it).
    next_evaluation = first_evaluation_at(start_steps, every)
    last_evaluated = None

    def run_evaluation(at: int) -> None:
        nonlocal last_evaluated
        rows = evaluate(evaluator, config.evaluation.episodes, at=at)  # its point, or the limit
        evaluation_returns.extend(row["episode_return"] for row in rows)
        last_evaluated = actor_steps()

    try:
        while actor_steps() < limit:
            if evaluator is not None and actor_steps() >= next_evaluation:
                run_evaluation(next_evaluation)
                next_evaluation = next_evaluation_after(actor_steps(), every)
            stop_at = min(limit, next_evaluation) if evaluator is not None else limit
            rows = actor.run(lambda stop_at=stop_at: actor_steps() >= stop_at)
            episodes += len(rows)
            if rows:
                bar.update(actor_steps(), rows[-1]["episode_return"])
        if evaluator is not None and last_evaluated != actor_steps():
            run_evaluation(limit)
    except KeyboardInterrupt:
        stopped_by_user = True
    finally:
        failing = sys.exc_info()[1]  # the loop's own error: a failed final save must not hide it
        bar.close()
        # A stop from here on waits for the final save: raised at once, it skipped it, and one
        # held by the save came out after it, skipped the replay's checkpoint and the closes,
        # and the CLI took it for a Ctrl-C before the run started. During the closes it only
        # moves on to the next (one that hangs is left with another Ctrl-C). A run that had
        # reached its limit stays finished.
        try:
            with stop_deferred("the final checkpoint is written"):
                learner.save()  # its own hold says so, once
                if config.checkpoint.reverb and server is not None:
                    with stop_deferred("the replay's checkpoint is written", say=checkpointing.say):
                        replay.client.checkpoint()
        except KeyboardInterrupt:
            stopped_by_user = stopped_by_user or actor_steps() < limit
        except Exception as error:
            if failing is None:
                raise
            checkpointing.say(
                f"the final checkpoint was not written ({type(error).__name__}: {error}); "
                "the run's own error follows"
            )
        closes = [loop.close for loop in (actor, evaluator) if loop is not None]
        closes += [learner.close] + ([server.stop] if server is not None else [])
        for close in closes:
            try:
                close()
            except KeyboardInterrupt:
                stopped_by_user = stopped_by_user or actor_steps() < limit

    return SingleProcessResult(
        actor_steps=actor_steps(),
        learner_steps=learner.steps,
        episodes=episodes,
        evaluation_returns=evaluation_returns,
        resumed_from_step=learner.restored_step,
        stopped_by_user=stopped_by_user,
    )
