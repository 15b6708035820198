"""Running the distributed program as an operator would: stop it, relaunch it, kill its
launcher, start it from a script with SIGINT ignored.

Real entry point (`projects/td3/lp_main.py`), real Launchpad, Reverb and dm_control; the
launcher's stdout and stderr go to a file, as under nohup or CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from magi_lp.launch import processes
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from tests.e2e_utils import (
    MARK_VAR,
    REPO,
    TD3_EPISODE_STEPS,
    TD3_TINY,
    checkpoint_counts,
    column,
    marked_processes,
    read_csv,
    wait_while_running,
)

pytestmark = pytest.mark.integration

TINY = [
    "--config",
    "configs/td3_cartpole.py",
    *TD3_TINY,  # 100-step episodes
    "--config.num_actors=2",
    "--config.num_evaluators=0",
    "--config.logging.terminal=False",
]


def _start(workdir: Path, extra: list[str], *, mark: str, log: Path, tmp: Path, **popen):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    env[MARK_VAR] = mark
    env["PYTHONPATH"] = str(REPO)
    out = open(log, "w")  # noqa: SIM115 - closed with the process by the caller's wait
    return subprocess.Popen(
        [sys.executable, "projects/td3/lp_main.py", *TINY, "--workdir", str(workdir), *extra],
        cwd=REPO,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's job would be
        **popen,
    )


def _start_until_stopped(tmp_path: Path, mark: str, log_name: str, **popen):
    """A run with a step limit it never reaches (the test stops it): its workdir, its temp
    dir (TMPDIR, checked empty after), its log and its process."""
    workdir, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    log = tmp_path / log_name
    extra = ["--config.max_actor_steps=1000000"]
    return workdir, tmp, log, _start(workdir, extra, mark=mark, log=log, tmp=tmp, **popen)


def _actor_steps(workdir: Path) -> list[float]:
    """Every actor_steps value the actors logged (the counter's total at each episode end)."""
    steps = []
    for log in sorted((workdir / "logs").glob("actor_*/logs.csv")):
        steps += column(read_csv(log), "actor_steps")
    return steps


@pytest.fixture
def mark():
    """The marker of a test's processes; whatever of them is still running at its end (a
    failed assertion before the stop) is killed, so a failure never leaves a program."""
    mark = uuid.uuid4().hex
    yield mark
    processes.kill_processes(marked_processes(mark))


@pytest.mark.timeout(600)
def test_ctrl_c_saves_the_final_counts_and_a_relaunch_repeats_no_step(tmp_path, mark):
    workdir, tmp, log, process = _start_until_stopped(tmp_path, mark, "launch1.log")
    wait_while_running(lambda: len(_actor_steps(workdir)) >= 3, process, log)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground job
    assert process.wait(timeout=120) == 0, log.read_text()[-4000:]
    output = log.read_text()
    assert "received SIGINT: stopping" in output and "exit code 0" in output, output[-3000:]
    # Status lines reach a launcher whose output is a file (the first sample, and at the stop).
    status = [line for line in output.splitlines() if line.startswith("[magi_lp.status")]
    assert len(status) >= 2 and "frames/s" in status[-1], output[-3000:]
    assert (workdir / "status.csv").stat().st_size > 0

    # The saved counts are the counter's at the stop: at least the last count an actor
    # logged, plus the steps of the episodes the stop cut (reported every 20 steps).
    logged = max(_actor_steps(workdir))
    counts = checkpoint_counts(workdir)
    assert counts["actor_steps"] >= logged, (counts, logged)
    # After the nodes' end, the launcher says what the same command does next.
    stands = (
        f"the same command resumes from the newest checkpoint: learner step "
        f"{int(counts['learner_steps'])}, {int(counts['actor_steps'])} actor steps"
    )
    assert output.find(stands) > output.find("exit code 0"), output[-3000:]
    assert not marked_processes(mark)
    assert not list(tmp.iterdir()), f"left in the temp dir: {list(tmp.iterdir())}"

    # The relaunch continues the count: no actor step is taken (or logged) twice.
    log2 = tmp_path / "launch2.log"
    before = _actor_steps(workdir)
    target = int(counts["actor_steps"]) + 3 * TD3_EPISODE_STEPS  # 2 actors: an episode ends
    process = _start(workdir, [f"--config.max_actor_steps={target}"], mark=mark, log=log2, tmp=tmp)
    assert process.wait(timeout=300) == 0, log2.read_text()[-4000:]
    steps = _actor_steps(workdir)
    assert len(steps) == len(set(steps)), "an actor_steps value was logged twice"
    resumed = set(steps) - set(before)
    assert resumed and min(resumed) > counts["actor_steps"], (sorted(resumed), counts)
    final = checkpoint_counts(workdir)["actor_steps"]
    assert target <= final < target + 2 * DISTRIBUTED_COUNT_EVERY, (final, target)
    assert max(steps) <= final
    # The launcher's terminal says what it resumed from: the first launch's final save.
    resuming = (
        f"resuming from the workdir's newest checkpoint: learner step "
        f"{int(counts['learner_steps'])}, {int(counts['actor_steps'])} actor steps"
    )
    assert resuming in log2.read_text(), log2.read_text()[-3000:]
    assert (workdir / "nodes/learner/0.1").is_file(), "the first launch's node log was not kept"
    assert not marked_processes(mark)
    assert not list(tmp.iterdir()), f"left in the temp dir: {list(tmp.iterdir())}"


def _launcher_pid(mark: str) -> int:
    """The process that started the nodes: the parent of Launchpad's process_entry.py."""
    for proc in marked_processes(mark):
        try:
            if any("process_entry.py" in part for part in proc.cmdline()):
                return proc.ppid()
        except psutil.Error:
            continue
    raise AssertionError("no node process found")


@pytest.mark.timeout(400)
def test_inherited_ignored_sigint_is_respected_and_nodes_die_with_a_killed_launcher(tmp_path, mark):
    # `cmd &` from a script: the shell starts it with SIGINT ignored.
    workdir, _, log, process = _start_until_stopped(
        tmp_path,
        mark,
        "launch.log",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    wait_while_running(lambda: len(_actor_steps(workdir)) >= 2, process, log)
    os.killpg(process.pid, signal.SIGINT)
    time.sleep(3)
    assert process.poll() is None, log.read_text()[-4000:]
    assert " died" not in log.read_text(), log.read_text()[-4000:]
    assert "Ctrl-C will not stop the run; stop it with SIGTERM" in log.read_text()

    launcher = _launcher_pid(mark)
    nodes = [p for p in marked_processes(mark) if p.pid not in (process.pid, launcher)]
    assert len(nodes) >= 6
    os.kill(launcher, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in nodes):
        assert time.monotonic() < deadline, [p for p in nodes if p.is_running()]
        time.sleep(0.2)
    process.wait(timeout=30)
    assert not marked_processes(mark)


@pytest.mark.timeout(200)
def test_ctrl_c_while_importing_is_one_line(tmp_path, mark):
    _, _, log, process = _start_until_stopped(tmp_path, mark, "launch.log")
    # The entry point imports TensorFlow, Reverb and JAX for several seconds before launching.
    deadline = time.monotonic() + 60
    while "isolat" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(timeout=120)
    output = log.read_text()
    assert "Traceback" not in output, output[-3000:]
    if "started " not in output:  # it was still importing: one line, nothing launched
        assert code == 130, output[-3000:]
        assert "interrupted before the run started" in output
    else:
        assert code == 0, output[-3000:]
    assert not marked_processes(mark)
