"""The launcher's live view of a running program: progress, rates, and each node's health.

A `StatusMonitor` runs on a daemon thread of the launcher. Every `period_s` it asks a
program probe (a callable given by the runtime layer, e.g. `magi_lp.runtime.probe`, which
reads the counter, the replay and the evaluation logs) for cumulative numbers, turns
consecutive samples into rates, and reads each node process with psutil (state, RSS, CPU%)
and, when a GPU is there, NVML (GPU memory by pid). It shows them

- on a terminal (stdout and stderr both a TTY): a table that refreshes in place;
- otherwise (a file, CI, nohup): one plain line every `plain_every_s` seconds;

and appends every sample to a CSV (`<workdir>/status.csv`). A node is "starting" until its
process listens on a TCP port (every Launchpad node serves an RPC port once it is built),
then "running", and "finished" / "dead" once it has ended (exit code 0 / anything else).

The probe's calls must carry short timeouts of their own; a probe that fails leaves its
numbers blank for that sample. The monitor never polls or waits on node processes (the
supervisor does) and costs the nodes nothing but a few /proc reads.
"""

from __future__ import annotations

import csv
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import psutil

from magi_lp import console
from magi_lp.formatting import format_duration

ProgramProbe = Callable[[], Mapping[str, Any]]
"""Returns cumulative program numbers; keys it may give: `actor_steps`, `learner_steps`,
`replay_size`, `replay_inserts`, `replay_samples`, `eval_return`."""

GpuMemory = Callable[[], Mapping[int, float]]
"""Returns GPU memory in MiB by pid (all GPUs summed)."""

_RATE_WINDOW_S = 60.0


def _number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    return f"{value:.{digits}f}"


class _NodeView:
    """One node process as the monitor sees it."""

    def __init__(self, group: str, index: int, process: Any):
        self.name = f"{group}/{index}"
        self.process = process
        self.listening = False
        try:
            self._ps: psutil.Process | None = psutil.Process(process.pid)
            self._ps.cpu_percent(None)  # the baseline for the next reading
        except psutil.Error:
            self._ps = None

    def read(self, gpu_mib: Mapping[int, float]) -> dict[str, Any]:
        returncode = self.process.returncode  # set by the supervisor's poll(); never waited here
        if returncode is not None:
            return {"state": "finished" if returncode == 0 else "dead"}
        row: dict[str, Any] = {"state": "running" if self.listening else "starting"}
        if self._ps is None:
            return row
        try:
            with self._ps.oneshot():
                row["rss_mib"] = self._ps.memory_info().rss / 2**20
                row["cpu"] = self._ps.cpu_percent(None)
            if not self.listening:
                self.listening = any(
                    c.status == psutil.CONN_LISTEN for c in self._ps.net_connections("tcp")
                )
                row["state"] = "running" if self.listening else "starting"
        except psutil.Error:
            pass
        if self.process.pid in gpu_mib:
            row["gpu_mib"] = gpu_mib[self.process.pid]
        return row


