"""Orbax checkpoints of learner state in the workdir, restored on relaunch.

A checkpoint is one step folder holding two items: `state`, any pytree of arrays and
Python scalars (params, optax state, step counters), and `metadata`, a small JSON dict
(e.g. the counter's counts). Layout, as orbax-checkpoint 0.6.4 writes it:

    <directory>/<step>/state/...            OCDBT array store + tree metadata
    <directory>/<step>/metadata/metadata    the JSON dict
    <directory>/<step>/_CHECKPOINT_METADATA

Atomicity: orbax writes a step into `<step>.orbax-checkpoint-tmp[-<n>]` and renames it to
`<step>` only once every item is written; step listing ignores the tmp names, so a process
killed mid-save leaves a folder that is never restored. The writer removes such leftovers
before its first save (readers never do: they might be looking at a live writer's save).
The rename survives a killed process; orbax does not fsync, so a power cut right after a
save may still lose that save's data.

Saves are synchronous: about 30 ms for a 5 MB state on one CPU core (see the tests), small
next to the minutes between saves, and a finished `save()` is on disk. A Ctrl-C or SIGTERM
that arrives during a save (in the main thread, where single-process runs save) waits for it
to be in place (`magi_lp.launch.interrupts.stop_deferred`): cut there, orbax's writer threads
would go on filling the tmp folder that the save at stop then needs.

What can go wrong on disk, and what happens then:
- A save at the step of the newest checkpoint with other metadata (a learner that took no
  step since, but whose actors did: new counts) replaces only that step's metadata file,
  atomically (write + rename), so the final counts are never lost to "step already saved".
- A save that fails (a full disk, ...) raises `CheckpointWriteError`: one line naming the
  folder, the cause (ENOSPC in words) and the checkpoint a relaunch would resume from; its
  half-written tmp folder is removed.
- `restore_newest_readable` tries finished checkpoints newest first: one that cannot be read
  (a truncated file, a corrupt JSON) is named in one console line and skipped, so a broken
  newest checkpoint never blocks resuming from an intact older one. Its owner (the learner)
  sets such a checkpoint aside (`<step>.unreadable`): left in place, the resumed run's saves
  at steps up to it were skipped as "already saved" and its work lost.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from magi_lp import console
from magi_lp.config_schema import fact_refusal, fail_unless, is_int
from magi_lp.errors import ConfigError
from magi_lp.launch.files import write_text_atomically
from magi_lp.launch.interrupts import stop_deferred
from magi_lp.runtime.checkpoint_metadata import METADATA_ITEM, metadata_path

_STATE = "state"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message is one line a person can act on."""


def say(text: str) -> None:
    """A line from the checkpoints' side (a save that holds a stop, say): the runners use it too."""
    console.say(text, source="checkpoint")


