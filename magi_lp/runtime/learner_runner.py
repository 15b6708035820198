"""`LearnerRunner`: restore, step until stopped, checkpoint; what both runners drive.

The Launchpad learner node calls `run()` (step until the program stops); the single-process
runner calls `step()` itself. It restores the latest checkpoint from the workdir when there is
one, saves every `checkpoint_minutes` (through `PeriodicCheckpointer`) and once more at stop,
and serves parameters through `get_variables` (a Courier method in the distributed program).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import logging

from magi_lp import console
from magi_lp.agent.learner import Learner
from magi_lp.agent.variable_client import call_in_background
from magi_lp.launch.interrupts import stop_deferred
from magi_lp.runtime.checkpointing import (
    Checkpointer,
    CheckpointWriteError,
    PeriodicCheckpointer,
    Snapshot,
)


class CheckpointReadError(RuntimeError):
    """Checkpoints exist but none of them can be read; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class ReplayCheckpoint:
    """A replay saved beside the learner (`checkpoint.replay`): in its own folder, at the
    learner's steps (or past them, `LearnerRunner._save_replay`), so a learner checkpoint
    reads the same with or without it. `hold`: the
    writes to the replay wait while its checkpoint is written (what `save` returns may be
    the replay's own arrays)."""

    checkpointer: Checkpointer
    save: Callable[[], Any]
    restore: Callable[[Any], None]
    hold: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    take_the_rest: Callable[[], int] = lambda: 0
    """At a stop, before the final save: takes in the steps still on their way to the
    replay (`LearnerReplay.take_the_rest`); returns how many."""
    restore_target: Callable[[], Any] | None = None
    """What the checkpoint is restored into (None: `save`'s shapes, a fresh replay's). A
    `restore_target` that returns None restores the saved shapes as they are: the host
    store saves only the arena bytes it holds, fewer in a fresh store."""


FINISH_STEP_MAX_S = 1.0
"""At a stop, the longest the learner node waits for its step in flight to end (twice the
last step's time, at most this): the launcher's notice (10 s, then SIGKILL) is the final
save's. A step still in flight then is left out of the save and of its counts."""

LEARNER_STEPS = "learner_steps"
"""The program's count of learner steps (the learner counts under the prefix "learner")."""


class CountsUnreadableError(Exception):
    """The program's counter did not answer: a checkpoint now would pair this learner step
    with older counts, and a relaunch would go on from counts behind its parameters."""


