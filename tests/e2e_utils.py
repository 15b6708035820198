"""Helpers for tests that run code in fresh processes: Python snippets (`run_python`) and the
real entry points (`run_entry_point`), with the leftovers they may leave found by a marker."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil
import pytest

from magi_lp.launch import processes

REPO = Path(__file__).resolve().parent.parent
MARK_VAR = "MAGI_LP_TEST_MARK"

# A test that `make test` runs in its current-stack leg only (.venv312, without Launchpad;
# the Makefile's PY312_TESTS lists its file): what that stack alone runs, or a slow test
# whose use is on that stack, kept out of the Launchpad leg so the two legs take about as
# long (scripts/test_both_stacks.sh).
CURRENT_STACK_LEG = pytest.mark.skipif(
    importlib.util.find_spec("launchpad") is not None,
    reason="the current-stack leg (make test runs it in .venv312, without Launchpad)",
)


def run_python(
    code: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """`python -c <code> <args>` in a fresh process (this interpreter), from the repo root,
    with the repo last on PYTHONPATH and the output captured as text.

    Args:
      code: the snippet; dedented, so a test may indent it.
      env: the child's whole environment (default: this process's).
      timeout: seconds before `subprocess.TimeoutExpired`.
      check: raise `subprocess.CalledProcessError` on a non-zero exit.
    """
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (child_env.get("PYTHONPATH", ""), str(REPO)) if p
    )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def run_on_host_devices(code: str, *args: str, devices: int = 2, timeout: float = 300) -> dict:
    """`run_python(code, *args)` with JAX on `devices` CPU devices (XLA's host-platform device
    count): the child must exit 0, and the JSON on its last stdout line is returned."""
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        JAX_PLATFORMS="cpu",
    )
    result = run_python(code, *args, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_entry_point(
    script: str,
    args: Sequence[str],
    *,
    timeout: float,
    mark: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Runs `python <script> <args>` from the repo root (`env`: variables to add); every
    process it starts inherits a marker variable so the test can find leftovers afterwards."""
    env = {**os.environ, **(env or {})}
    env[MARK_VAR] = mark or uuid.uuid4().hex
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_entry_point(
    script: str,
    args: Sequence[str],
    *,
    mark: str,
    log: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Starts an entry point in the background, its output going to `log` (`env`: variables
    to add)."""
    env = {**os.environ, **(env or {})}
    env[MARK_VAR] = mark
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, str(REPO / script), *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


class BackgroundRun:
    """A program a test started in the background (`process`), its output going to `log`:
    `wait` fails the test, showing the output's end, where the program outlives its time,
    after `kill_everything` (the subclass's: it kills what of the program runs, and says
    which processes, as `pid (name)`)."""

    process: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def kill_everything(self) -> list[str]:
        raise NotImplementedError

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            killed = self.kill_everything()
            pytest.fail(f"still running after {timeout} s ({killed}):\n{self.output()[-5000:]}")


def wait_while_running(
    condition: Callable[[], object], process: subprocess.Popen, log: Path, timeout: float = 240
) -> None:
    """Waits until `condition()` holds; fails, showing the end of `log`, where the process
    ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.5)


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live processes that inherited the marker (leftovers of a run)."""
    return processes.processes_marked(MARK_VAR, mark)


def assert_no_leftovers(mark: str, grace_s: float = 10.0) -> None:
    """Waits up to `grace_s` for the run's processes to end, then kills any still alive and
    fails naming them."""
    deadline = time.monotonic() + grace_s
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftover = processes.kill_processes(marked_processes(mark))
    assert leftover == [], f"processes left behind: {leftover}"


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV log."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def column(rows: list[dict[str, str]], key: str) -> list[float]:
    """The non-empty values of one column, as floats."""
    return [float(row[key]) for row in rows if row.get(key) not in (None, "")]


TD3_EPISODE_STEPS = 100
"""TD3_TINY's episodes, in agent steps (cartpole's own are 1000)."""
TD3_MIN_REPLAY = 200
"""TD3_TINY's `agent.min_replay_size`: the first update comes at this actor step."""

TD3_TINY = [
    f"--config.agent.min_replay_size={TD3_MIN_REPLAY}",
    "--config.agent.batch_size=32",
    "--config.agent.hidden_sizes=(32,32)",  # an update takes ~1-2 ms
    "--config.evaluation.episodes=1",
    "--config.evaluation.every_actor_steps=100000",
    "--config.logging.time_delta=0.0",
    f"--config.env.max_episode_steps={TD3_EPISODE_STEPS}",
]
"""TD3 (configs/td3_cartpole.py) at test sizes, for the entry-point tests: 100-step episodes."""


def checkpoint_counts(workdir: Path) -> dict[str, int]:
    """The program's step counts saved with the newest learner checkpoint of `workdir`."""
    from magi_lp.runtime.checkpointing import Checkpointer
    from magi_lp.runtime.workdir import Workdir

    _, metadata = Checkpointer(Workdir(workdir).learner_checkpoints).restore()
    return {key: int(value) for key, value in metadata["counts"].items()}
