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
picklable dataclass the program passes to every node. The sinks themselves (CSV,
TensorBoard, W&B) are in `magi_lp.runtime.log_sinks`; this module adds the terminal line,
throughput and ETA, the progress bar, and puts the chosen sinks together.

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
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from magi_lp import console
from magi_lp.acme_api import loggers as acme_loggers
from magi_lp.config_schema import fail_unless, typed_section
from magi_lp.formatting import format_duration
from magi_lp.runtime.config import LoggingSettings
from magi_lp.runtime.log_sinks import (
    CsvLogger,
    TensorBoardLogger,
    WandbLogger,
    require_wandb,
    tensorboard_backend,
    to_python,
)
from magi_lp.runtime.workdir import Workdir

Logger = acme_loggers.Logger
LoggingData = acme_loggers.LoggingData

# Short names for the terminal line, in the order they are printed first.
_TERMINAL_ALIASES = {"fps": "fps", "episode_return": "return", "eta_s": "eta"}


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
    values = {key: to_python(value) for key, value in values.items()}
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
        steps = float(to_python(steps))
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


class ProgressBar(contextlib.AbstractContextManager):
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
            self._last_return = float(to_python(episode_return))
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

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Construction.


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
        require_wandb()
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
            require_wandb()

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
