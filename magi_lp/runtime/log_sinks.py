"""Where a node's log rows go: a CSV file, TensorBoard event files, a W&B run.

Each sink is an Acme `Logger` that flushes on every write, so a killed process loses
nothing that reached `write()`. `magi_lp.runtime.loggers.make_logger` puts the chosen sinks
behind Acme's filters; the module docstring there gives the layout under the workdir and
why Acme's own CSV and TensorBoard loggers are not used.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import importlib.util
import json
import os
import uuid
from typing import Any, TextIO

import numpy as np
import psutil
from absl import logging

from magi_lp.acme_api import loggers as acme_loggers
from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.runtime.workdir import LOG_CSV, Workdir

Logger = acme_loggers.Logger
LoggingData = acme_loggers.LoggingData


def to_python(value: Any) -> Any:
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
    value = to_python(value)
    if isinstance(value, np.ndarray):
        return json.dumps(value.tolist())  # One line, unlike numpy's own repr.
    return value


def require_wandb() -> None:
    """Refuses logging.wandb where the `wandb` package is not installed (a `ConfigError`)."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            fact_refusal(
                "logging.wandb is on",
                "the `wandb` package is not installed",
                "`pip install wandb`, or set --config.logging.wandb=False",
            )
        )


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
        values = {key: to_python(value) for key, value in data.items()}
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
        require_wandb()
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
            value = to_python(value)
            if _is_number(value) or isinstance(value, str):
                row[f"{self._label}/{key}"] = value
        self._run.log(row)

    def close(self) -> None:
        """Nothing to do: the run is shared by the process and ends when it exits."""