class LearnerRunner:
    """Steps a learner and checkpoints it; restores from the workdir on start."""

    def __init__(
        self,
        learner: Learner,
        checkpointer: Checkpointer | None,
        *,
        checkpoint_minutes: float = 10.0,
        get_counts: Callable[[], dict[str, Any]] | None = None,
        restore_counts: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        closeables: Sequence[Any] = (),
        replay: ReplayCheckpoint | None = None,
        identity: Mapping[str, Any] | None = None,
    ):
        """Creates the runner and restores the latest checkpoint if there is one.

        Args:
          learner: the agent's learner.
          checkpointer: where checkpoints go; None disables checkpointing.
          checkpoint_minutes: time between periodic checkpoints.
          get_counts: returns the program's step counts, saved with each checkpoint so a
            resumed run continues counting where it stopped.
          restore_counts: puts restored counts back into the program's counter.
          clock: seconds, for the checkpoint period (tests pass a fake one).
          closeables: what `close()` closes with the runner (e.g. the learner's logger).
          replay: the replay to save with every checkpoint and restore with it.
          identity: the config sections that make the run what it is
            (`checkpoint_metadata.run_identity`), saved with each checkpoint as "config": a
            relaunch that gives others is refused before it starts.
        """
        self._closeables = list(closeables)
        self._learner = learner
        self._get_counts = get_counts
        self._identity = dict(identity or {})
        self._save_lock = threading.Lock()
        self.restored_step: int | None = None
        self.restored_counts: dict[str, Any] = {}
        restored = None
        if checkpointer is not None and checkpointer.latest_step() is not None:
            restored = checkpointer.restore_newest_readable(
                target_like=learner.save(), set_aside=True
            )
            if restored is None:
                raise CheckpointReadError(
                    f"no checkpoint in {checkpointer.directory} can be read (each one is named "
                    "above); move that folder away to start this workdir's learner afresh"
                )
        if restored is not None:
            self.restored_step, state, metadata = restored
            learner.restore(state)
            self.restored_counts = dict((metadata or {}).get("counts", {}))
            if restore_counts is not None and self.restored_counts:
                restore_counts(self.restored_counts)
            actor_steps = self.restored_counts.get("actor_steps")
            console.say(
                f"resuming from checkpoint {self.restored_step} in {checkpointer.directory}"
                + (f" (actor steps {int(actor_steps)})" if actor_steps is not None else ""),
                source="learner",
            )
        self._replay = replay
        self.restored_replay_step: int | None = None
        if replay is not None and replay.checkpointer.latest_step() is not None:
            found = replay.checkpointer.restore_newest_readable(
                target_like=(replay.restore_target or replay.save)(), set_aside=True
            )
            if found is not None:
                self.restored_replay_step, saved, _ = found
                replay.restore(saved)
                logging.info("Replay restored from its checkpoint at step %d", found[0])
        self._steps = self.restored_step or 0
        # The last whole step: its number and the state it left, the pair every checkpoint
        # writes. A step in flight may have put its new state in the learner (and counted it)
        # before it returned: saved then, the state was one step ahead of its number.
        self._whole: tuple[int, Any] = (self._steps, learner.save())
        self._whole_lock = threading.Lock()
        self._last_step_s: float | None = None
        self.last_counts: dict[str, Any] = dict(self.restored_counts)
        """The counts read for this runner's newest checkpoint (before: the restored ones)."""
        self._periodic = (
            None
            if checkpointer is None
            else PeriodicCheckpointer(checkpointer, checkpoint_minutes, self._snapshot, clock=clock)
        )

    def close(self) -> None:
        """Closes what the runner was given to close (in-process runs; nodes just exit)."""
        for closeable in self._closeables:
            closeable.close()

    @property
    def learner(self) -> Learner:
        """The wrapped learner."""
        return self._learner

    @property
    def steps(self) -> int:
        """Learner steps taken, including those before a restore."""
        return self._steps

    @property
    def last_saved_step(self) -> int | None:
        """The learner step of the newest checkpoint this runner wrote (None: none yet)."""
        return None if self._periodic is None else self._periodic.last_saved_step

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """Parameters for actors (a Courier method in the distributed program)."""
        return self._learner.get_variables(names)

    def step(self) -> None:
        """One learner step, then a checkpoint if one is due.

        A stop (SIGINT, SIGTERM) that comes during the step waits for its end (in the main
        thread, the single-process runner's): cut in the middle, the learner had already
        taken the new state and counted the step, and the save at stop wrote that state under
        the step before, with counts a step ahead of it (seen: checkpoint 1435 holding
        learner_steps 1436, the relaunch's log starting at 1437).
        """
        start = time.monotonic()
        with stop_deferred("the learner's step ends"):
            self._learner.step()
            self._steps += 1
            with self._whole_lock:
                self._whole = (self._steps, self._learner.save())
        self._last_step_s = time.monotonic() - start
        if self._periodic is not None:
            with self._save_lock:
                try:
                    self._periodic.maybe_save()
                except CheckpointWriteError as error:
                    # Training goes on (the disk may free up); the save at stop tries again
                    # and, if it fails too, makes the run fail.
                    console.say(f"periodic {error}", source="checkpoint")
                except CountsUnreadableError as error:
                    self._periodic.postpone()  # not again at every step
                    console.say(f"periodic checkpoint skipped: {error}", source="checkpoint")

    def save(self) -> None:
        """Saves a checkpoint now (also called at stop).

        Raises:
          CheckpointWriteError: the checkpoint could not be written (one line saying why).
        """
        if self._periodic is not None:
            with self._save_lock:
                try:
                    self._periodic.save_now()
                except CountsUnreadableError as error:
                    console.say(f"final checkpoint not written: {error}", source="checkpoint")

    def _snapshot(self) -> Snapshot:
        # The state before the counts: a step that ends between the two is then counted and
        # not saved (a relaunch does one update fewer), never saved and not counted (one
        # update more than the counts say).
        with self._whole_lock:
            steps, state = self._whole
        counts = self._counts_now()  # before any write: a save it refuses writes nothing
        if counts.get(LEARNER_STEPS) != steps:
            # A step in flight counts itself before it returns; the checkpoint holds the
            # whole steps only, and its counts say so (the relaunch's counter agrees). A
            # learner that has not yet updated has no count: its checkpoint says step 0.
            counts[LEARNER_STEPS] = steps
        if self._replay is not None:
            # Written first: a learner checkpoint then never names a replay that is missing.
            self._save_replay(steps)
        self.last_counts = dict(counts)
        metadata = {"counts": counts}
        if self._identity:
            metadata["config"] = self._identity
        return Snapshot(steps, state, metadata)

    def _save_replay(self, steps: int) -> None:
        """Writes the replay's checkpoint, every time: at the learner's step, or past the
        newest one where that is taken (a save at the same learner step: actors went on
        while the learner waited, e.g. a second stop during the warm-up). A second save at
        one step rewrote only the metadata, as for the learner, and the relaunch restored the
        older replay beside the newer counts. Its metadata names the learner's step."""
        assert self._replay is not None
        checkpointer = self._replay.checkpointer
        latest = checkpointer.latest_step()
        label = steps if latest is None or steps > latest else latest + 1
        with self._replay.hold():
            checkpointer.save(label, self._replay.save(), {"learner_step": steps})

    def _counts_now(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The program's counts for a checkpoint of this step.

        A counter node that died (killed) answers nothing, and a Courier call to a dead
        server waits forever: asked on a helper thread. Without them no checkpoint is
        written (`CountsUnreadableError`): one of these parameters with the counts last seen
        made the relaunch count the actors' steps since then again, behind a learner that
        had taken them (learner_steps behind its checkpoint's step). The newest checkpoint
        stays the last one whose counts were read with it.
        """
        if self._get_counts is None:
            return {}
        future = call_in_background(self._get_counts)
        try:
            return dict(future.result(timeout=timeout_s))
        except Exception as error:
            saved = self._periodic.last_saved_step if self._periodic is not None else None
            newest = saved if saved is not None else self.restored_step
            kept = (
                f"the newest checkpoint, learner step {newest}, stays the one a relaunch "
                "resumes from"
                if newest is not None
                else "a relaunch resumes from the newest checkpoint, if any"
            )
            raise CountsUnreadableError(
                f"the program's counts could not be read at learner step {self._steps} "
                f"({type(error).__name__}: {error or 'no answer in ' + str(timeout_s) + ' s'}); "
                f"{kept}"
            ) from None

    def run(self, should_stop: Callable[[], bool], poll_s: float = 0.2) -> None:
        """Steps until `should_stop()`, then saves a final checkpoint.

        Steps run on a worker thread because a learner step can block inside Reverb's
        sampler for as long as the rate limiter wants more inserts, and actors stop inserting
        when the program stops. The calling thread watches for the stop and saves the state
        of the last completed step, so a stop never waits for (or loses) a blocked step.
        """
        failure: list[BaseException] = []
        halt = threading.Event()

        def step_forever() -> None:
            try:
                while not halt.is_set():
                    self.step()
            except BaseException as error:  # re-raised on the main thread
                failure.append(error)

        worker = threading.Thread(target=step_forever, name="learner-steps", daemon=True)
        worker.start()
        while not should_stop() and worker.is_alive():
            time.sleep(poll_s)
        halt.set()
        # The step in flight ends (and the save below holds it) unless it waits for a batch
        # that will not come; then the last whole step is saved without it.
        worker.join(timeout=max(poll_s, min(FINISH_STEP_MAX_S, 2 * (self._last_step_s or 0))))
        if failure:
            self._save_after(failure[0])
            raise failure[0]
        # Not beside a periodic save of the step thread still in flight: its replay write
        # holds the store, and the drain, stalled, would read as done.
        with self._save_lock:
            self._take_the_rest()
        self.save()

    def _take_the_rest(self) -> None:
        """Before the final save: the steps the actors counted that are still on their way
        to a replay saved with the learner go into it (without, a relaunch's replay lacked
        them). Not after a failed step: the replay or the counter may be gone."""
        if self._replay is None:
            return
        start = time.monotonic()
        try:
            taken = self._replay.take_the_rest()
        except Exception as error:  # the final save goes on without them; say so
            console.say(
                f"the steps on their way to the replay were not taken in: "
                f"{type(error).__name__}: {error}",
                source="replay",
            )
            return
        if taken:
            console.say(
                f"{taken} steps on their way at the stop taken into the replay for the final "
                f"checkpoint ({time.monotonic() - start:.1f} s)",
                source="replay",
            )

    def _save_after(self, error: BaseException) -> None:
        """A step failed (on Ray a dead replay or counter raises in the learner at once, where
        Launchpad's sampler waits for the stop): the state of the last whole step is still
        good, so it is saved as at a stop, and the relaunch does not redo the steps since the
        last periodic checkpoint; what the failed step put in the learner is not saved. Not
        a state with non-finite values (an update that diverged): the checkpoint before it
        stays the newest."""
        if self._periodic is None or not isinstance(error, Exception):
            return
        try:
            with self._whole_lock:
                state = self._whole[1]
            if not _finite(state):
                console.say(
                    f"the learner's state is not finite after {type(error).__name__}: no "
                    "final checkpoint (the newest one stays)",
                    source="checkpoint",
                )
                return
            self.save()
        except Exception as save_error:  # the step's error is the one to report
            console.say(
                f"no final checkpoint after the learner's {type(error).__name__}: "
                f"{type(save_error).__name__}: {save_error}",
                source="checkpoint",
            )


def _finite(state: Any) -> bool:
    """Whether every float array of a learner's state is finite."""
    import jax
    import numpy as np

    for leaf in jax.tree_util.tree_leaves(state):
        values = np.asarray(leaf)
        if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
            return False
    return True
