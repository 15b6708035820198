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
import functools
import sys
from collections.abc import Callable
from typing import Any

import dm_env

from magi_lp.acme_api import specs
from magi_lp.launch.interrupts import stop_deferred
from magi_lp.replay.schedule import ReplaySchedule
from magi_lp.replay.store import LearnerReplay, ReplayStore
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime import checkpointing, seeding
from magi_lp.runtime.acting_loop import ActingLoop
from magi_lp.runtime.assembly import make_acting_loop, make_learner_runner, resume_point
from magi_lp.runtime.control_nodes import new_counter
from magi_lp.runtime.evaluation_schedule import (
    evaluate,
    first_evaluation_at,
    next_evaluation_after,
)
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.learner_runner import LearnerRunner
from magi_lp.runtime.loggers import ProgressBar


@dataclasses.dataclass
class SingleProcessResult:
    """What a single-process run did. The run fills it as it goes, so a Ctrl-C keeps what
    was done before it."""

    actor_steps: int = 0
    learner_steps: int = 0
    episodes: int = 0
    evaluation_returns: list[float] = dataclasses.field(default_factory=list)
    resumed_from_step: int | None = None
    stopped_by_user: bool = False


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
    environment_spec = experiment.get_environment_spec()
    store = resolve_store(experiment.builder, config, single_process=True)
    server, client = _start_reverb(store, environment_spec, workdir)
    # A resumed run's replay sampling, actor and evaluator draw fresh streams (`seeding`).
    resumed_at = resume_point(experiment, workdir)
    replay = store.make_learner_replay(
        environment_spec, client, seeding.node_key(config.seed, "replay", resumed_at=resumed_at)
    )
    counter = new_counter()
    learner = make_learner_runner(
        experiment, environment_spec, replay, counter, workdir, logger_factory
    )

    def actor_steps() -> int:
        return int(counter.get_counts().get("actor_steps", 0))

    start_steps = actor_steps()
    bar = ProgressBar(
        config.max_actor_steps,
        initial_steps=start_steps,
        frames_per_step=experiment.frames_per_step,
        disable=None if progress else True,
    )
    learning = _interleaved_learning(
        learner, replay, experiment.builder.replay_schedule(), bar, start_steps
    )
    # Both loops pull their parameters from the learner itself.
    acting_loop = functools.partial(
        make_acting_loop,
        experiment,
        environment_spec,
        0,
        variable_source=learner,
        counter=counter,
        logger_factory=logger_factory,
        resumed_at=resumed_at,
    )
    actor = acting_loop(store=store, replay=replay, observers=[learning])
    evaluator = None
    if config.num_evaluators > 0:
        evaluator = acting_loop(store=None, replay=None, evaluation=True)
    result = SingleProcessResult()
    try:
        _act_and_evaluate(config, actor, evaluator, actor_steps, bar, start_steps, result)
    except KeyboardInterrupt:
        result.stopped_by_user = True
    finally:
        failing = sys.exc_info()[1]  # the loop's own error: a failed final save must not hide it
        bar.close()
        closes = [loop.close for loop in (actor, evaluator) if loop is not None]
        closes += [learner.close] + ([server.stop] if server is not None else [])
        stopped = _save_and_close(
            learner, replay, config.checkpoint.reverb and server is not None, closes, failing
        )
        # A stop once the run had reached its limit leaves it finished.
        result.stopped_by_user = result.stopped_by_user or (
            stopped and actor_steps() < int(config.max_actor_steps)
        )
    result.actor_steps = actor_steps()
    result.learner_steps = learner.steps
    result.resumed_from_step = learner.restored_step
    return result


def _start_reverb(
    store: ReplayStore, environment_spec: specs.EnvironmentSpec, workdir: str
) -> tuple[Any, Any]:
    """A Reverb server in this process and its client, for a store that uses Reverb; else
    (None, None): a toolkit store the actor writes directly (device frames, host
    transitions). The tables lose their rate limiters: the one thread that acts and learns
    must never block on a table (as Acme's `run_experiment` has it)."""
    if not store.uses_reverb:
        return None, None
    import reverb

    from magi_lp.replay.reverb_seam import without_rate_limit
    from magi_lp.runtime.program import replay_checkpointer

    tables = store.make_tables(environment_spec)
    server = reverb.Server(
        [without_rate_limit(t) for t in tables], checkpointer=replay_checkpointer(workdir)
    )
    return server, reverb.Client(f"localhost:{server.port}")