def _no_space(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a full disk, however the library wrapped it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(seen) or "RESOURCE_EXHAUSTED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_name(key: Any) -> str:
    # Mirrors orbax's own parameter naming (orbax.checkpoint.tree.utils.get_key_name).
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def _leaf_names(tree: Any) -> dict[str, Any]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {".".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def _json_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A JSON-safe copy: numpy / jax scalars become Python numbers."""

    def convert(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, np.generic) or (
            hasattr(value, "__array__") and np.asarray(value).ndim == 0
        ):
            return np.asarray(value).item()
        return value

    converted = convert(dict(metadata or {}))
    try:
        json.dumps(converted)
    except TypeError as e:
        raise TypeError(f"checkpoint metadata must be JSON-serialisable: {e}") from e
    return converted


class Checkpointer(contextlib.AbstractContextManager):
    """Saves and restores learner state in one directory, keeping the last `max_to_keep`.

    Save in one process and restore in another: every query re-reads the directory.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
        """Args: the checkpoint folder (created if missing), how many steps to keep (>= 1)."""
        ok = is_int(max_to_keep) and max_to_keep >= 1
        fix = "e.g. max_to_keep=3 (the default)"
        fail_unless(ok, "Checkpointer.max_to_keep", "an integer >= 1", max_to_keep, fix)
        self._directory = os.path.abspath(os.fspath(directory))
        self._manager = ocp.CheckpointManager(
            self._directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                # Synchronous: `save()` returning means the step is renamed into place.
                enable_async_checkpointing=False,
                # Done by hand before the first save, never when a reader opens the folder.
                cleanup_tmp_directories=False,
                # The default on local disks, pinned: write to a tmp name, rename at the end.
                temporary_path_class=ocp.path.atomicity.AtomicRenameTemporaryPath,
            ),
            # Handlers given up front, not inferred at the first save or restore: a fresh
            # process must read a step's tree metadata before it restores anything.
            item_handlers={
                _STATE: ocp.StandardCheckpointHandler(),
                METADATA_ITEM: ocp.JsonCheckpointHandler(),
            },
        )
        self._cleaned = False

    @property
    def directory(self) -> str:
        """The checkpoint folder (absolute)."""
        return self._directory

    def all_steps(self) -> list[int]:
        """Finished checkpoints' steps, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step, or None when there is none."""
        self._manager.reload()
        return self._manager.latest_step()

    def save(self, step: int, state: Any, metadata: Mapping[str, Any] | None = None) -> bool:
        """Writes `state` and `metadata` as checkpoint `step`; blocks until it is in place.

        Returns False (and writes nothing) when `step` is not newer than the latest
        checkpoint, e.g. a second save at the same learner step. Older steps beyond
        `max_to_keep` are deleted afterwards.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        metadata = _json_metadata(metadata)
        if not self._cleaned:
            # Leftovers of a save that was killed before its rename.
            self._remove_unfinished()
            self._cleaned = True
        self._manager.reload()
        latest = self._manager.latest_step()
        if latest is not None and step == latest:
            return self._update_metadata(step, metadata)
        if latest is not None and step < latest:
            logging.info("Checkpoint at step %d skipped: step %d is already saved", step, latest)
            return False
        # Orbax 0.6.4 takes int, float, np.ndarray and jax.Array leaves, not numpy scalars.
        state = jax.tree_util.tree_map(_scalar_to_array, state)
        start = time.perf_counter()
        try:
            with stop_deferred(f"checkpoint {step} is written", say=say):
                saved = self._manager.save(
                    step,
                    args=ocp.args.Composite(
                        **{
                            _STATE: ocp.args.StandardSave(state),
                            METADATA_ITEM: ocp.args.JsonSave(metadata),
                        }
                    ),
                )
                self._manager.wait_until_finished()
        except Exception as error:
            raise self._write_error(step, latest, error) from error
        logging.info(
            "Checkpoint at step %d saved in %.3f s to %s",
            step,
            time.perf_counter() - start,
            self._directory,
        )
        return bool(saved)

    def _update_metadata(self, step: int, metadata: dict[str, Any]) -> bool:
        """Replaces checkpoint `step`'s metadata file (write + rename); False if unchanged."""
        path = metadata_path(self._directory, step)
        try:
            with open(path) as f:
                if json.load(f) == metadata:
                    logging.info("Checkpoint at step %d skipped: already saved", step)
                    return False
        except (OSError, ValueError):
            pass  # unreadable: rewrite it
        try:
            with stop_deferred(f"checkpoint {step}'s metadata is written", say=say):
                write_text_atomically(path, json.dumps(metadata))
        except OSError as error:
            raise self._write_error(step, step, error) from error
        logging.info("Checkpoint at step %d: metadata updated in %s", step, path)
        return True

    def _remove_unfinished(self, step: int | None = None) -> None:
        """Removes the temporary folders of saves that never reached their rename (all, or
        `step`'s). By name, as orbax writes them: its own clean-up moved between versions
        (`ocp.utils.cleanup_tmp_directories` in 0.6, gone by 0.12)."""
        prefix = "" if step is None else f"{step}."
        for name in os.listdir(self._directory) if os.path.isdir(self._directory) else ():
            if name.startswith(prefix) and ".orbax-checkpoint-tmp" in name:
                shutil.rmtree(os.path.join(self._directory, name), ignore_errors=True)

    def _write_error(self, step: int, latest: int | None, error: BaseException) -> Exception:
        """One line for a failed save; removes what the failed save left half-written."""
        self._remove_unfinished(step)
        resume = (
            f"a relaunch resumes from checkpoint {latest}"
            if latest is not None
            else "there is no earlier checkpoint to resume from"
        )
        if _no_space(error):
            cause = "no space left on device (ENOSPC); free space there or use another --workdir"
        else:
            cause = _first_line(error)
        return CheckpointWriteError(
            f"checkpoint at step {step} could not be written to {self._directory}: {cause}; "
            f"{resume}"
        )

    def restore_newest_readable(
        self, target_like: Any = None, *, set_aside: bool = False
    ) -> tuple[int, Any, dict[str, Any]] | None:
        """Restores the newest checkpoint that can be read: `(step, state, metadata)`.

        A checkpoint that fails to read is named in one console line and the next older one
        is tried. None when there is no finished checkpoint. A checkpoint that does not match
        `target_like` (another network size) is a ConfigError, not skipped: an older one of
        the same run would not match either. `set_aside` (the folder's owner, which saves
        next): an unreadable one is renamed `<step>.unreadable`, kept for a look and out of
        the way of the saves that follow.
        """
        unreadable: list[int] = []
        found = None
        for step in reversed(self.all_steps()):
            try:
                state, metadata = self.restore(target_like, step=step)
            except ConfigError:
                raise
            except Exception as error:  # a broken checkpoint: try the one before
                console.say(
                    f"checkpoint {self._directory}/{step} cannot be read "
                    f"({type(error).__name__}: {_first_line(error, 120)}); trying the one before",
                    source="checkpoint",
                )
                unreadable.append(step)
                continue
            found = step, state, metadata
            break
        if set_aside:
            for step in unreadable:
                self._set_aside(step)
        return found

    def _set_aside(self, step: int) -> None:
        """Renames checkpoint `step` to `<step>.unreadable` (`.unreadable-2`, ... if taken)."""
        source = os.path.join(self._directory, str(step))
        target, n = f"{source}.unreadable", 1
        while os.path.exists(target):
            n += 1
            target = f"{source}.unreadable-{n}"
        try:
            os.rename(source, target)
        except OSError as error:
            console.say(
                f"checkpoint {source} could not be set aside ({error}); saves up to its step "
                "are skipped until it is moved",
                source="checkpoint",
            )
            return
        console.say(f"set aside as {target}", source="checkpoint")
        self._manager.reload()

    def restore(
        self, target_like: Any = None, *, step: int | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reads checkpoint `step` (default: the latest) and returns `(state, metadata)`.

        Args:
          target_like: a pytree shaped like the saved state (the freshly initialised
            state, or `jax.eval_shape` of it). The restored state then has its structure
            (optax namedtuples included) and array kinds: jax arrays land on the target
            arrays' devices (ShapeDtypeStructs without sharding: on the default device),
            numpy arrays stay numpy, Python scalars stay Python scalars. Without it, the
            state comes back as nested dicts and lists of numpy arrays (namedtuples
            become dicts or lists, empty states None), on any machine.
          step: which checkpoint; default the latest.

        Raises:
          FileNotFoundError: there is no finished checkpoint (or not that step).
          ConfigError: the checkpoint's leaves or shapes differ from `target_like`'s,
            e.g. the workdir holds a run with another network size.
        """
        self._manager.reload()
        steps = self._manager.all_steps()
        if step is None:
            step = self._manager.latest_step()
            if step is None:
                raise FileNotFoundError(f"no finished checkpoint in {self._directory}")
        elif step not in steps:
            raise FileNotFoundError(
                f"no finished checkpoint for step {step} in {self._directory}; "
                f"there are: {sorted(steps)}"
            )
        saved = getattr(self._manager.item_metadata(step), _STATE)
        if target_like is None:
            target = jax.tree_util.tree_map(lambda m: np.zeros(m.shape, m.dtype), saved)
        else:
            self._check_matches(step, saved, target_like)
            target = jax.tree_util.tree_map(_to_restore_target, target_like)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(target), METADATA_ITEM: ocp.args.JsonRestore()}
            ),
        )
        state = restored[_STATE]
        if target_like is not None:
            # Numpy scalars were saved as 0-d arrays: give them back their scalar type.
            state = jax.tree_util.tree_map(
                lambda like, x: like.dtype.type(x) if isinstance(like, np.generic) else x,
                target_like,
                state,
            )
        return state, dict(restored[METADATA_ITEM] or {})

    def _check_matches(self, step: int, saved: Any, target_like: Any) -> None:
        # Orbax 0.6.4 restores an array into a target of another shape silently (it pads
        # or truncates), so shapes are compared here first.
        saved_shapes = {m.name: tuple(m.shape) for m in jax.tree_util.tree_leaves(saved)}
        wanted_shapes = {
            name: tuple(np.shape(leaf)) for name, leaf in _leaf_names(target_like).items()
        }
        problems = []
        for name in sorted(set(wanted_shapes) - set(saved_shapes)):
            problems.append(f"'{name}' is not in the checkpoint")
        for name in sorted(set(saved_shapes) - set(wanted_shapes)):
            problems.append(f"'{name}' is in the checkpoint but not in the state to restore")
        for name in sorted(set(saved_shapes) & set(wanted_shapes)):
            if saved_shapes[name] != wanted_shapes[name]:
                problems.append(
                    f"'{name}' has shape {saved_shapes[name]} in the checkpoint, "
                    f"{wanted_shapes[name]} in the state to restore"
                )
        if problems:
            shown = ", ".join(problems[:5]) + (", ..." if len(problems) > 5 else "")
            raise ConfigError(
                fact_refusal(
                    f"checkpoint {self._directory}/{step} does not match this run's state",
                    f"{len(problems)} differences: {shown}",
                    "relaunch with the config it was saved with, or use a new --workdir",
                )
            )

    def close(self) -> None:
        """Waits for pending work and releases orbax's resources."""
        self._manager.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _scalar_to_array(leaf: Any) -> Any:
    return np.asarray(leaf) if isinstance(leaf, np.generic) else leaf


def _to_restore_target(leaf: Any) -> Any:
    leaf = _scalar_to_array(leaf)
    # Without a sharding orbax falls back to the device recorded at save time, which may
    # not exist here (saved on a GPU learner, restored on a CPU-only process).
    if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
        device = jax.devices()[0]
        return jax.ShapeDtypeStruct(
            leaf.shape, leaf.dtype, sharding=jax.sharding.SingleDeviceSharding(device)
        )
    return leaf


class Snapshot(NamedTuple):
    """What `PeriodicCheckpointer`'s `get_state` returns: the step, the state, metadata."""

    step: int
    state: Any
    metadata: Mapping[str, Any] | None = None


class PeriodicCheckpointer:
    """Saves every `every_minutes` (checked by `maybe_save()`) and at stop (`save_now()`).

    `get_state()` is called only when a save is due and returns a `Snapshot` (or a
    `(step, state[, metadata])` tuple). The clock starts at construction, so the first
    periodic save happens `every_minutes` after start, not at once.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        every_minutes: float,
        get_state: Callable[[], Snapshot | tuple],
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Args: where to save, how often (minutes, > 0), how to read the state."""
        fix = "e.g. --config.checkpoint.every_minutes=10"
        fail_unless(every_minutes > 0, "checkpoint.every_minutes", "> 0", every_minutes, fix)
        self._checkpointer = checkpointer
        self._period_s = float(every_minutes) * 60.0
        self._get_state = get_state
        self._clock = clock
        self._last_time = clock()
        self.last_saved_step: int | None = None

    def maybe_save(self) -> bool:
        """Saves when `every_minutes` have passed since the last save; True if it saved."""
        if self._clock() - self._last_time < self._period_s:
            return False
        return self.save_now()

    def postpone(self) -> None:
        """The next periodic save waits a whole period again (a save that could not be made
        now is not tried again at every step)."""
        self._last_time = self._clock()

    def save_now(self) -> bool:
        """Saves at once (e.g. at stop); False if that step was already saved."""
        snapshot = Snapshot(*self._get_state())
        saved = self._checkpointer.save(snapshot.step, snapshot.state, snapshot.metadata)
        self._last_time = self._clock()
        if saved:
            self.last_saved_step = int(snapshot.step)
        return saved
