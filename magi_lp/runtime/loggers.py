"""Loggers for every node: CSV and TensorBoard per label in the workdir, terminal lines, W&B.

Layout under the workdir (`magi_lp.runtime.workdir.Workdir`), one folder per label (a label
names one logging stream, e.g. `learner`, `actor_3`, `evaluator`):

    <workdir>/logs/<label>/logs.csv          one row per write, header = union of keys
    <workdir>/tensorboard/<label>/events.*   one scalar per numeric key
    <workdir>/wandb/                         Weights & Biases files (only when turned on)

A relaunch with the same workdir appends to the same CSV and TensorBoard folder, so a
resumed run keeps its history. Every sink flushes on each write: a killed process loses
nothing that reached `write()` (only rows dropped on purpose by `time_delta` are missing).

Nodes build their loggers inside their own process from a `LoggerFactory`, a small
picklable dataclass the program passes to every node.

Built on Acme's framework-neutral loggers (`Dispatcher`, `NoneFilter`, `TimeFilter`,
`TerminalLogger`). Acme's `CSVLogger` and `TFSummaryLogger` are not used: the CSV one
freezes its columns at the first row and ignores the header of a file it appends to, and
the TensorBoard one flushes only every two minutes and fails on non-numeric values. Acme's
`to_numpy` does not convert jax 0.4.30 arrays (it looks for the removed `device_buffer`),
so values are converted here.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import fcntl
import functools
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import numpy as np
import psutil
from absl import logging

from magi_lp import console
from magi_lp.acme_api import loggers as acme_loggers
from magi_lp.config_schema import fact_refusal, fail_unless, typed_section
from magi_lp.errors import ConfigError
from magi_lp.formatting import format_duration
from magi_lp.runtime.config import LoggingSettings
from magi_lp.runtime.workdir import LOG_CSV, Workdir

Logger = acme_loggers.Logger
LoggingData = acme_loggers.LoggingData

# Short names for the terminal line, in the order they are printed first.
_TERMINAL_ALIASES = {"fps": "fps", "episode_return": "return", "eta_s": "eta"}


def _to_python(value: Any) -> Any:
    """Turns arrays and tensors (numpy, jax, TF) of one element into Python scalars."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()  # A TF tensor.
    if isinstance(value, np.generic) or hasattr(value, "__array__"):
        array = np.asarray(value)
        if array.size == 1:
            return array.reshape(()).item()
        return array
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _csv_cell(value: Any) -> Any:
    value = _to_python(value)
    if isinstance(value, np.ndarray):
        return json.dumps(value.tolist())  # One line, unlike numpy's own repr.
    return value


def _require_wandb() -> None:
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            fact_refusal(
                "logging.wandb is on",
                "the `wandb` package is not installed",
                "`pip install wandb`, or set --config.logging.wandb=False",
            )
        )


# ---------------------------------------------------------------------------------------
# Sinks.