class StatusMonitor:
    """Samples the program and its nodes every `period_s`; shows and records what it saw."""

    def __init__(
        self,
        probe: ProgramProbe,
        *,
        max_actor_steps: int,
        frames_per_step: int = 1,
        csv_path: str | os.PathLike | None = None,
        period_s: float = 5.0,
        plain_every_s: float = 30.0,
        gpu_memory: GpuMemory | None = None,
        live: bool | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Args:
        probe: the program's numbers (see `ProgramProbe`).
        max_actor_steps: where the run stops, for the ETA.
        frames_per_step: environment frames per actor step (the action repeat).
        csv_path: where every sample is appended as a row; None: no CSV.
        period_s: seconds between samples (and table refreshes).
        plain_every_s: seconds between plain lines when not on a terminal.
        gpu_memory: GPU MiB by pid (None: no GPU column).
        live: force the live table on or off; None: on when stdout and stderr are TTYs.
        stream: where plain lines go (default stderr, like the launcher's other lines).
        clock: seconds (tests pass a fake one).
        """
        self._probe = probe
        self._max_steps = int(max_actor_steps)
        self._frames_per_step = int(frames_per_step)
        self._csv_path = Path(csv_path) if csv_path is not None else None
        self._period_s = float(period_s)
        self._plain_every_s = float(plain_every_s)
        self._gpu_memory = gpu_memory
        self._live_wanted = (
            live if live is not None else (sys.stdout.isatty() and sys.stderr.isatty())
        )
        self._stream = stream
        self._clock = clock
        self._nodes: list[_NodeView] = []
        self._history: deque[tuple[float, dict[str, float]]] = deque()
        self._started = 0.0
        self._last_plain: float | None = None
        self._estimate_said = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._live: Any = None
        self._csv_fields: list[str] = []

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, nodes: Sequence[tuple[str, int, Any]]) -> None:
        """Starts sampling `(group, index, Popen)` nodes on a daemon thread."""
        self._nodes = [_NodeView(group, index, process) for group, index, process in nodes]
        self._started = self._clock()
        if self._live_wanted:
            live = console.LiveView()
            try:
                live.start()
                self._live = live
            except ImportError as error:  # no rich here: the plain lines serve as well
                console.say(
                    f"notice: no live status table ({error}); a status line every "
                    f"{self._plain_every_s:g} s instead",
                    source="status",
                    stream=self._stream,
                )
        self._thread = threading.Thread(target=self._loop, name="magi_lp-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread and the live view; the last sample's line stays as the record."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._period_s + 5)
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            with self._lock:
                if not self._stop.is_set():
                    self._sample()

    # --- one sample -----------------------------------------------------------------------

    def final_sample(self) -> None:
        """The numbers as the stop begins (the nodes still answer), shown whatever the period;
        the last sample: what follows is the stop, which the launcher reports itself."""
        self._stop.set()
        with self._lock:
            self._last_plain = None
            self._sample()

    def sample(self) -> dict[str, Any]:
        """Reads the program and the nodes once; shows and records the result."""
        with self._lock:
            return self._sample()

    def _sample(self) -> dict[str, Any]:
        now = self._clock()
        try:
            program = dict(self._probe())
        except Exception:  # a node being slow or gone must not stop the view
            program = {}
        try:
            gpu = dict(self._gpu_memory()) if self._gpu_memory is not None else {}
        except Exception:
            gpu = {}
        row = self._program_row(now, program)
        nodes = {node.name: node.read(gpu) for node in self._nodes}
        self._write_csv(row, nodes)
        if self._live is not None:
            self._live.update(self._table(row, nodes))
        elif self._last_plain is None or now - self._last_plain >= self._plain_every_s:
            self._last_plain = now
            console.say(self._plain_line(row, nodes), source="status", stream=self._stream)
        self._maybe_say_estimate(row)
        return {"program": row, "nodes": nodes}

    def _program_row(self, now: float, program: Mapping[str, Any]) -> dict[str, Any]:
        cumulative = {
            key: float(program[key])
            for key in ("actor_steps", "learner_steps", "replay_inserts", "replay_samples")
            if program.get(key) is not None
        }
        self._history.append((now, cumulative))
        while len(self._history) > 2 and now - self._history[1][0] >= _RATE_WINDOW_S:
            self._history.popleft()
        rates: dict[str, float | None] = {}
        for key in ("actor_steps", "learner_steps", "replay_inserts", "replay_samples"):
            # Against the oldest sample in the window that has the number (a counter key
            # appears only once something was counted).
            rates[key] = None
            for then, earlier in self._history:
                if key in earlier and key in cumulative and now > then:
                    rates[key] = (cumulative[key] - earlier[key]) / (now - then)
                    break
        steps = cumulative.get("actor_steps")
        step_rate = rates["actor_steps"]
        eta = None
        if steps is not None and step_rate:
            eta = max(self._max_steps - steps, 0) / step_rate
        return {
            "elapsed_s": round(now - self._started, 1),
            "frames": None if steps is None else int(steps * self._frames_per_step),
            "frames_per_s": None if step_rate is None else step_rate * self._frames_per_step,
            "learner_steps": cumulative.get("learner_steps"),
            "updates_per_s": rates["learner_steps"],
            "replay_size": program.get("replay_size"),
            "inserts_per_s": rates["replay_inserts"],
            "samples_per_s": rates["replay_samples"],
            "eval_return": program.get("eval_return"),
            "eta_s": eta,
        }

    def _maybe_say_estimate(self, row: Mapping[str, Any]) -> None:
        # Once the learner runs and rates are measured: how long the whole run would take.
        if self._estimate_said or not row["updates_per_s"] or row["eta_s"] is None:
            return
        self._estimate_said = True
        total_frames = self._max_steps * self._frames_per_step
        console.say(
            f"at the measured rate ({_number(row['frames_per_s'])} frames/s, "
            f"{_number(row['updates_per_s'], 2)} learner updates/s) the run reaches "
            f"max_actor_steps ({_number(float(total_frames), 0)} frames) in about "
            f"{format_duration(row['eta_s'])}",
            source="status",
            stream=self._stream,
        )

    # --- output ---------------------------------------------------------------------------

    def _plain_line(self, row: Mapping[str, Any], nodes: Mapping[str, dict]) -> str:
        states: dict[str, int] = {}
        for node in nodes.values():
            states[node["state"]] = states.get(node["state"], 0) + 1
        rss = sum(node.get("rss_mib", 0.0) for node in nodes.values())
        parts = [
            f"frames {_number(row['frames'], 0)}",
            f"{_number(row['frames_per_s'])} frames/s",
            f"{_number(row['updates_per_s'], 2)} updates/s",
            f"replay {_number(row['replay_size'], 0)}"
            f" (+{_number(row['inserts_per_s'])}/s, sampled {_number(row['samples_per_s'])}/s)",
            f"eval return {_number(row['eval_return'])}",
            f"ETA {format_duration(row['eta_s']) if row['eta_s'] is not None else '?'}",
            "nodes " + ", ".join(f"{n} {state}" for state, n in sorted(states.items())),
            f"RSS {rss / 1024:.1f} GiB",
        ]
        dead = [name for name, node in nodes.items() if node["state"] == "dead"]
        if dead:
            parts.append(f"dead: {', '.join(dead)}")
        return "; ".join(parts)

    def _table(self, row: Mapping[str, Any], nodes: Mapping[str, dict]) -> dict[str, Any]:
        header = (
            f"frames {_number(row['frames'], 0)} | {_number(row['frames_per_s'])} frames/s | "
            f"{_number(row['updates_per_s'], 2)} updates/s | "
            f"replay {_number(row['replay_size'], 0)}"
            f" (+{_number(row['inserts_per_s'])}/s, sampled {_number(row['samples_per_s'])}/s) | "
            f"eval return {_number(row['eval_return'])} | "
            f"ETA {format_duration(row['eta_s']) if row['eta_s'] is not None else '?'}"
        )
        columns = ["node", "state", "RSS MiB", "CPU %"]
        if self._gpu_memory is not None:
            columns.append("GPU MiB")
        rows = []
        for name, node in nodes.items():
            cells = [name, node["state"], _number(node.get("rss_mib"), 0), _number(node.get("cpu"))]
            if self._gpu_memory is not None:
                cells.append(_number(node.get("gpu_mib"), 0))
            rows.append(cells)
        return {"title": header, "columns": columns, "rows": rows}

    def _write_csv(self, row: Mapping[str, Any], nodes: Mapping[str, dict]) -> None:
        if self._csv_path is None:
            return
        flat = {"time": round(time.time(), 1), **row}
        for name, node in nodes.items():
            for key in ("state", "rss_mib", "cpu", "gpu_mib"):
                flat[f"{name}:{key}"] = node.get(key)
        cells = {
            k: ("" if v is None else round(v, 3) if isinstance(v, float) else v)
            for k, v in flat.items()
        }
        try:
            new_file = not self._csv_fields
            if new_file:
                self._csv_fields = list(cells)
                self._keep_other_header()
            with open(self._csv_path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._csv_fields, extrasaction="ignore")
                if new_file and f.tell() == 0:
                    writer.writeheader()
                writer.writerow(cells)
        except OSError:
            pass  # a full disk is reported by the nodes that must write; the view goes on

    def _keep_other_header(self) -> None:
        """An earlier launch with other nodes wrote other columns: keep its file aside."""
        assert self._csv_path is not None
        try:
            with open(self._csv_path, newline="") as f:
                header = next(csv.reader(f), None)
        except OSError:
            return
        if header is None or header == self._csv_fields:
            return
        number = 1
        while self._csv_path.with_name(f"status.{number}.csv").exists():
            number += 1
        self._csv_path.rename(self._csv_path.with_name(f"status.{number}.csv"))
