"""The runtime's wiring, fast: replay schedule, non-blocking tables, variable client, learner
runner checkpoints, the single-process runner and the distributed program graph (Launchpad's
threaded test launch), all on a toy environment with the real TD3 agent."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import dm_env
import jax
import jax.numpy as jnp
import launchpad as lp
import numpy as np
import pytest
import reverb
from absl import flags
from absl.testing import absltest

from magi_lp.agent.variable_client import VariableClient
from magi_lp.engines.launchpad_engine import to_program
from magi_lp.engines.launchpad_lifetime import LaunchpadLifetime
from magi_lp.errors import ConfigError
from magi_lp.placement.gpu_inventory import GpuInventory
from magi_lp.replay.reverb_seam import without_rate_limit
from magi_lp.replay.schedule import ReplaySchedule
from magi_lp.runtime import control_nodes, learner_runner, nodes
from magi_lp.runtime.checkpointing import Checkpointer
from magi_lp.runtime.config import NODE_GROUPS, make_placement_plan
from magi_lp.runtime.learner_runner import LearnerRunner, ReplayCheckpoint
from magi_lp.runtime.loggers import LoggerFactory
from magi_lp.runtime.program import build_program
from magi_lp.runtime.single_process import run_single_process
from magi_lp.runtime.workdir import Workdir
from tests.e2e_utils import read_csv, run_python
from tests.runtime_toys import EPISODE_STEPS, ReachZero, toy_config, toy_experiment

# --- replay schedule -------------------------------------------------------------------------


def test_replay_schedule_updates_and_actor_steps_are_inverse():
    schedule = ReplaySchedule(min_replay_size=10, actor_steps_per_update=2.0, batch_size=8)
    assert schedule.samples_per_insert == 4
    assert [schedule.updates_due(s) for s in (0, 9, 10, 11, 12, 30)] == [0, 0, 1, 1, 2, 11]
    for updates in (1, 2, 11, 500):
        steps = schedule.actor_steps_after_updates(updates)
        assert schedule.updates_due(int(steps)) == updates
    assert schedule.actor_steps_after_updates(0) == 0
    # The same numbers inside a jitted function.
    jitted = jax.jit(schedule.actor_steps_after_updates)
    assert float(jitted(jnp.asarray(0))) == 0.0
    assert float(jitted(jnp.asarray(11))) == 30.0


def test_single_process_tables_keep_their_definition_but_never_block():
    limited = reverb.Table(
        name="t",
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=50,
        rate_limiter=ReplaySchedule(10, 2.0, 8).rate_limiter(),
        max_times_sampled=3,
    )
    table = without_rate_limit(limited)
    info, before = table.info, limited.info
    assert (info.name, info.max_size, info.max_times_sampled) == ("t", 50, 3)
    assert info.sampler_options == before.sampler_options
    assert info.remover_options == before.remover_options
    assert info.rate_limiter_info.min_size_to_sample == 1
    # One item is enough to sample, however many samples were drawn.
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.zeros(2, np.float32), {"t": 1.0})
        samples = list(client.sample("t", num_samples=3))
        assert len(samples) == 3
    finally:
        server.stop()


# --- variable client -------------------------------------------------------------------------


class _SlowSource:
    def __init__(self):
        self.version = 0
        self.calls = 0
        self.release = threading.Event()
        self.release.set()

    def get_variables(self, names):
        self.calls += 1
        self.release.wait(5)
        return [{"w": np.full(2, self.version, np.float32)} for _ in names]


def test_variable_client_pulls_every_period_without_blocking():
    source = _SlowSource()
    client = VariableClient(source, "policy", update_period=3)
    first = client.params  # the one blocking fetch
    assert isinstance(first["w"], jax.Array)  # placed on this process's device once per pull
    assert float(first["w"][0]) == 0 and source.calls == 1
    source.version = 1
    source.release.clear()  # the next fetch hangs until released
    start = time.monotonic()
    for _ in range(3):
        client.update()
    assert time.monotonic() - start < 1.0  # acting never waits for a fetch
    assert float(client.params["w"][0]) == 0  # old parameters meanwhile
    source.release.set()
    deadline = time.monotonic() + 5
    while float(client.params["w"][0]) != 1 and time.monotonic() < deadline:
        client.update()
        time.sleep(0.01)
    assert float(client.params["w"][0]) == 1
    client.close()


# --- learner runner --------------------------------------------------------------------------


class _CountingLearner:
    def __init__(self):
        self.state = {"steps": np.zeros((), np.int32), "w": np.zeros(3, np.float32)}

    def step(self):
        self.state = {"steps": self.state["steps"] + 1, "w": self.state["w"] + 1}

    def get_variables(self, names):
        return [self.state for _ in names]

    def save(self):
        return self.state

    def restore(self, state):
        self.state = state


def test_learner_runner_checkpoints_every_period_and_restores_counts(tmp_path):
    now = [0.0]
    counts = {"actor_steps": 0}
    runner = LearnerRunner(
        _CountingLearner(),
        Checkpointer(tmp_path),
        checkpoint_minutes=1.0,
        get_counts=lambda: dict(counts),
        clock=lambda: now[0],
    )
    for _ in range(3):
        runner.step()
    assert Checkpointer(tmp_path).all_steps() == []  # not due yet
    now[0] = 61.0
    counts["actor_steps"] = 40
    runner.step()  # due: saves step 4
    runner.step()
    assert Checkpointer(tmp_path).all_steps() == [4]
    runner.save()  # at stop
    assert Checkpointer(tmp_path).all_steps() == [4, 5]

    restored = {}
    again = LearnerRunner(
        _CountingLearner(), Checkpointer(tmp_path), restore_counts=restored.update
    )
    assert again.restored_step == 5 and again.steps == 5
    # The counts say the learner's step even where the counter had none (a stop before the
    # first update was saved without one, and the launcher could not say where it stood).
    assert restored == {"actor_steps": 40, "learner_steps": 5}
    np.testing.assert_array_equal(again.learner.save()["w"], np.full(3, 5, np.float32))


def test_a_checkpoint_whose_counts_cannot_be_read_is_not_written(tmp_path):
    """A killed counter: the save wrote these parameters with the counts of the save before,
    and the relaunch counted the actors' steps since then again behind a learner that had
    taken them (its learner_steps behind the checkpoint's step)."""
    now = [0.0]
    counts: dict | None = {"actor_steps": 10}

    def get_counts():
        if counts is None:
            raise ConnectionError("the counter is gone")
        return dict(counts)

    runner = LearnerRunner(
        _CountingLearner(),
        Checkpointer(tmp_path),
        checkpoint_minutes=1.0,
        get_counts=get_counts,
        clock=lambda: now[0],
    )
    runner.step()
    runner.save()
    assert Checkpointer(tmp_path).all_steps() == [1]
    counts = None
    now[0] = 61.0
    runner.step()  # a periodic save is due: skipped, and not tried at every step after
    runner.step()
    runner.save()  # at stop: skipped too, not a failure of the stop
    assert Checkpointer(tmp_path).all_steps() == [1]
    again = LearnerRunner(_CountingLearner(), Checkpointer(tmp_path))
    assert again.restored_step == 1 and again.restored_counts == {
        "actor_steps": 10,
        "learner_steps": 1,
    }


def test_the_replay_checkpoint_is_written_while_the_replay_holds_its_writes(tmp_path):
    """The device store's saved arrays are its own, and its next insert deletes them: the
    writes wait (`ReplayCheckpoint.hold`) until its checkpoint is written."""
    events: list[str] = []

    @contextlib.contextmanager
    def hold():
        events.append("hold")
        yield
        events.append("release")

    class _Recorded(Checkpointer):
        def save(self, step, state, metadata=None):
            events.append(f"write {step}")
            return super().save(step, state, metadata)

    def save_replay():
        events.append("save")
        return {"items": np.arange(4)}

    replay = ReplayCheckpoint(_Recorded(tmp_path / "replay"), save_replay, lambda s: None, hold)
    runner = LearnerRunner(_CountingLearner(), Checkpointer(tmp_path / "learner"), replay=replay)
    runner.step()
    runner.save()
    assert events == ["hold", "save", "write 1", "release"]


@pytest.mark.parametrize("fails", [False, True], ids=["stop", "failed-step"])
def test_a_stop_takes_the_steps_on_their_way_into_the_replay_before_the_final_save(tmp_path, fails):
    """The device store's queue holds steps the actors counted: a stop takes them in, then
    saves the replay with them. After a failed step (a replay or counter gone) it does not
    try."""
    events: list[str] = []
    stop = threading.Event()

    def take_the_rest() -> int:
        events.append("take the rest")
        return 3

    def save_replay():
        events.append("save replay")
        return {"items": np.arange(4)}

    replay = ReplayCheckpoint(
        Checkpointer(tmp_path / "replay"), save_replay, lambda s: None, take_the_rest=take_the_rest
    )
    learner = _FailingLearner(fail_at=3) if fails else _CountingLearner()
    runner = LearnerRunner(learner, Checkpointer(tmp_path / "learner"), replay=replay)
    threading.Timer(0.3, stop.set).start()
    if fails:
        with pytest.raises(ConnectionError):
            runner.run(stop.is_set, poll_s=0.01)
        assert events == ["save replay"]
    else:
        runner.run(stop.is_set, poll_s=0.01)
        assert events == ["take the rest", "save replay"]


def test_the_rest_is_taken_after_a_periodic_save_in_flight(tmp_path):
    """A stop that lands while the step thread writes a periodic checkpoint (whose replay
    write holds the store): the drain, stalled, read as done and the queue's steps were
    lost. The rest is taken once that save has ended."""
    events: list[str] = []
    stop = threading.Event()
    now = [0.0]

    def save_replay():
        if not events:  # the first save: a periodic one, and the stop lands in it
            events.append("periodic save starts")
            stop.set()
            time.sleep(1.5)  # past the runner's wait for the step in flight
            events.append("periodic save ends")
        else:
            events.append("final save")
        return {"items": np.arange(4)}

    def take_the_rest() -> int:
        events.append("take the rest")
        return 0

    replay = ReplayCheckpoint(
        Checkpointer(tmp_path / "replay", max_to_keep=1), save_replay, lambda s: None,
        take_the_rest=take_the_rest,
    )  # fmt: skip

    def clock() -> float:
        now[0] += 61.0  # every step's periodic save is due
        return now[0]

    runner = LearnerRunner(
        _CountingLearner(), Checkpointer(tmp_path / "learner"), replay=replay,
        checkpoint_minutes=1.0, clock=clock,
    )  # fmt: skip
    runner.run(stop.is_set, poll_s=0.01)
    assert events == [
        "periodic save starts",
        "periodic save ends",
        "take the rest",
        "final save",
    ]


def test_a_replay_with_a_restore_target_of_none_comes_back_in_its_saved_shapes(tmp_path):
    """The host store saves the arena bytes it holds, more than a fresh store's: its
    `restore_target` (None) restores the saved shapes, where the fresh store's `save` as the
    target was refused as another replay size."""
    held = {"arena": np.arange(3, dtype=np.uint8)}
    restored: list = []

    def runner(restore_target) -> LearnerRunner:
        replay = ReplayCheckpoint(
            Checkpointer(tmp_path / "replay", max_to_keep=1),
            lambda: dict(held),
            restored.append,
            restore_target=restore_target,
        )
        return LearnerRunner(_CountingLearner(), Checkpointer(tmp_path / "learner"), replay=replay)

    first = runner(lambda: None)
    held["arena"] = np.arange(40, dtype=np.uint8)
    first.step()
    first.save()
    held["arena"] = np.zeros(1, np.uint8)  # a fresh store: less in use
    with pytest.raises(ConfigError, match="does not match"):
        runner(None)  # the fresh store's save() as the target
    again = runner(lambda: None)
    assert again.restored_replay_step == 1
    np.testing.assert_array_equal(restored[-1]["arena"], np.arange(40, dtype=np.uint8))


def test_a_second_save_at_one_learner_step_writes_the_replay_again(tmp_path):
    """Two stops at one learner step (the warm-up: actors go on, the learner waits): the
    second wrote only the learner's metadata, and the relaunch restored the first replay
    beside the second's counts (actor_steps 7 with the replay of actor step 1)."""
    table = {"items": np.full(8, 1)}  # a fixed shape, as a replay's arrays: 1 item

    def runner() -> LearnerRunner:
        replay = ReplayCheckpoint(
            Checkpointer(tmp_path / "replay", max_to_keep=1),
            lambda: dict(table),
            lambda saved: table.update(saved),
        )
        return LearnerRunner(
            _CountingLearner(), Checkpointer(tmp_path / "learner"), replay=replay,
            get_counts=lambda: {"actor_steps": int(table["items"][0])},
        )  # fmt: skip

    runner().save()  # a stop during the warm-up: learner step 0, one item
    relaunched = runner()  # the table restored, then more items, then a stop at step 0 again
    table["items"] = np.full(8, 7)
    relaunched.save()
    table["items"] = np.full(8, 0)
    again = runner()
    assert again.restored_step == 0
    assert again.restored_counts == {"actor_steps": 7, "learner_steps": 0}  # step 0, said
    np.testing.assert_array_equal(table["items"], np.full(8, 7))
    assert Checkpointer(tmp_path / "replay").all_steps() == [1]  # past step 0, which was taken


class _FailingLearner(_CountingLearner):
    """Steps until its `fail_at`th step, which raises (a dead replay on Ray raises at once).
    `diverge`: "whole" - the step before it leaves a non-finite state; "failed" - the failing
    step puts a non-finite state in the learner before it raises."""

    def __init__(self, fail_at: int, diverge: str = ""):
        super().__init__()
        self.fail_at, self.diverge = fail_at, diverge

    def step(self):
        nan = {**self.state, "w": np.full(3, np.nan, np.float32)}
        if int(self.state["steps"]) + 1 == self.fail_at:
            if self.diverge == "failed":
                self.state = nan
            raise ConnectionError("the replay is gone")
        super().step()
        if self.diverge == "whole" and int(self.state["steps"]) + 1 == self.fail_at:
            self.state = {**nan, "steps": self.state["steps"]}


@pytest.mark.parametrize(
    ("diverge", "saved"), [("", [4]), ("failed", [4]), ("whole", [])],
    ids=["peer-died", "the-failed-step-diverged", "a-whole-step-diverged"],
)  # fmt: skip
def test_a_failed_step_saves_the_last_whole_state_unless_it_is_not_finite(tmp_path, diverge, saved):
    """On Ray a killed replay or counter made the learner raise at once, without the save a
    stop makes: the relaunch redid every step since the last periodic checkpoint. What the
    failed step left in the learner is not what is saved."""
    runner = LearnerRunner(
        _FailingLearner(fail_at=5, diverge=diverge),
        Checkpointer(tmp_path),
        checkpoint_minutes=60.0,
        get_counts=lambda: {"actor_steps": 8},
    )
    with pytest.raises(ConnectionError, match="the replay is gone"):
        runner.run(lambda: False, poll_s=0.01)
    assert Checkpointer(tmp_path).all_steps() == saved
    if saved:
        state = LearnerRunner(_CountingLearner(), Checkpointer(tmp_path)).learner.save()
        assert int(state["steps"]) == 4 and np.all(np.isfinite(state["w"]))


class _SlowToReturnLearner(_CountingLearner):
    """As JaxLearner on an asynchronous device: a step takes its new state and counts itself
    (`counts`, the program's counter), then waits for the update before it returns; `inside`
    is set while it waits."""

    def __init__(self, counts: dict, wait_s: float):
        super().__init__()
        self.counts, self.wait_s = counts, wait_s
        self.inside = threading.Event()

    def step(self):
        super().step()
        self.counts["learner_steps"] = self.counts.get("learner_steps", 0) + 1
        self.inside.set()
        time.sleep(self.wait_s)
        self.inside.clear()


def _saved_step_state_and_counts(folder: Path) -> tuple[int, int, int]:
    again = LearnerRunner(_CountingLearner(), Checkpointer(folder))
    state_steps = int(again.learner.save()["steps"])
    return again.restored_step, state_steps, again.restored_counts["learner_steps"]


@pytest.mark.parametrize("finishes", [True, False], ids=["waited-for", "left-out"])
def test_a_stop_during_a_step_in_flight_saves_a_state_its_number_and_counts_agree(
    tmp_path, monkeypatch, finishes
):
    """The learner node: the stop came while its step thread waited inside a step that had
    already taken its new state and counted it, and the save wrote that state under the
    step before (checkpoint 1435 holding learner_steps 1436: the relaunch's log went on at
    1437). The step in flight ends within the wait and is saved, or is left out of the
    state and of the counts."""
    if not finishes:
        monkeypatch.setattr(learner_runner, "FINISH_STEP_MAX_S", 0.01)
    counts: dict = {}
    learner = _SlowToReturnLearner(counts, wait_s=0.3 if finishes else 1.0)
    runner = LearnerRunner(
        learner, Checkpointer(tmp_path), checkpoint_minutes=60.0, get_counts=lambda: dict(counts)
    )

    def stop() -> bool:  # once a few steps are whole, and then inside the next one
        return runner.steps >= 3 and learner.inside.is_set()

    runner.run(stop, poll_s=0.01)
    step, state_steps, counted = _saved_step_state_and_counts(tmp_path)
    assert step == state_steps == counted >= 3
    assert counts["learner_steps"] == step + (0 if finishes else 1)  # the counter's own


def test_a_ctrl_c_during_a_step_in_the_main_thread_ends_after_the_step(tmp_path):
    """The single-process runner steps in the main thread: a Ctrl-C that cut a step after it
    had taken its new state left the runner a step behind the learner and its counts."""
    counts: dict = {}
    learner = _SlowToReturnLearner(counts, wait_s=0.5)
    runner = LearnerRunner(
        learner, Checkpointer(tmp_path), checkpoint_minutes=60.0, get_counts=lambda: dict(counts)
    )
    runner.step()
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        runner.step()  # the Ctrl-C comes while it waits, after the new state
    timer.join()
    assert runner.steps == 2 == counts["learner_steps"]
    runner.save()
    assert _saved_step_state_and_counts(tmp_path) == (2, 2, 2)


# --- single-process runner -------------------------------------------------------------------


@pytest.mark.integration  # a real Reverb server and environment, ~15 s
def test_single_process_run_learns_on_schedule_and_resumes(tmp_path):
    config = toy_config(max_actor_steps=100)
    experiment = toy_experiment(config)
    factory = LoggerFactory.from_config(tmp_path, config.logging)
    result = run_single_process(
        experiment, workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    schedule = experiment.builder.replay_schedule()
    assert result.actor_steps == 100 and result.episodes == 100 // EPISODE_STEPS
    assert result.learner_steps == schedule.updates_due(100)
    assert result.resumed_from_step is None and not result.stopped_by_user
    assert len(result.evaluation_returns) == 2  # at the start and at the end
    assert Checkpointer(Workdir(tmp_path).learner_checkpoints).latest_step() == result.learner_steps
    learner_rows = read_csv(Workdir(tmp_path).log_csv("learner"))
    assert len(learner_rows) == result.learner_steps
    assert all(np.isfinite(float(row["critic_loss"])) for row in learner_rows)

    # The same workdir resumes: counts continue, the learner starts from its checkpoint.
    config.max_actor_steps = 150
    again = run_single_process(
        toy_experiment(config), workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    assert again.resumed_from_step == result.learner_steps
    assert again.actor_steps == 150
    # The replay starts empty again: learning resumes once it holds min_replay_size items.
    assert again.learner_steps == result.learner_steps + schedule.updates_due(50)


@pytest.mark.integration  # a real Reverb server and environment, ~15 s
def test_a_resumed_run_with_its_replay_restored_keeps_the_uninterrupted_ratio(tmp_path):
    """With the replay restored from its checkpoint the schedule goes on from the run's counts:
    the relaunch ends with as many updates as one run of all the steps (the learn check's runs
    stop and resume this way; counting from the relaunch skipped min_replay_size steps' worth
    of updates at each resume)."""
    config = toy_config(max_actor_steps=100)
    config.checkpoint.reverb = True
    factory = LoggerFactory.from_config(tmp_path, config.logging)
    experiment = toy_experiment(config)
    schedule = experiment.builder.replay_schedule()
    first = run_single_process(
        experiment, workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    assert first.learner_steps == schedule.updates_due(100)
    config.max_actor_steps = 150
    again = run_single_process(
        toy_experiment(config), workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    assert again.resumed_from_step == first.learner_steps and again.actor_steps == 150
    assert schedule.updates_due(150) != first.learner_steps + schedule.updates_due(50)
    assert again.learner_steps == schedule.updates_due(150)


class _RecordedReachZero(ReachZero):
    """ReachZero that notes each episode's start and each action in `log`."""

    def __init__(self, seed: int, log: dict[str, list[float]]):
        super().__init__(seed)
        self._log = log

    def reset(self) -> dm_env.TimeStep:
        timestep = super().reset()
        self._log["starts"].append(float(timestep.observation[0]))
        return timestep

    def step(self, action) -> dm_env.TimeStep:
        self._log["actions"].append(float(np.asarray(action)[0]))
        return super().step(action)


def _recorded_launch(workdir: Path, max_actor_steps: int) -> dict[str, dict[str, list[float]]]:
    """One single-process launch of the toy in `workdir`; what its actor's and evaluator's
    environments saw: episode starts (drawn from the environment's seed only) and actions."""
    config = toy_config(max_actor_steps=max_actor_steps)
    record = {role: {"starts": [], "actions": []} for role in ("actor", "evaluator")}

    def make(seed: int, evaluation: bool) -> ReachZero:
        return _RecordedReachZero(seed, record["evaluator" if evaluation else "actor"])

    experiment = dataclasses.replace(toy_experiment(config), environment_factory=make)
    factory = LoggerFactory.from_config(workdir, config.logging)
    run_single_process(experiment, workdir=str(workdir), logger_factory=factory, progress=False)
    return record


@pytest.mark.integration  # a real Reverb server and environment, 4 launches, ~10 s
def test_a_resumed_run_draws_fresh_acting_streams_the_same_from_the_same_checkpoint(tmp_path):
    """The checkpoint holds no actor or environment random state: a resume must not replay
    the first launch's episodes and exploration (a reacher's targets, once per resume), and
    two resumes from one checkpoint must act alike (`seeding`'s resume point)."""
    first = _recorded_launch(tmp_path / "a", 100)
    # A new run is seeded as ever: the same starts and random-phase actions (the first 10
    # actor steps, before any update; the replay's sampling is not seeded).
    fresh = _recorded_launch(tmp_path / "fresh", 100)
    assert fresh["actor"]["starts"] == first["actor"]["starts"]
    assert fresh["actor"]["actions"][:10] == first["actor"]["actions"][:10]
    assert fresh["evaluator"]["starts"] == first["evaluator"]["starts"]
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    resumed, again = (_recorded_launch(tmp_path / name, 150) for name in ("a", "b"))
    n = len(resumed["actor"]["starts"])
    assert n == 50 // EPISODE_STEPS
    assert resumed["actor"]["starts"] != first["actor"]["starts"][:n]
    assert resumed["actor"]["actions"][:10] != first["actor"]["actions"][:10]
    m = len(resumed["evaluator"]["starts"])
    assert m and resumed["evaluator"]["starts"] != first["evaluator"]["starts"][:m]
    # From the same checkpoint, the same streams (before the first update of the resume).
    assert again["actor"]["starts"] == resumed["actor"]["starts"]
    assert again["actor"]["actions"][:10] == resumed["actor"]["actions"][:10]
    assert again["evaluator"]["starts"] == resumed["evaluator"]["starts"]


@pytest.mark.integration  # a real Reverb server and environment, ~10 s
def test_single_process_run_stops_and_evaluates_at_exact_step_counts(tmp_path):
    # Neither the limit nor the evaluation points are at an episode's end (10 steps).
    config = toy_config(max_actor_steps=137)
    config.evaluation.every_actor_steps = 45
    factory = LoggerFactory.from_config(tmp_path, config.logging)
    result = run_single_process(
        toy_experiment(config), workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    assert result.actor_steps == 137
    evaluations = read_csv(Workdir(tmp_path).log_csv("evaluator_0"))
    # (The first row comes before any actor step was counted: its actor_steps is empty.)
    assert [int(row["actor_steps"] or 0) for row in evaluations] == [0, 45, 90, 135, 137]
    assert [row["evaluation_at"] for row in evaluations] == ["0", "45", "90", "135", "137"]
    # Resumed to 150: the next point (180) lies beyond it, so only the new limit evaluates,
    # now over 3 episodes. A time filter that drops rows thins the actors' rows (one per
    # episode) but never an evaluation's.
    config.max_actor_steps = 150
    config.evaluation.episodes = 3
    config.logging.time_delta = 3600.0
    factory = LoggerFactory.from_config(tmp_path, config.logging)
    actor_rows_before = len(read_csv(Workdir(tmp_path).log_csv("actor_0")))
    again = run_single_process(
        toy_experiment(config), workdir=str(tmp_path), logger_factory=factory, progress=False
    )
    assert again.actor_steps == 150
    evaluations = read_csv(Workdir(tmp_path).log_csv("evaluator_0"))
    assert [int(row["actor_steps"] or 0) for row in evaluations][5:] == [150] * 3
    assert [row["evaluation_episode"] for row in evaluations][5:] == ["1", "2", "3"]
    assert len(read_csv(Workdir(tmp_path).log_csv("actor_0"))) == actor_rows_before + 1


@pytest.mark.integration  # a real Reverb server and environment, ~10 s
@pytest.mark.parametrize("where", ["in the final save", "in a close"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_after_the_limit_leaves_a_whole_save_and_a_finished_run(
    tmp_path, monkeypatch, where, signum
):
    """A Ctrl-C (or main.py's SIGTERM, which raises KeyboardInterrupt) that lands once the run
    reached its limit, in its final save or in a close after it (the acting loop's): the save
    is whole, the closes after it still run, and the run is finished, not stopped. It came
    out of the runner as a KeyboardInterrupt: it skipped the closes and the Reverb server's
    stop, and main.py said "interrupted before the run started; nothing was launched or
    written"."""
    from orbax.checkpoint.path import atomicity

    from magi_lp.runtime.acting_loop import ActingLoop

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signum, stop)
    sent: list[int] = []

    def send_once() -> None:
        if not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
            sum(range(1000))  # bytecode: an undeferred handler raises here

    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    loop_close, learner_close = ActingLoop.close, LearnerRunner.close
    closed: list[str] = []

    def finalize_after_a_signal(self, *args, **kwargs):
        send_once()
        return finalize(self, *args, **kwargs)

    def loop_close_after_a_signal(self):
        send_once()
        loop_close(self)

    def recorded_learner_close(self):
        learner_close(self)
        closed.append("learner")

    if where == "in the final save":
        monkeypatch.setattr(
            atomicity.AtomicRenameTemporaryPath, "finalize", finalize_after_a_signal
        )
    else:
        monkeypatch.setattr(ActingLoop, "close", loop_close_after_a_signal)
    monkeypatch.setattr(LearnerRunner, "close", recorded_learner_close)
    config = toy_config(max_actor_steps=60)  # checkpoints every 1000 minutes: the final save only
    factory = LoggerFactory.from_config(tmp_path, config.logging)
    try:
        result = run_single_process(
            toy_experiment(config), workdir=str(tmp_path), logger_factory=factory, progress=False
        )
    except KeyboardInterrupt:
        pytest.fail("the stop came out of the runner as a KeyboardInterrupt")
    finally:
        signal.signal(signum, previous)
    assert sent == [signum]
    assert result.actor_steps == 60 and not result.stopped_by_user
    saved = Checkpointer(Workdir(tmp_path).learner_checkpoints).latest_step()
    assert saved == result.learner_steps > 0
    assert closed == ["learner"]  # the closes went on (the Reverb server's stop comes after)


def _evaluator(
    monkeypatch, steps: list[int], limit: int, until: int, workdir: Path | None = None
) -> tuple[Any, list[int]]:
    """An EvaluatorNode over a counter at `steps[0]` (every 100 actor steps, limit `limit`, 0
    for none) whose evaluations are recorded and move the counts by 70 until `until`; its
    record of the final evaluation goes to `workdir` (default: none is expected)."""
    evaluated_at: list[int] = []

    def evaluate(loop, episodes, should_stop, *, at):
        assert at <= steps[0] and (limit == 0 or at <= limit)  # its point: passed, not past
        evaluated_at.append(steps[0])
        if steps[0] < until:
            steps[0] += 70
        return [{}] * episodes

    monkeypatch.setattr(nodes, "evaluate", evaluate)
    node = nodes.EvaluatorNode.__new__(nodes.EvaluatorNode)
    node._counter = mock.Mock(get_counts=lambda: {"actor_steps": steps[0]})
    node._evaluation = toy_config().evaluation  # every 100 actor steps
    node._loop = None
    node._max_actor_steps = limit
    node._at_limit = threading.Event()
    node._final_evaluation = Workdir(workdir or "/nonexistent").final_evaluation("evaluator_0")
    node._due = Workdir(workdir or "/nonexistent").evaluation_due("evaluator_0")
    node._cut_at = None
    node._resumed_at = 0
    return node, evaluated_at


@pytest.mark.parametrize(
    ("start", "expected"),
    [(0, [0, 110, 220, 330]), (130, [210, 320])],  # a new run; one resumed at 130 steps
)
def test_distributed_evaluator_evaluates_once_per_multiple_passed(monkeypatch, start, expected):
    # The actors report in batches: the counts move by 40 between two looks, and by 70 while
    # an evaluation runs. Each multiple of 100 is evaluated once, at the first look at or
    # after it (a resumed run: from the first multiple at or after its counts).
    steps = [start]
    node, evaluated_at = _evaluator(monkeypatch, steps, limit=0, until=10**9)

    def sleep(seconds):
        steps[0] += 40
        return False

    node.run_evaluations(lambda: steps[0] > 330, sleep)
    assert evaluated_at == expected


def test_a_resumed_evaluator_waits_for_its_first_multiple_before_the_counts_are_restored(
    monkeypatch,
):
    # A relaunch at 130 saved actor steps: the counter says 0 until the learner has restored
    # the counts, then 130 and on. The evaluations are those of the run resumed at 130
    # above, not one at once (with the parameters of the stop) and one more right after.
    steps = [0]
    node, evaluated_at = _evaluator(monkeypatch, steps, limit=0, until=10**9)
    node._resumed_at = 130
    looks = [0]

    def sleep(seconds):
        looks[0] += 1
        steps[0] = 130 if looks[0] == 1 else steps[0] + 40
        return False

    node.run_evaluations(lambda: steps[0] > 330, sleep)
    assert evaluated_at == [210, 320]


def test_distributed_evaluator_evaluates_once_more_at_the_limit(monkeypatch, tmp_path):
    # Limit 250: evaluations at 0, 110 and 220 by the schedule; the actors stop at 290 (the
    # counts move in batches); once there, one evaluation of the final parameters, then none,
    # recorded for a relaunch to know the run finished.
    steps = [0]
    node, evaluated_at = _evaluator(monkeypatch, steps, limit=250, until=250, workdir=tmp_path)
    looks = [0]

    def sleep(seconds):
        looks[0] += 1
        steps[0] = max(steps[0], min(steps[0] + 40, 290))
        return False

    assert not node.evaluated_at_limit()
    node.run_evaluations(lambda: looks[0] > 20, sleep)
    assert evaluated_at == [0, 110, 220, 290]
    assert node.evaluated_at_limit()
    record = json.loads(Workdir(tmp_path).final_evaluation("evaluator_0").read_text())
    assert record == {"actor_steps": 290, "max_actor_steps": 250}


def test_a_stop_in_the_evaluation_at_the_limit_records_no_final_evaluation(monkeypatch, tmp_path):
    steps = [290]
    node, evaluated_at = _evaluator(monkeypatch, steps, limit=250, until=0, workdir=tmp_path)
    stopped = [False]

    def evaluate_then_stop(loop, episodes, should_stop, *, at):
        evaluated_at.append(steps[0])
        stopped[0] = True  # a stop lands while its episodes run: the evaluation is cut short

    monkeypatch.setattr(nodes, "evaluate", evaluate_then_stop)
    node.run_evaluations(lambda: stopped[0], lambda seconds: False)
    assert evaluated_at == [290] and not node.evaluated_at_limit()
    assert not Workdir(tmp_path).final_evaluation("evaluator_0").exists()


def test_an_evaluation_a_stop_cuts_is_the_relaunchs_first(monkeypatch, tmp_path):
    """Cut at 200 by a stop (the actors went on to 270 meanwhile), the relaunch at 270 used
    to evaluate next at 300: the point 200 kept the episodes before the cut only."""
    steps = [200]
    node, _ = _evaluator(monkeypatch, steps, limit=0, until=0, workdir=tmp_path)
    points: list[int] = []
    stopped = [False]

    def evaluate_then_stop(loop, episodes, should_stop, *, at):
        points.append(at)
        steps[0] = 270
        stopped[0] = True  # a stop lands while its episodes run
        return [{}] * (episodes - 1)  # cut: one short

    monkeypatch.setattr(nodes, "evaluate", evaluate_then_stop)
    node.run_evaluations(lambda: stopped[0], lambda seconds: False)
    due = Workdir(tmp_path).evaluation_due("evaluator_0")
    assert points == [200] and json.loads(due.read_text()) == {"evaluation_at": 200}

    # The relaunch (resumed at 270): 200 at once, then the schedule (300, 400); once whole,
    # the record is gone.
    def evaluate(loop, episodes, should_stop, *, at):
        points.append(at)
        return [{}] * episodes

    monkeypatch.setattr(nodes, "evaluate", evaluate)
    again, _ = _evaluator(monkeypatch, steps, limit=0, until=0, workdir=tmp_path)
    monkeypatch.setattr(nodes, "evaluate", evaluate)
    again._resumed_at = 270
    again._cut_at = nodes._read_due(due)

    def sleep(seconds):
        steps[0] += 40
        return False

    again.run_evaluations(lambda: steps[0] > 460, sleep)
    assert points == [200, 200, 300, 400]
    assert not due.exists()


def test_a_whole_evaluation_a_stop_lands_right_after_is_not_redone(monkeypatch, tmp_path):
    steps = [200]
    node, _ = _evaluator(monkeypatch, steps, limit=0, until=0, workdir=tmp_path)
    stopped = [False]

    def evaluate_then_stop(loop, episodes, should_stop, *, at):
        stopped[0] = True  # after the last episode ended
        return [{}] * episodes

    monkeypatch.setattr(nodes, "evaluate", evaluate_then_stop)
    node.run_evaluations(lambda: stopped[0], lambda seconds: False)
    assert not Workdir(tmp_path).evaluation_due("evaluator_0").exists()


def test_an_unreadable_record_of_a_cut_evaluation_is_said_and_ignored(tmp_path, capsys):
    due = Workdir(tmp_path).evaluation_due("evaluator_0")
    due.parent.mkdir(parents=True)
    due.write_text("{")
    assert nodes._read_due(due) is None
    assert "unreadable" in capsys.readouterr().err
    assert nodes._read_due(tmp_path / "missing.json") is None


def test_an_evaluator_at_the_limit_by_the_saved_counts_waits_for_the_counters(
    monkeypatch, tmp_path
):
    # The newest checkpoint's metadata says 300 (past the limit of 250), but its state did not
    # read and the learner restored an older one at 200: the counter says 0, then 200, and the
    # actors train on (40 a look). The final evaluation is the first look at or past the
    # limit's (280), not one at once of the restored parameters; none before it.
    steps = [0]
    node, evaluated_at = _evaluator(monkeypatch, steps, limit=250, until=0, workdir=tmp_path)
    node._resumed_at = 300
    looks = [0]

    def sleep(seconds):
        looks[0] += 1
        steps[0] = 200 if looks[0] == 1 else min(steps[0] + 40, 290)
        return False

    node.run_evaluations(lambda: looks[0] > 10, sleep)
    assert evaluated_at == [280]
    record = json.loads(Workdir(tmp_path).final_evaluation("evaluator_0").read_text())
    assert record["actor_steps"] == 280


def test_a_new_launchs_evaluator_removes_the_record_of_an_earlier_final_evaluation(
    monkeypatch, tmp_path
):
    # A run finished at 100 (its record), relaunched at a higher limit: once this launch's
    # evaluator is made the record is gone, so a stop before its own final evaluation
    # cannot be read as a finished run with parameters no evaluation saw.
    record = Workdir(tmp_path).final_evaluation("evaluator_0")
    record.parent.mkdir(parents=True)
    record.write_text('{"actor_steps": 100, "max_actor_steps": 100}')
    # ...and the record of an evaluation a stop cut is read, for the first evaluation.
    Workdir(tmp_path).evaluation_due("evaluator_0").write_text('{"evaluation_at": 50}')
    for name in ("prepare_node_process", "warm_up"):
        monkeypatch.setattr(nodes, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(nodes, "resume_point", lambda experiment, workdir: 100)
    monkeypatch.setattr(nodes, "make_acting_loop", lambda *args, **kwargs: None)
    experiment = mock.Mock(config=toy_config())
    node = nodes.EvaluatorNode(
        experiment, None, 0, None, None, None, workdir=str(tmp_path), max_actor_steps=200,
        lifetime=None,
    )  # fmt: skip
    assert not record.exists()
    assert node._cut_at == 50


def test_coordinator_stops_at_the_limit_only_after_the_final_evaluations():
    class Evaluator:
        def __init__(self, done_after):
            self.asked, self.done_after = 0, done_after

        def evaluated_at_limit(self):
            self.asked += 1
            return self.asked > self.done_after

    class Lifetime:
        def __init__(self, stop_after=None):
            self.waits, self.stop_after, self.stopped = 0, stop_after, False

        def wait_for_stop(self, seconds):
            self.waits += 1
            return self.stop_after is not None and self.waits > self.stop_after

        def stop_program(self):
            self.stopped = True

    counter = mock.Mock(get_counts=lambda: {"actor_steps": 300})
    evaluators = (Evaluator(2), Evaluator(5))
    lifetime = Lifetime()
    coordinator = control_nodes.CoordinatorNode(
        counter, None, 300, evaluators, poll_seconds=0.0, lifetime=lifetime
    )
    coordinator.run()
    assert lifetime.stopped and evaluators[1].asked == 6 and evaluators[0].asked == 3

    # Ctrl-C while it waits: it stops waiting and leaves the stop to the launcher.
    lifetime = Lifetime(stop_after=3)
    coordinator = control_nodes.CoordinatorNode(
        counter, None, 300, (Evaluator(100),), poll_seconds=0.0, lifetime=lifetime
    )
    coordinator.run()
    assert not lifetime.stopped


# --- the distributed program graph -----------------------------------------------------------


@pytest.mark.integration  # builds the Launchpad program with real nodes, ~9 s
class ProgramWiringTest(absltest.TestCase):
    """build_program under Launchpad's threaded test launch, driven through node handles."""

    def setUp(self):
        super().setUp()
        if not flags.FLAGS.is_parsed():  # pytest, not absltest.main, runs this test
            flags.FLAGS.mark_as_parsed()

    def _actors_leave_before_the_replay(self) -> Callable[[], None]:
        """At the test's end, the actors stop and leave before Launchpad's teardown.

        That teardown stops every node at once; the replay server goes within milliseconds,
        and an actor then inside the Acme adder's end of episode (Reverb's `end_episode`, no
        timeout) waits for confirmations that never come. A node process is ended by its
        stop budget (`magi_lp.launch.node_lifetime`), but a thread cannot be, so the launch
        hung (2 runs in 7 with both cores busy). Returns the cleanup that tells the actors
        to stop and waits until they have left; register it after `lp.launch`.
        """
        actors_stop = threading.Event()
        told = LaunchpadLifetime.stopping
        patcher = mock.patch.object(
            LaunchpadLifetime, "stopping", lambda self: actors_stop.is_set() or told(self)
        )
        patcher.start()
        self.addCleanup(patcher.stop)

        def let_actors_go() -> None:
            actors_stop.set()
            deadline = time.monotonic() + 60
            while any(t.name == "actor" for t in threading.enumerate()):
                assert time.monotonic() < deadline, "the actors did not leave within 60 s"
                time.sleep(0.05)

        return let_actors_go

    @pytest.mark.timeout(300, method="thread")  # Launchpad's test launch owns the signals
    def test_nodes_are_wired_as_the_plan_says(self):
        workdir = tempfile.mkdtemp(prefix="magi_lp_wiring_")
        self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
        config = toy_config(max_actor_steps=60)
        config.num_actors = 2
        experiment = toy_experiment(config, rate_limited=False)
        plan = make_placement_plan(config, GpuInventory(reason="no GPU in this test"))
        factory = LoggerFactory.from_config(workdir, config.logging)
        graph = build_program(experiment, plan, workdir=workdir, logger_factory=factory)
        program = to_program(graph)

        assert set(program.groups) == set(plan.groups) == set(NODE_GROUPS)
        assert len(program.groups["actor"]) == 2
        (learner_node,) = program.groups["learner"]
        (coordinator_node,) = program.groups["coordinator"]
        (counter_node,) = program.groups["counter"]
        # The coordinator is driven through its handle; every other node runs.
        coordinator_node.disable_run()
        let_actors_go = self._actors_leave_before_the_replay()
        lp.launch(program, launch_type="test_mt", test_case=self)
        self.addCleanup(let_actors_go)  # runs before Launchpad's teardown (cleanups are LIFO)

        counter = counter_node.create_handle().dereference()
        learner = learner_node.create_handle().dereference()
        coordinator = coordinator_node.create_handle().dereference()
        deadline = time.monotonic() + 120
        while not coordinator.limit_reached() or not counter.get_counts().get("learner_steps"):
            assert time.monotonic() < deadline, counter.get_counts()
            time.sleep(0.2)
        counts = counter.get_counts()
        # Both actors stepped their own environments into the one counter; the learner
        # learned from what they wrote; the evaluator evaluated at start.
        assert counts["actor_steps"] >= 60 and counts["actor_episodes"] >= 6
        assert counts["learner_steps"] >= 1
        assert counts.get("evaluator_episodes", 0) >= 1
        (policy,) = learner.get_variables(["policy"])
        assert policy  # the TD3 actor's parameters, served over Courier
        saved = learner.save()  # a save while its step thread goes on, through Courier
        checkpoints = Checkpointer(Workdir(workdir).learner_checkpoints)
        assert saved >= 1 and saved in checkpoints.all_steps()
        _, metadata = checkpoints.restore(step=saved)
        assert metadata["counts"]["actor_steps"] >= 60
        assert metadata["counts"]["learner_steps"] >= saved


@pytest.mark.parametrize(("actor_steps", "written"), [(40, True), (60, False)])
def test_a_replay_in_the_learners_process_is_checkpointed_by_the_learner_at_a_stop(
    actor_steps, written
):
    """`colocate_learner_and_replay` with `checkpoint.reverb`: only the coordinator wrote the
    replay, at the limit; a Ctrl-C before it left none, though the README said every stop
    writes it. The learner writes it after its final save (not again at the limit)."""
    events: list[str] = []
    node = nodes.LearnerNode.__new__(nodes.LearnerNode)
    node._lifetime = mock.Mock(stopping=lambda: True, leave=lambda: events.append("leave"))
    node._runner = mock.Mock(
        run=lambda should_stop: events.append("final save"),
        last_counts={"actor_steps": actor_steps},
    )
    node._replay = mock.Mock(client=mock.Mock(checkpoint=lambda: events.append("replay") or "/p"))
    node._checkpoints_replay, node._max_actor_steps = True, 60
    node.run()
    assert events == (["final save", "replay", "leave"] if written else ["final save", "leave"])


def test_resume_point_is_the_actor_steps_of_the_newest_readable_checkpoint(tmp_path):
    experiment = toy_experiment(toy_config())
    assert nodes.resume_point(experiment, str(tmp_path)) == 0  # a new run
    checkpoints = Checkpointer(Workdir(tmp_path).learner_checkpoints)
    checkpoints.save(3, {"w": np.zeros(2)}, {"counts": {"actor_steps": 40, "learner_steps": 3}})
    checkpoints.save(5, {"w": np.ones(2)}, {"counts": {"actor_steps": 90, "learner_steps": 5}})
    assert nodes.resume_point(experiment, str(tmp_path)) == 90
    # A save at the same learner step with newer counts (the actors went on): the new counts.
    checkpoints.save(5, {"w": np.ones(2)}, {"counts": {"actor_steps": 95, "learner_steps": 5}})
    assert nodes.resume_point(experiment, str(tmp_path)) == 95
    # An unreadable newest metadata file: the one before (as the learner's restore falls back).
    (Workdir(tmp_path).learner_checkpoints / "5" / "metadata" / "metadata").write_text("{trunc")
    assert nodes.resume_point(experiment, str(tmp_path)) == 40
    # A run that saves no checkpoint starts afresh at each launch.
    experiment.config.checkpoint.enabled = False
    assert nodes.resume_point(experiment, str(tmp_path)) == 0


def test_distributed_actors_and_evaluators_seed_from_the_workdirs_resume_point(
    tmp_path, monkeypatch
):
    """Each actor and evaluator node reads the resume point from the workdir when it is
    built, so a relaunched program's acting streams are fresh ones, as in one process."""
    made: list[tuple[str, int]] = []

    def make_acting_loop(*args, evaluation=False, resumed_at=0, **kwargs):
        made.append(("evaluator" if evaluation else "actor", resumed_at))
        return mock.Mock()

    monkeypatch.setattr(nodes, "make_acting_loop", make_acting_loop)
    monkeypatch.setattr(nodes, "warm_up", lambda *args: None)
    config = toy_config()
    experiment = toy_experiment(config)
    plan = make_placement_plan(config, GpuInventory(reason="no GPU in this test"))
    factory = LoggerFactory.from_config(str(tmp_path), config.logging)
    graph = build_program(experiment, plan, workdir=str(tmp_path), logger_factory=factory)
    acting = [spec for spec in graph.nodes if spec.role in ("actor", "evaluator")]

    def build_all() -> list[tuple[str, int]]:
        made.clear()
        for spec in acting:
            spec.make(*spec.args, **spec.kwargs, lifetime=mock.Mock())
        return sorted(made)

    assert build_all() == [("actor", 0), ("evaluator", 0)]
    Checkpointer(Workdir(tmp_path).learner_checkpoints).save(
        7, {"w": np.zeros(2)}, {"counts": {"actor_steps": 120}}
    )
    assert build_all() == [("actor", 120), ("evaluator", 120)]


@pytest.mark.parametrize(
    ("envs_per_actor", "actors", "expected"), [(1, 1, 120), (1, 2, 60), (2, 2, 30)]
)
def test_a_resumed_actor_starts_from_its_share_of_the_runs_steps(envs_per_actor, actors, expected):
    """`make_acting_loop(resumed_at=...)` gives each environment's actor state its share of
    the run's steps (`ActorCore.resume`; TD3 counts them for its random first steps); an
    evaluator's policy starts as new."""
    config = toy_config()
    config.envs_per_actor = envs_per_actor
    experiment = toy_experiment(config)
    spec = experiment.get_environment_spec()
    handles = [mock.Mock(), mock.Mock(), mock.Mock(), mock.Mock()]
    # The store makes one actor's adders together (`ReplayStore.make_adders`): one each.
    handles[0].make_adders.side_effect = lambda spec, replay, writers, stop: [
        mock.Mock() for _ in writers
    ]
    loop = nodes.make_acting_loop(
        experiment, spec, 0, *handles, lambda *a, **k: mock.Mock(), resumed_at=120, actors=actors
    )
    state = loop.actor.actor.state if envs_per_actor == 1 else loop.actor._state
    np.testing.assert_array_equal(np.asarray(state.steps), [expected] * envs_per_actor)
    evaluator = nodes.make_acting_loop(
        experiment, spec, 0, None, None, mock.Mock(), mock.Mock(), lambda *a, **k: mock.Mock(),
        evaluation=True, resumed_at=120,
    )  # fmt: skip
    assert int(evaluator.actor.actor.state.steps) == 0


def test_resumed_seeds_are_fresh_distinct_and_leave_a_new_runs_seeds_as_they_were():
    from magi_lp.runtime import seeding

    roles = ("actor", "evaluator")
    new = {(role, j): seeding.node_seed(0, role, 0, j) for role in roles for j in (0, 1)}
    assert len(set(new.values())) == 4
    for resumed_at in (1, 2, 1000):
        resumed = {(r, j): seeding.node_seed(0, r, 0, j, resumed_at) for r, j in new}
        assert set(resumed.values()).isdisjoint(new.values())
        assert len(set(resumed.values())) == 4
        assert resumed == {(r, j): seeding.node_seed(0, r, 0, j, resumed_at) for r, j in new}
    assert seeding.node_seed(0, "actor", 0, 0, 1) != seeding.node_seed(0, "actor", 0, 0, 2)
    with pytest.raises(ValueError, match="resumed_at"):
        seeding.node_seed(0, "actor", resumed_at=-1)


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_the_control_and_evaluator_processes_start_without_tensorflow(tmp_path):
    """Each node's process unpickles its group's functions, as Launchpad's process entry does
    (`cloudpickle.load` of the group's job file): the counter's and the coordinator's bring in
    no ML framework, the evaluator's JAX alone (it acts, but never touches the replay), the
    learner's JAX, TensorFlow and Reverb."""
    import cloudpickle

    config = toy_config()
    experiment = toy_experiment(config)
    plan = make_placement_plan(config, GpuInventory(reason="no GPU in this test"))
    factory = LoggerFactory.from_config(str(tmp_path), config.logging)
    graph = build_program(experiment, plan, workdir=str(tmp_path), logger_factory=factory)
    program = to_program(graph)
    probe = (
        "import sys, cloudpickle; cloudpickle.load(open(sys.argv[1], 'rb')); "
        "print(*sorted(m for m in ('jax', 'tensorflow', 'reverb') if m in sys.modules))"
    )
    imported = {}
    for group in ("counter", "coordinator", "evaluator", "learner"):
        job = tmp_path / f"{group}.pkl"
        job.write_bytes(cloudpickle.dumps([n.function for n in program.groups[group]]))
        result = run_python(probe, str(job), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        imported[group] = result.stdout.split()
    assert imported == {
        "counter": [],
        "coordinator": [],
        "evaluator": ["jax"],
        "learner": ["jax", "reverb", "tensorflow"],
    }
