"""The pieces every runner assembles: learner, actor, evaluator and coordinator.

Each class here is an ordinary Python class (the Launchpad-examples style): the distributed
program wraps them in `lp.CourierNode`, which constructs them inside the node's own process,
and the single-process runner constructs the same classes directly. Constructors take handles
(or in-process objects) as arguments, build everything through the experiment's builder, and
call `prepare_node_process()` first so per-node settings apply before any framework allocates.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from absl import logging
from acme import specs
from acme.utils import counting

from magi_lp.runtime import seeding
from magi_lp.runtime.acting_loop import ActingLoop
from magi_lp.runtime.checkpointing import Checkpointer
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.learner_runner import LearnerRunner
from magi_lp.runtime.node_setup import prepare_node_process

StopFn = Callable[[], bool]


def frames_per_step(experiment: Experiment) -> int:
    """Environment frames per agent step (the action repeat), for frame-based logs."""
    env_config = experiment.config.get("env", None)
    return int(env_config.get("action_repeat", 1)) if env_config is not None else 1


def checkpoint_dir(workdir: str | Path) -> Path:
    """Where learner checkpoints live inside a workdir."""
    return Path(workdir) / "checkpoints" / "learner"


class LearnerNode:
    """The learner process: builds the learner, restores, steps, checkpoints."""

    def __init__(
        self,
        experiment: Experiment,
        environment_spec: specs.EnvironmentSpec,
        replay_client: Any,
        counter: Any,
        workdir: str,
        logger_factory: Callable[..., Any],
    ):
        prepare_node_process()
        config = experiment.config
        builder = experiment.builder
        parent_counter = counter
        self._counter = counting.Counter(parent_counter, prefix="learner", time_delta=0.0)
        networks = experiment.network_factory(environment_spec)
        dataset = builder.make_dataset_iterator(replay_client)
        learner = builder.make_learner(
            random_key=seeding.node_key(config.seed, "learner"),
            networks=networks,
            dataset=dataset,
            environment_spec=environment_spec,
            logger=logger_factory("learner", steps_key="learner_steps"),
            counter=self._counter,
        )
        checkpointer = Checkpointer(checkpoint_dir(workdir)) if config.checkpoint.enabled else None
        self._runner = LearnerRunner(
            learner,
            checkpointer,
            checkpoint_minutes=config.checkpoint.every_minutes,
            get_counts=parent_counter.get_counts,
            restore_counts=lambda counts: parent_counter.increment(**counts),
        )

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """Parameters for actors and evaluators."""
        return self._runner.get_variables(names)

    def save(self) -> int:
        """Checkpoints now; returns the learner step saved (the coordinator calls it at stop)."""
        self._runner.save()
        return self._runner.steps

    def step(self) -> None:
        """One learner step (used by the single-process runner)."""
        self._runner.step()

    @property
    def runner(self) -> LearnerRunner:
        """The learner runner (in-process use only)."""
        return self._runner

    def run(self) -> None:
        """Steps until the program stops (Launchpad calls this after serving starts)."""
        import launchpad as lp

        self._runner.run(lambda: lp.wait_for_stop(0))
        _leave_node_process()


class ActorNode:
    """An actor (or, with `evaluation=True`, an evaluator) and its environment loop."""

    def __init__(
        self,
        experiment: Experiment,
        environment_spec: specs.EnvironmentSpec,
        index: int,
        replay_client: Any,
        variable_source: Any,
        counter: Any,
        logger_factory: Callable[..., Any],
        *,
        evaluation: bool = False,
        actor_wrapper: Callable[[Any], Any] | None = None,
    ):
        """Builds the environment, policy, adder and actor of node `index`.

        `actor_wrapper` lets the single-process runner interleave learner steps with acting
        by wrapping the actor; distributed nodes leave it unset.
        """
        prepare_node_process()
        config = experiment.config
        builder = experiment.builder
        role = "evaluator" if evaluation else "actor"
        self._role = role
        self._index = index
        self._experiment = experiment
        environment = experiment.environment_factory(
            seeding.node_seed(config.seed, role, index), evaluation
        )
        networks = experiment.network_factory(environment_spec)
        policy = builder.make_policy(networks, environment_spec, evaluation)
        adder = None if evaluation else builder.make_adder(replay_client, environment_spec)
        self._actor = builder.make_actor(
            seeding.node_key(config.seed, role, index),
            policy,
            environment_spec,
            variable_source,
            adder,
        )
        if actor_wrapper is not None:
            self._actor = actor_wrapper(self._actor)
        self._counter = counter
        observers = []
        if evaluation:
            observers = [make() for make in experiment.evaluation_observers]
        self._loop = ActingLoop(
            environment,
            self._actor,
            counting.Counter(counter, prefix=role, time_delta=0.0),
            logger_factory(role, steps_key=f"{role}_steps", instance=index),
            should_update=not evaluation,
            frames_per_step=frames_per_step(experiment),
            observers=observers,
        )

    @property
    def loop(self) -> ActingLoop:
        """The acting loop (in-process use only)."""
        return self._loop

    @property
    def actor(self) -> Any:
        """The actor (in-process use only)."""
        return self._actor

    def run(self) -> None:
        """Acts until the program stops; evaluators evaluate every few actor steps."""
        import launchpad as lp

        def should_stop() -> bool:
            return lp.wait_for_stop(0)

        if self._role == "actor":
            self._loop.run(should_stop)
        else:
            self.run_evaluations(should_stop, lambda seconds: lp.wait_for_stop(seconds))
        _leave_node_process()

    def evaluate(self, should_stop: StopFn = lambda: False) -> list[dict]:
        """Pulls fresh parameters and runs `evaluation.episodes` episodes."""
        self._actor.update(wait=True)
        return self._loop.run(should_stop, num_episodes=self._experiment.config.evaluation.episodes)

    def run_evaluations(self, should_stop: StopFn, sleep: Callable[[float], bool]) -> None:
        """Evaluates once at start, then after every `evaluation.every_actor_steps` steps."""
        every = self._experiment.config.evaluation.every_actor_steps
        next_at = 0
        while not should_stop():
            actor_steps = int(self._counter.get_counts().get("actor_steps", 0))
            if actor_steps >= next_at:
                self.evaluate(should_stop)
                next_at = actor_steps + every
            elif sleep(1.0):
                break


def _leave_node_process() -> None:
    """Ends a node's process once its work is done and saved.

    A learner blocked in Reverb's sampler, or an adder flushing to a replay server that is
    already gone, keeps TensorFlow/Reverb threads alive that hold the process until
    Launchpad's 10 s kill; the checkpoint is written and logs are flushed per row, so there
    is nothing left to wait for.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class CoordinatorNode:
    """Stops the program once actors have taken `max_actor_steps` steps.

    Before stopping it asks the learner to checkpoint (and Reverb to checkpoint when
    configured), so a run that ends at its step limit always leaves a final checkpoint even
    when the learner is blocked waiting for replay.
    """

    def __init__(
        self,
        counter: Any,
        learner: Any,
        replay_client: Any,
        max_actor_steps: int,
        *,
        checkpoint_replay: bool = False,
        poll_seconds: float = 0.5,
    ):
        self._counter = counter
        self._learner = learner
        self._replay = replay_client
        self._max_actor_steps = max_actor_steps
        self._checkpoint_replay = checkpoint_replay
        self._poll_seconds = poll_seconds

    def run(self) -> None:
        import launchpad as lp

        while not lp.wait_for_stop(self._poll_seconds):
            counts = self._counter.get_counts()
            if counts.get("actor_steps", 0) >= self._max_actor_steps:
                logging.info("Reached %d actor steps: stopping.", self._max_actor_steps)
                self.finish()
                lp.stop()
                return

    def finish(self) -> None:
        """Final learner checkpoint (and replay checkpoint) before the stop."""
        start = time.monotonic()
        try:
            step = self._learner.save()
            logging.info("Final learner checkpoint at step %s", step)
        except Exception as error:  # stopping must go on
            logging.warning("Final learner checkpoint failed: %s", error)
        if self._checkpoint_replay:
            try:
                path = self._replay.checkpoint()
                logging.info("Replay checkpoint written to %s", path)
            except Exception as error:
                logging.warning("Replay checkpoint failed: %s", error)
        logging.info("Final checkpoints took %.1fs", time.monotonic() - start)


def new_counter() -> counting.Counter:
    """The program's step counter (its own node in the distributed program)."""
    return counting.Counter(time_delta=0.0)
