"""The node classes of the distributed program.

They build their learner and acting loops with `magi_lp.runtime.assembly` (re-exported here:
`make_learner_runner`, `make_acting_loop`, `resume_point`) and evaluate at the points of
`magi_lp.runtime.evaluation_schedule`, as the single-process runner does. The node classes
are plain Python classes (the Launchpad-examples style) that an engine (`magi_lp.engines`)
constructs in the node's process; constructors take handles and, last, the engine's
`lifetime` (`magi_lp.runtime.graph.NodeLifetime`), call `prepare_node_process()` first so
per-node settings apply before any framework allocates, and `run()` until the program
stops. No engine is named here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from magi_lp.acme_api import specs
from magi_lp.agent.variable_client import call_in_background
from magi_lp.console import say
from magi_lp.launch.files import write_text_atomically
from magi_lp.launch.node_lifetime import hold_exit
from magi_lp.replay.spec import WriteAbandonedError
from magi_lp.replay.store import LearnerReplay, ReplayStore
from magi_lp.runtime import seeding
from magi_lp.runtime.assembly import (
    StopFn,
    make_acting_loop,
    make_learner_runner,
    resume_point,
    warm_up,
)
from magi_lp.runtime.checkpointing import CheckpointWriteError
from magi_lp.runtime.config import DISTRIBUTED_COUNT_EVERY
from magi_lp.runtime.evaluation_schedule import (
    evaluate,
    first_evaluation_at,
    next_evaluation_after,
)
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.graph import NodeLifetime
from magi_lp.runtime.learner_runner import LearnerRunner
from magi_lp.runtime.node_devices import prepare_node_process
from magi_lp.runtime.workdir import Workdir

FINAL_SAVE_FAILED = 3
"""Exit code of a learner process whose final checkpoint could not be written."""


EVALUATOR_LOOK_S = 0.25
"""How often a distributed evaluator reads the counts (a small call to the counter): at the
limit the coordinator, and the actors, wait for its final evaluation to begin."""


def _make_learner_node_runner(
    experiment: Experiment,
    store: ReplayStore,
    environment_spec: specs.EnvironmentSpec,
    replay_client: Any,
    counter: Any,
    workdir: str,
    logger_factory: Callable[..., Any],
) -> tuple[LearnerRunner, LearnerReplay]:
    """The learner node's replay side (a device store starts draining the queue at once)
    and its runner."""
    # The replay's sampling key: fresh on resume too (a device store saved with the checkpoint
    # goes on from its saved batch count; one that is not starts its count again).
    key = seeding.node_key(
        experiment.config.seed, "replay", resumed_at=resume_point(experiment, workdir)
    )
    replay = store.make_learner_replay(environment_spec, replay_client, key)
    runner = make_learner_runner(
        experiment, environment_spec, replay, counter, workdir, logger_factory
    )
    replay.start()  # after the restore; the store fills while the update compiles
    return runner, replay


class LearnerNode:
    """The learner process: serves at once, then builds, restores, steps until the program
    stops, and checkpoints.

    Launchpad starts a node's Courier server only after its constructor returns, and the
    learner's build (networks, initial state, checkpoint restore) takes seconds; so the
    constructor only stores what to build, and `run()` (called once the server is up)
    builds. `get_variables` and `save` wait for the build: actors connect at once and get
    their first parameters the moment they exist, and compile their policy meanwhile.
    """

    def __init__(self, *build: Any, lifetime: NodeLifetime):
        """`build`: what the learner is made of, as `_make_learner_node_runner` takes it
        (experiment, replay store, environment spec, replay client, counter, workdir, logger
        factory)."""
        prepare_node_process()
        self._lifetime = lifetime
        config = build[0].config
        # A Reverb replay in this process (`colocate_learner_and_replay`) is checkpointed
        # here at a stop: this process leaves right after its final save, and the replay's
        # own thread would be cut in its checkpoint. At the limit the coordinator wrote it.
        self._checkpoints_replay = bool(config.checkpoint.reverb) and bool(
            config.colocate_learner_and_replay
        )
        self._max_actor_steps = int(config.max_actor_steps)
        self._make_runner = functools.partial(_make_learner_node_runner, *build)
        self._built = threading.Event()
        self._runner: LearnerRunner | None = None
        self._replay: LearnerReplay | None = None
        self._build_error = "see the learner's log"

    def _build(self) -> LearnerRunner:
        """Builds the learner (once); `run()` calls it after the server is up. Private, so
        Courier does not serve it."""
        if self._runner is None:
            start = time.monotonic()
            try:
                self._runner, self._replay = self._make_runner()
            except BaseException as error:
                self._build_error = f"{type(error).__name__}: {error}"
                raise
            finally:
                self._built.set()  # callers waiting for a failed build fail, not hang
            say(
                f"learner built in {time.monotonic() - start:.1f} s; serving its parameters",
                source="learner",
            )
        return self._runner

    def _built_runner(self) -> LearnerRunner:
        self._built.wait()
        if self._runner is None:
            # Said to the caller (an actor, the coordinator): its exit report then names the
            # learner's error, not only its own.
            raise RuntimeError(
                f"the learner failed to build: {self._build_error} (its traceback is in the "
                "learner's log)"
            )
        return self._runner

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """Parameters for actors and evaluators (waits for the build)."""
        return self._built_runner().get_variables(names)

    def replay_info(self) -> dict[str, Any]:
        """The device store's numbers for the status view ({} before the build, and for a
        Reverb store, which the probe asks Reverb about)."""
        return {} if self._replay is None else self._replay.info()

    def save(self) -> int | None:
        """Checkpoints now; returns the learner step of the newest checkpoint (None: none
        was written). Its step thread goes on: what is saved is its last whole step."""
        runner = self._built_runner()
        runner.save()
        return runner.last_saved_step

    def run(self) -> None:
        """Builds, then steps until the program stops (Launchpad calls this after serving
        starts).

        The launcher stops the learner after the actors and before the counter, so the final
        checkpoint holds the final counts. A final save that fails ends the process with
        `FINAL_SAVE_FAILED` and one line saying why, which the launcher reports.
        """
        say("serving; building the learner", source="learner")
        runner = self._build()
        try:
            # The stop watcher must not leave the process during the final save.
            with hold_exit("the learner's final checkpoint"):
                try:
                    runner.run(self._lifetime.stopping)
                finally:
                    self._checkpoint_colocated_replay(runner)
        except CheckpointWriteError as error:
            say(f"final {error}", source="learner")
            self._lifetime.leave(FINAL_SAVE_FAILED)
            return
        self._lifetime.leave()

    def _checkpoint_colocated_replay(self, runner: LearnerRunner) -> None:
        """The Reverb replay sharing this process, after the final save (a stop before the
        limit: at the limit the coordinator wrote it before the stop)."""
        client = None if self._replay is None else self._replay.client
        if not self._checkpoints_replay or client is None:
            return
        if int(runner.last_counts.get("actor_steps", 0)) >= self._max_actor_steps:
            return
        start = time.monotonic()
        try:
            path = client.checkpoint()
        except Exception as error:  # the run is ending; say so
            say(f"replay checkpoint failed: {error}", source="replay")
            return
        say(
            f"replay checkpoint written to {path} in {time.monotonic() - start:.1f} s",
            source="replay",
        )


def far_from_limit(
    max_actor_steps: int, actors: int, envs_per_actor: int, send_steps: int, resumed_at: int = 0
) -> Callable[[Mapping[str, Any]], bool]:
    """An actor's rule for `ActingLoop(counts_follow_sends=...)`: whether the program's
    `actor_steps` (in the counts last answered, or `resumed_at` before any) are so far below
    `max_actor_steps` that the actor may count with its sends.

    Counting with the sends, an actor's steps reach the counter a batch at a time, up to
    `send_steps` late, so the counts seen trail the truth by up to that much per actor. The
    margin is every actor's unsent batch and two reports' steps besides; within it each actor
    sends and counts every `DISTRIBUTED_COUNT_EVERY` loop steps, so the run still ends within
    that many steps per actor of its limit."""
    margin = actors * (send_steps + 2 * DISTRIBUTED_COUNT_EVERY * envs_per_actor)

    def far(counts: Mapping[str, Any]) -> bool:
        seen = max(int(counts.get("actor_steps", 0)), resumed_at)
        return seen + margin < max_actor_steps

    return far


class ActorNode:
    """An actor and its environment loop, acting until the program stops or the counts it
    reported reach `max_actor_steps` (then it waits for the coordinator's stop, so the run
    ends within `DISTRIBUTED_COUNT_EVERY` steps per actor of the limit, not a stop's latency
    of steps later). Far from the limit, an actor whose steps go in batches counts with its
    sends (`far_from_limit`)."""

    def __init__(
        self,
        experiment: Experiment,
        store: ReplayStore,
        environment_spec: specs.EnvironmentSpec,
        index: int,
        replay_client: Any,
        variable_source: Any,
        counter: Any,
        logger_factory: Callable[..., Any],
        *,
        workdir: str,
        lifetime: NodeLifetime,
    ):
        """`workdir`: the run's, read for its `resume_point`."""
        prepare_node_process()
        self._lifetime = lifetime
        self._name = f"actor_{index}"
        config = experiment.config
        resumed_at = resume_point(experiment, workdir)
        send_bounds = getattr(store, "send_bounds", None)
        self._loop = make_acting_loop(
            experiment,
            environment_spec,
            index,
            store,
            replay_client,
            variable_source,
            counter,
            logger_factory,
            should_stop=lifetime.stopping,
            count_every=DISTRIBUTED_COUNT_EVERY,
            counts_follow_sends=None
            if send_bounds is None
            else far_from_limit(
                int(config.max_actor_steps),
                int(config.num_actors),
                int(config.envs_per_actor),
                int(send_bounds()["send_steps"]),
                resumed_at,
            ),
            resumed_at=resumed_at,
            actors=int(config.num_actors),
        )
        self._max_actor_steps = int(config.max_actor_steps)
        warm_up(self._loop, environment_spec, f"actor_{index}")

    def limit_reached(self) -> bool:
        """Whether the counts this actor last reported reach `max_actor_steps`."""
        return int(self._loop.counts.get("actor_steps", 0)) >= self._max_actor_steps

    def run(self) -> None:
        stopping = self._lifetime.stopping
        # A write the replay holds back (its rate limiter, a full queue) is given up at a
        # stop, so the node ends by itself instead of by the launcher's SIGKILL.
        with contextlib.suppress(WriteAbandonedError):
            self._loop.run(lambda: stopping() or self.limit_reached())
        if stopping():
            self._count_the_last_steps()
        else:  # the limit: the coordinator stops the program
            self._loop.flush_counts()
            while not stopping():
                self._lifetime.wait_for_stop(0.5)
        self._lifetime.leave()

    def _count_the_last_steps(self, timeout_s: float = 5.0) -> None:
        """At a stop, the steps taken since the last report (up to `DISTRIBUTED_COUNT_EVERY`
        per environment) go to the counter before the learner's final checkpoint reads it
        (the launcher stops the actors first): uncounted, a relaunch took them again. A
        counter that does not answer (killed) is said, not waited for."""
        try:
            call_in_background(self._loop.flush_counts).result(timeout=timeout_s)
        except Exception as error:
            say(
                f"its last steps were not counted ({type(error).__name__}: "
                f"{error or f'no answer in {timeout_s:g} s'}); a relaunch takes them again",
                source=self._name,
            )