def _interleaved_learning(
    learner: LearnerRunner,
    replay: LearnerReplay,
    schedule: ReplaySchedule,
    bar: ProgressBar,
    start_steps: int,
) -> InterleavedLearning:
    """The observer that steps the learner as the schedule owes, from where it goes on.

    A replay restored from the checkpoint holds what the run wrote up to it: the schedule
    goes on from the run's counts. An empty one (no replay checkpoint) starts it again."""
    restored = start_steps > 0 and replay.has_items()
    return InterleavedLearning(
        learner,
        schedule,
        replay.has_items,
        on_step=lambda steps: bar.update(start_steps + steps),
        steps=start_steps if restored else 0,
        updates=learner.steps if restored else 0,
    )


def _act_and_evaluate(
    config: Any,
    actor: ActingLoop,
    evaluator: ActingLoop | None,
    actor_steps: Callable[[], int],
    bar: ProgressBar,
    start_steps: int,
    result: SingleProcessResult,
) -> None:
    """Acts up to `max_actor_steps`, evaluating at 0, at every multiple of
    `evaluation.every_actor_steps` and at the limit. The actor counts every step, so each
    evaluation happens at exactly that many actor steps (mid-episode, as the official
    DrQ-v2's does; the training episode goes on after it)."""
    every = int(config.evaluation.every_actor_steps)
    limit = int(config.max_actor_steps)
    next_evaluation = first_evaluation_at(start_steps, every)
    last_evaluated = None

    def run_evaluation(at: int) -> None:
        nonlocal last_evaluated
        rows = evaluate(evaluator, config.evaluation.episodes, at=at)  # its point, or the limit
        result.evaluation_returns.extend(row["episode_return"] for row in rows)
        last_evaluated = actor_steps()

    while actor_steps() < limit:
        if evaluator is not None and actor_steps() >= next_evaluation:
            run_evaluation(next_evaluation)
            next_evaluation = next_evaluation_after(actor_steps(), every)
        stop_at = min(limit, next_evaluation) if evaluator is not None else limit
        rows = actor.run(lambda stop_at=stop_at: actor_steps() >= stop_at)
        result.episodes += len(rows)
        if rows:
            bar.update(actor_steps(), rows[-1]["episode_return"])
    if evaluator is not None and last_evaluated != actor_steps():
        run_evaluation(limit)


def _save_and_close(
    learner: LearnerRunner,
    replay: LearnerReplay,
    save_replay: bool,
    closes: list[Callable[[], None]],
    failing: BaseException | None,
) -> bool:
    """Writes the final checkpoint (the replay's too when `save_replay`), then closes each
    of `closes`; whether a stop (Ctrl-C) came meanwhile.

    A stop from here on waits for the final save: raised at once, it skipped it, and one
    held by the save came out after it, skipped the replay's checkpoint and the closes, and
    the CLI took it for a Ctrl-C before the run started. During the closes it only moves on
    to the next (one that hangs is left with another Ctrl-C). A failed save is raised,
    unless the loop is `failing` itself: then it is said, and the loop's error follows."""
    stopped = False
    try:
        with stop_deferred("the final checkpoint is written"):
            learner.save()  # its own hold says so, once
            if save_replay:
                with stop_deferred("the replay's checkpoint is written", say=checkpointing.say):
                    replay.client.checkpoint()
    except KeyboardInterrupt:
        stopped = True
    except Exception as error:
        if failing is None:
            raise
        checkpointing.say(
            f"the final checkpoint was not written ({type(error).__name__}: {error}); "
            "the run's own error follows"
        )
    for close in closes:
        try:
            close()
        except KeyboardInterrupt:
            stopped = True
    return stopped
