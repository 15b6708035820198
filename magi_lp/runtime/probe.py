"""What the launcher's status view reads from a running program (`ProgramProbe`).

The engine gives the probe a way to reach the running counter, replay and learner (a
client of each, made on first use, with a short timeout of its own, so a slow or dead node
only blanks a sample). The probe asks the counter for its counts, the learner for its device
store's numbers, else the replay (Reverb: each table's size and its rate limiter's insert and
sample counts; a served replay: its `info()`), and reads the newest evaluation return from
the evaluators' CSV logs.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Callable
from typing import Any

from magi_lp.launch.exit_report import read_tail
from magi_lp.launch.monitor import StatusMonitor
from magi_lp.runtime.workdir import Workdir

_CALL_TIMEOUT_S = 2.0


def last_csv_value(path: str | os.PathLike, key: str) -> float | None:
    """The newest non-empty value of column `key` in a CSV log (None if none yet)."""
    try:
        with open(path, newline="") as f:
            header = f.readline().rstrip("\r\n")
    except OSError:
        return None
    lines = [line for line in read_tail(path, 20) if line != header]
    value = None
    for row in csv.DictReader(io.StringIO("\n".join([header, *lines]))):
        try:
            value = float(row[key]) if row.get(key) not in (None, "") else value
        except ValueError:
            continue
    return value


class ProgramProbe:
    """Reads the counter, the replay and the evaluation logs of a launched program.

    Args:
      counter: makes a client of the counter node.
      replay: makes a client of the replay node (a Reverb client, or a served replay's), or
        None (a replay colocated with the learner).
      workdir: the run folder (evaluation returns are read from its logs).
      learner: makes a client of the learner node: with the device frame store the replay's
        numbers are the learner's (`LearnerNode.replay_info`), not the queue's.
    """

    def __init__(
        self,
        counter: Callable[[], Any],
        replay: Callable[[], Any] | None,
        workdir: str | os.PathLike,
        learner: Callable[[], Any] | None = None,
    ):
        self._counter_handle = counter
        self._replay_handle = replay
        self._learner_handle = learner
        self._workdir = Workdir(workdir)
        self._counter: Any = None
        self._replay: Any = None
        self._learner: Any = None

    def __call__(self) -> dict[str, Any]:
        numbers: dict[str, Any] = {}
        # A node that is starting or gone blanks its numbers for this sample.
        with contextlib.suppress(Exception):
            numbers.update(self._counts())
        with contextlib.suppress(Exception):
            numbers.update(self._replay_numbers())
        returns = [
            value
            for path in self._workdir.log_csvs("evaluator_*")
            if (value := last_csv_value(path, "episode_return")) is not None
        ]
        if returns:
            numbers["eval_return"] = sum(returns) / len(returns)
        return numbers

    def _counts(self) -> dict[str, Any]:
        if self._counter is None:
            self._counter = self._counter_handle()
        return dict(self._counter.get_counts())

    def _replay_numbers(self) -> dict[str, Any]:
        if self._learner_handle is not None:
            if self._learner is None:
                self._learner = self._learner_handle()
            info = dict(self._learner.replay_info())
            if info:  # the device store
                return {
                    "replay_size": info["replay_size"],
                    "replay_inserts": info["replay_inserted"],
                    "replay_samples": info["replay_sampled"],
                }
        if self._replay_handle is None:
            return {}
        if self._replay is None:
            self._replay = self._replay_handle()
        if not hasattr(self._replay, "server_info"):  # a served replay
            info = dict(self._replay.info())
            return {
                "replay_size": info.get("size", 0),
                "replay_inserts": info.get("inserted", 0),
                "replay_samples": info.get("sampled_batches", 0) * info.get("batch_size", 0)
                or info.get("taken", 0),
            }
        # Reverb takes whole seconds here.
        tables = self._replay.server_info(timeout=int(_CALL_TIMEOUT_S)).values()
        size = inserts = samples = 0
        for table in tables:
            size += table.current_size
            stats = table.rate_limiter_info
            inserts += stats.insert_stats.completed
            samples += stats.sample_stats.completed
        return {"replay_size": size, "replay_inserts": inserts, "replay_samples": samples}


CALL_TIMEOUT_S = _CALL_TIMEOUT_S
"""The timeout an engine gives the probe's clients."""


def make_status_monitor(
    probe: ProgramProbe, plan: Any, experiment: Any, workdir: str | os.PathLike, **options: Any
) -> StatusMonitor:
    """The launcher's status view of a program, read through `probe`."""
    gpu_memory = None
    if getattr(plan.inventory, "gpus", None):
        from magi_lp.placement.gpu_inventory import gpu_memory_by_pid

        gpu_memory = gpu_memory_by_pid
    return StatusMonitor(
        probe,
        max_actor_steps=int(experiment.config.max_actor_steps),
        frames_per_step=int(experiment.frames_per_step),
        csv_path=Workdir(workdir).status_csv,
        gpu_memory=gpu_memory,
        **options,
    )