def _write_record(path: Path, record: dict[str, int], failed: str, so: str) -> None:
    """Writes an evaluator's JSON record atomically; a disk that refuses it is said in one
    line (`failed (error); so`), and the evaluations go on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(record))
    except OSError as error:
        say(f"{failed} ({error}); {so}", source="evaluator")


def _read_due(path: Path) -> int | None:
    """The point in an earlier launch's `Workdir.evaluation_due` record, or None (none, or
    unreadable: then nothing is evaluated again)."""
    try:
        return int(json.loads(path.read_text())["evaluation_at"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        say(f"{path} is unreadable ({error}); no cut evaluation is redone", source="evaluator")
        return None


class EvaluatorNode:
    """Evaluates at 0 actor steps and at every multiple of `evaluation.every_actor_steps`
    (once the counter node shows it: actors report every `DISTRIBUTED_COUNT_EVERY` steps, and
    this node looks every `EVALUATOR_LOOK_S`), and once more when the actors reach
    `max_actor_steps`, as `main.py` does at its end: the coordinator waits for that one
    before it stops the program (`evaluated_at_limit`).

    A periodic evaluation a stop (or a kill) cut is evaluated first by the relaunch
    (`Workdir.evaluation_due`), with the parameters the relaunch has: its rows keep the
    point (`evaluation_at`) that names the evaluation, and their `actor_steps` place it on
    a curve."""

    def __init__(
        self,
        experiment: Experiment,
        environment_spec: specs.EnvironmentSpec,
        index: int,
        variable_source: Any,
        counter: Any,
        logger_factory: Callable[..., Any],
        *,
        workdir: str,
        max_actor_steps: int = 0,
        lifetime: NodeLifetime,
    ):
        """`workdir`: the run's, read for its `resume_point`."""
        prepare_node_process()
        self._lifetime = lifetime
        self._counter = counter
        self._evaluation = experiment.config.evaluation
        self._max_actor_steps = max_actor_steps
        self._at_limit = threading.Event()
        # An earlier launch's record of its final evaluation: this launch may train on (a
        # higher limit, a stop), so it no longer says what the parameters were.
        self._final_evaluation = Workdir(workdir).final_evaluation(f"evaluator_{index}")
        self._final_evaluation.unlink(missing_ok=True)
        # The point an earlier launch's stop (or kill) cut while its episodes ran: evaluated
        # first, else that point kept only the episodes before the cut.
        self._due = Workdir(workdir).evaluation_due(f"evaluator_{index}")
        self._cut_at = _read_due(self._due)
        # The counts a relaunch starts from: the counter holds them only once the learner
        # has restored its checkpoint, which may be after this node's first look.
        self._resumed_at = resume_point(experiment, workdir)
        self._loop = make_acting_loop(
            experiment,
            environment_spec,
            index,
            None,
            None,
            variable_source,
            counter,
            logger_factory,
            evaluation=True,
            count_every=DISTRIBUTED_COUNT_EVERY,
            resumed_at=self._resumed_at,
        )
        warm_up(self._loop, environment_spec, f"evaluator_{index}")

    def run_evaluations(self, should_stop: StopFn, sleep: Callable[[float], bool]) -> None:
        """Evaluates whenever the actor steps pass the next multiple of `every_actor_steps`
        (a resumed run: the first multiple at or after its counts)."""
        every = int(self._evaluation.every_actor_steps)
        limit = self._max_actor_steps
        next_at = None
        while not should_stop():
            counted = int(self._counter.get_counts().get("actor_steps", 0))
            # Before the learner restored the counts, the counter says 0: a resumed run's
            # evaluations would then fall due at once, twice, with the same parameters. The
            # saved counts only schedule: the limit is the counter's to say (the learner may
            # restore an older checkpoint than the newest whose metadata reads).
            actor_steps = max(counted, self._resumed_at)
            if next_at is None:
                next_at = first_evaluation_at(actor_steps, every)
                if self._cut_at is not None:
                    next_at = min(next_at, self._cut_at)
            at_limit = bool(limit) and counted >= limit
            if at_limit and not self._at_limit.is_set():
                # The last evaluation (the one due at a multiple at or before the limit too):
                # the actors wait at the limit, so these are the run's final parameters.
                evaluate(self._loop, self._evaluation.episodes, should_stop, at=limit)
                if not should_stop():
                    self._due.unlink(missing_ok=True)  # the final one covers a cut one
                    self._mark_final_evaluation(counted, limit)
                    self._at_limit.set()
            elif not (limit and actor_steps >= limit) and actor_steps >= next_at:
                self._write_due(next_at)
                rows = evaluate(self._loop, self._evaluation.episodes, should_stop, at=next_at)
                if len(rows) >= int(self._evaluation.episodes):  # whole, a stop or not
                    self._due.unlink(missing_ok=True)
                next_at = next_evaluation_after(actor_steps, every)
            elif sleep(EVALUATOR_LOOK_S):
                break

    def _write_due(self, at: int) -> None:
        """Records the evaluation point whose episodes start now (`Workdir.evaluation_due`)."""
        _write_record(
            self._due,
            {"evaluation_at": int(at)},
            f"the evaluation at {at} actor steps was not recorded as due",
            "a stop during it will not have it evaluated again",
        )

    def _mark_final_evaluation(self, actor_steps: int, limit: int) -> None:
        """Records that the evaluation at the limit is whole (`Workdir.final_evaluation`):
        a relaunch is "finished" only then. The rows alone cannot say it: a periodic
        evaluation that the actors overtook at the limit logs counts at the limit too."""
        _write_record(
            self._final_evaluation,
            {"actor_steps": actor_steps, "max_actor_steps": limit},
            "the record of the final evaluation could not be written",
            "a relaunch of this workdir will evaluate once more",
        )

    def evaluated_at_limit(self) -> bool:
        """Whether the evaluation at `max_actor_steps` is done (the coordinator asks)."""
        return self._at_limit.is_set()

    def run(self) -> None:
        self.run_evaluations(self._lifetime.stopping, self._lifetime.wait_for_stop)
        self._lifetime.leave()