class CsvLogger(Logger):
    """Appends one row per write to `<directory>/logs.csv`, keeping earlier runs' rows.

    An existing file is continued: its header gives the columns, and a last row cut short
    by a killed process is dropped. A key never seen before widens the header; the file is
    then rewritten once through a temporary file and an atomic rename (a writer killed
    before the rename leaves that file; the next logger of the label removes it). Every row
    is flushed to the OS at once. An exclusive `flock` on the file stops two live loggers (two
    processes, or two loggers in one process) from interleaving rows in the same file.
    """

    def __init__(self, directory: str | os.PathLike):
        """Opens (creating if needed) `<directory>/logs.csv` for appending."""
        os.makedirs(directory, exist_ok=True)
        self._path = os.path.join(os.fspath(directory), LOG_CSV)
        self._file: TextIO = open(self._path, "a+", newline="")  # noqa: SIM115
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise RuntimeError(
                f"{self._path} is already being written by another live logger; give each "
                "node its own label (LoggerFactory(..)(label, instance=i))"
            ) from None
        self._remove_dead_writers_rewrites()
        self._fields: list[str] = self._read_header_and_repair()
        self._writer = csv.DictWriter(self._file, fieldnames=self._fields, restval="")

    @property
    def file_path(self) -> str:
        """Where the rows go."""
        return self._path

    def _remove_dead_writers_rewrites(self) -> None:
        """Removes the temporary files (`_widen_header`'s `<file>.tmp-<pid>`) of writers
        killed mid-rewrite: their file was never renamed into place, and no one else
        would remove it."""
        prefix = f"{LOG_CSV}.tmp-"
        for name in os.listdir(os.path.dirname(self._path)):
            pid = name[len(prefix) :] if name.startswith(prefix) else ""
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(os.path.dirname(self._path), name))

    def _read_header_and_repair(self) -> list[str]:
        # Reads only the first line and the tail: a long run's CSV can be large.
        size = os.path.getsize(self._path)
        with open(self._path, "rb") as f:
            end, pos = 0, size
            while pos > 0:
                chunk_size = min(65536, pos)
                pos -= chunk_size
                f.seek(pos)
                newline = f.read(chunk_size).rfind(b"\n")
                if newline >= 0:
                    end = pos + newline + 1
                    break
            f.seek(0)
            header = f.readline().decode() if end else ""
        if end < size:
            # A row cut short by a killed process has no final newline: drop it.
            logging.warning("%s: dropping an incomplete last line", self._path)
            os.truncate(self._path, end)
        if not header.strip():
            return []
        return next(csv.reader([header.rstrip("\r\n")]))

    def _widen_header(self, new_keys: list[str]) -> None:
        """Rewrites the file with more columns; earlier rows get empty cells."""
        self._fields = self._fields + sorted(new_keys)
        self._file.flush()
        self._file.seek(0)
        rows = list(csv.DictReader(self._file))
        tmp_path = f"{self._path}.tmp-{os.getpid()}"
        with open(tmp_path, "w", newline="") as tmp:
            writer = csv.DictWriter(tmp, fieldnames=self._fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        # The lock lives on the old file's description: lock the new one before the swap.
        new_file = open(tmp_path, "a+", newline="")  # noqa: SIM115
        fcntl.flock(new_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(tmp_path, self._path)
        self._file.close()
        self._file = new_file
        self._writer = csv.DictWriter(self._file, fieldnames=self._fields, restval="")

    def write(self, data: LoggingData) -> None:
        """Appends one row; values that are not scalars are written as their text."""
        row = {key: _csv_cell(value) for key, value in data.items()}
        new_keys = [key for key in row if key not in self._fields]
        if new_keys:
            self._widen_header(new_keys)
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        """Flushes and closes the file (which releases the lock)."""
        if not self._file.closed:
            self._file.flush()
            self._file.close()


def tensorboard_backend() -> str | None:
    """What writes TensorBoard event files here: 'tensorflow' (the Launchpad stack),
    'tensorboardX' (the current stack's lock), or None (logging.tensorboard is then off)."""
    for name in ("tensorflow", "tensorboardX"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


class TensorBoardLogger(Logger):
    """Writes every numeric value as a TensorBoard scalar under `<logdir>`.

    Through `tf.summary` where TensorFlow is installed, else through tensorboardX (the same
    event files, without TensorFlow). The x axis is `values[steps_key]` when the key is
    present, else the number of writes so far. Tags are the keys as given. Non-numeric values
    are skipped. The event file is flushed after every write (about 0.2 ms per scalar on one
    core).
    """

    def __init__(self, logdir: str | os.PathLike, steps_key: str | None = None):
        """Creates the event file writer (TensorFlow's import takes about 2 s)."""
        os.makedirs(logdir, exist_ok=True)
        self._backend = tensorboard_backend()
        if self._backend == "tensorflow":
            import tensorflow as tf  # Imported here: only nodes that log to TensorBoard pay.

            self._tf = tf
            self._writer = tf.summary.create_file_writer(os.fspath(logdir))
        elif self._backend == "tensorboardX":
            import tensorboardX

            self._writer = tensorboardX.SummaryWriter(os.fspath(logdir))
        else:
            raise ImportError("TensorBoard logging needs tensorflow or tensorboardX")
        self._steps_key = steps_key
        self._writes = 0
        self._warned_missing_step = False

    def write(self, data: LoggingData) -> None:
        """Logs the numeric values of one row as scalars at the row's step."""
        values = {key: _to_python(value) for key, value in data.items()}
        step = self._writes
        if self._steps_key is not None:
            if _is_number(values.get(self._steps_key)):
                step = int(values[self._steps_key])
            elif not self._warned_missing_step:
                logging.warning(
                    "TensorBoard: key %r missing from a row; using the write count as step",
                    self._steps_key,
                )
                self._warned_missing_step = True
        scalars = {k: v for k, v in values.items() if k != self._steps_key and _is_number(v)}
        if self._backend == "tensorflow":
            with self._writer.as_default():
                for key, value in scalars.items():
                    self._tf.summary.scalar(key, value, step=step)
        else:
            for key, value in scalars.items():
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()
        self._writes += 1

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()


_TENSORBOARD_NOTICE_SHOWN = False


def _tensorboard_available() -> bool:
    """Whether TensorBoard files can be written; says once per process when not."""
    global _TENSORBOARD_NOTICE_SHOWN
    if tensorboard_backend() is not None:
        return True
    if not _TENSORBOARD_NOTICE_SHOWN:
        _TENSORBOARD_NOTICE_SHOWN = True
        console.say(
            "logging.tensorboard is on but neither tensorflow nor tensorboardX is installed: "
            "TensorBoard files are off (CSV logs go on); install tensorboardX, or set "
            "--config.logging.tensorboard=False to silence this"
        )
    return False


class WandbLogger(Logger):
    """Logs to Weights & Biases, keys prefixed with `<label>/`.

    One W&B run per process, shared by every label in it (the single-process runner has
    several): runs are grouped by the workdir's name and named after the first label. The
    run id is kept in `<workdir>/wandb/<name>.run_id`, so a relaunch resumes the same run,
    and W&B's own logs go to `<workdir>/wandb/cache` (unless WANDB_CACHE_DIR is set).
    Each label plots against its own step key (`define_metric`), so labels with different
    step counters can share a run.
    """

    def __init__(
        self,
        label: str,
        workdir: str | os.PathLike,
        project: str | None = None,
        steps_key: str | None = None,
    ):
        """Starts (or joins) this process's W&B run; needs `wandb` installed."""
        _require_wandb()
        import wandb

        self._wandb = wandb
        self._label = label
        if wandb.run is None:
            wandb_dir = os.fspath(Workdir(workdir).wandb)
            os.makedirs(wandb_dir, exist_ok=True)
            # wandb-core writes its debug logs to ~/.cache/wandb/logs unless WANDB_CACHE_DIR
            # names another place: the workdir's, so nothing of a run goes to the home folder.
            os.environ.setdefault("WANDB_CACHE_DIR", os.path.join(wandb_dir, "cache"))
            id_path = os.path.join(wandb_dir, f"{label}.run_id")
            if os.path.exists(id_path):
                with open(id_path) as f:
                    run_id = f.read().strip()
            else:
                run_id = uuid.uuid4().hex[:16]
                with open(id_path, "w") as f:
                    f.write(run_id)
            wandb.init(
                project=project,
                group=os.path.basename(os.path.abspath(workdir)),
                name=label,
                id=run_id,
                resume="allow",
                dir=os.fspath(workdir),
            )
        self._run = wandb.run
        if steps_key is not None:
            self._run.define_metric(f"{label}/*", step_metric=f"{label}/{steps_key}")

    def write(self, data: LoggingData) -> None:
        """Logs one row (scalars and strings) under `<label>/<key>`."""
        row = {}
        for key, value in data.items():
            value = _to_python(value)
            if _is_number(value) or isinstance(value, str):
                row[f"{self._label}/{key}"] = value
        self._run.log(row)

    def close(self) -> None:
        """Nothing to do: the run is shared by the process and ends when it exits."""


# ---------------------------------------------------------------------------------------
# Terminal lines.


def _format_value(value: Any) -> str:
    if isinstance(value, int):  # bool included
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    return str(value)


def format_terminal_line(label: str, values: LoggingData, steps_key: str | None = None) -> str:
    """One compact line: `[label] steps=... fps=... return=... eta=... other=...`.

    The step key is shown as `steps`, `episode_return` as `return`, `eta_s` as a duration;
    the remaining keys follow in alphabetical order.
    """
    values = {key: _to_python(value) for key, value in values.items()}
    parts = []
    if steps_key is not None and steps_key in values:
        parts.append(f"steps={_format_value(values.pop(steps_key))}")
    for key, short in _TERMINAL_ALIASES.items():
        if key in values:
            value = values.pop(key)
            text = format_duration(value) if key == "eta_s" else _format_value(value)
            parts.append(f"{short}={text}")
    parts.extend(f"{key}={_format_value(values[key])}" for key in sorted(values))
    return f"[{label}] " + " ".join(parts)


def _print_and_flush(line: str) -> None:
    # Node output is redirected to files by the launcher; flush so the line is there now.
    print(line, flush=True)


# ---------------------------------------------------------------------------------------
# Throughput, ETA and the progress bar.


class ThroughputTracker:
    """Frames per second and time to reach a target step count, from a step counter.

    Call it with each log row (or `update(steps)` with the count): it returns `fps`
    (steps/s over the last `window_s` seconds, times `frames_per_step`, e.g. the action
    repeat) and `eta_s` (seconds until `target_steps`). Both are absent until two samples
    exist; a resumed run starts measuring from its first row, not from zero.
    """

    def __init__(
        self,
        steps_key: str,
        target_steps: int | None = None,
        *,
        frames_per_step: int = 1,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Args: the key holding the step count, the count the run stops at (or None)."""
        self.steps_key = steps_key
        self.target_steps = target_steps
        self._frames_per_step = frames_per_step
        self._window_s = window_s
        self._clock = clock
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def update(self, steps: float) -> dict[str, float]:
        """Records the step count now; returns `{'fps': ..., 'eta_s': ...}` when known."""
        now = self._clock()
        steps = float(_to_python(steps))
        if self._samples and steps < self._samples[-1][1]:
            self._samples.clear()  # The counter went back (a fresh run): start over.
        self._samples.append((now, steps))
        # Keep one sample at or beyond the window's start so the rate spans the window.
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()
        first_time, first_steps = self._samples[0]
        if now <= first_time:
            return {}
        steps_per_s = (steps - first_steps) / (now - first_time)
        result = {"fps": steps_per_s * self._frames_per_step}
        if self.target_steps is not None:
            remaining = max(0.0, self.target_steps - steps)
            if remaining == 0:
                result["eta_s"] = 0.0
            elif steps_per_s > 0:
                result["eta_s"] = remaining / steps_per_s
        return result

    def __call__(self, values: LoggingData) -> dict[str, Any]:
        """Returns a copy of `values` with `fps` and `eta_s` added (when known)."""
        out = dict(values)
        if self.steps_key in values:
            out.update(self.update(values[self.steps_key]))
        return out


class ProgressBar:
    """A tqdm bar for the single-process runner: steps, fps, last return, ETA.

    tqdm shows `steps/total`, steps/s and the remaining time; the postfix adds the last
    episode return and frames/s (steps/s times `frames_per_step`). Use as a context
    manager or call `close()`.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        initial_steps: int = 0,
        label: str = "train",
        frames_per_step: int = 1,
        file: TextIO | None = None,
        disable: bool | None = None,
        mininterval: float = 1.0,
    ):
        """`disable=None` hides the bar when the output is not a terminal."""
        from tqdm import tqdm

        self._tracker = ThroughputTracker(
            "steps", total_steps, frames_per_step=frames_per_step, window_s=30.0
        )
        self._bar = tqdm(
            total=total_steps,
            initial=initial_steps,
            desc=label,
            unit="step",
            file=file,
            disable=disable,
            mininterval=mininterval,
            dynamic_ncols=True,
            smoothing=0.1,
        )
        self._last_return: float | None = None
        self._tracker.update(initial_steps)

    def update(self, steps: int, episode_return: float | None = None) -> None:
        """Moves the bar to `steps`; shows `episode_return` when given (kept until next)."""
        if episode_return is not None:
            self._last_return = float(_to_python(episode_return))
        postfix = {}
        if self._last_return is not None:
            postfix["return"] = f"{self._last_return:.4g}"
        fps = self._tracker.update(steps).get("fps")
        if fps is not None:
            postfix["fps"] = f"{fps:.1f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(max(0, int(steps) - self._bar.n))

    def close(self) -> None:
        """Draws the final state and releases the terminal line."""
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Construction.


def make_logger(
    label: str,
    workdir: str | os.PathLike,
    *,
    csv: bool = True,
    tensorboard: bool = True,
    wandb: bool = False,
    wandb_project: str | None = None,
    terminal: bool = True,
    time_delta: float = 1.0,
    steps_key: str | None = None,
) -> Logger:
    """Builds the logger for one label: the chosen sinks behind Acme's filters.

    Args:
      label: names the stream and its folders (`logs/<label>`, `tensorboard/<label>`).
      workdir: the run's folder; created if missing.
      csv / tensorboard / wandb / terminal: which sinks to write to.
      wandb_project: the W&B project (None: W&B's default / `WANDB_PROJECT`).
      time_delta: rows arriving less than this many seconds after the last kept row are
        dropped (for every sink, as Acme does); 0 keeps every row.
      steps_key: the key that holds the step count (x axis in TensorBoard and W&B,
        `steps=` on the terminal).

    Raises:
      ConfigError: W&B is turned on but not installed, or `time_delta` is negative.
    """
    fail_unless(
        time_delta >= 0, "logging.time_delta", ">= 0 seconds", time_delta, "0 keeps every row"
    )
    if wandb:
        _require_wandb()
    folders = Workdir(workdir)
    sinks: list[Logger] = []
    if csv:
        sinks.append(CsvLogger(folders.logs(label)))
    if tensorboard and _tensorboard_available():
        sinks.append(TensorBoardLogger(folders.tensorboard(label), steps_key))
    if wandb:
        sinks.append(WandbLogger(label, workdir, wandb_project, steps_key))
    if terminal:
        sinks.append(
            acme_loggers.TerminalLogger(
                label="",
                print_fn=_print_and_flush,
                serialize_fn=functools.partial(format_terminal_line, label, steps_key=steps_key),
            )
        )
    logger: Logger = acme_loggers.NoneFilter(acme_loggers.Dispatcher(sinks))
    if time_delta > 0:
        logger = acme_loggers.TimeFilter(logger, time_delta)
    return logger


@dataclasses.dataclass(frozen=True)
class LoggerFactory(LoggingSettings):
    """Picklable recipe for loggers, passed to every Launchpad node.

    Call it inside the node's process: `factory('learner', steps_key='learner_steps')`.
    Nodes of a group that run in several processes must pass `instance=i`, which makes
    the label `<label>_<i>`: two processes never share a CSV file. The settings are
    `config.logging`'s (`LoggingSettings`).
    """

    workdir: str = ""

    def __post_init__(self):
        super().__post_init__()
        # Fail when the config is read, before any process starts.
        if self.wandb:
            _require_wandb()

    def __call__(
        self,
        label: str,
        steps_key: str | None = None,
        instance: int | None = None,
        *,
        time_delta: float | None = None,
    ) -> Logger:
        """Makes the logger for `label` (`<label>_<instance>` when instance is given)."""
        if instance is not None:
            label = f"{label}_{instance}"
        return make_logger(
            label,
            self.workdir,
            csv=self.csv,
            tensorboard=self.tensorboard,
            wandb=self.wandb,
            wandb_project=self.wandb_project,
            terminal=self.terminal,
            time_delta=self.time_delta if time_delta is None else time_delta,
            steps_key=steps_key,
        )

    @classmethod
    def from_config(
        cls, workdir: str | os.PathLike, logging_config: Mapping[str, Any] | Any
    ) -> LoggerFactory:
        """Builds the factory from `config.logging`; keys left out take their defaults."""
        values = {**dataclasses.asdict(LoggingSettings()), **dict(logging_config or {})}
        settings = typed_section(LoggingSettings, values, "logging.")
        return cls(workdir=os.fspath(workdir), **dataclasses.asdict(settings))
