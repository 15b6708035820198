"""End to end on three "hosts": the tiny DrQ-v2 program prepared by `lp_main.py --launcher
hosts` and started from its generated per-host scripts, one per host at once, as a person (or
ssh) would on three machines.

The hosts are loopback addresses 127.0.0.2 (replay, counter, learner, evaluator,
coordinator), 127.0.0.3 and 127.0.0.4 (an actor each), inside a network namespace the test
creates (tests/multihost_driver.py), so no node port is reachable from anywhere else. The
coordinator stops the program at its step limit through its stop board; every node and every
host script exits 0 and no process is left. A second run with a higher limit resumes from
the shared workdir: the learner restores its checkpoint and the step counts go on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from magi_lp.launch import processes
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from projects.drq_v2 import tiny
from tests.e2e_utils import MARK_VAR, assert_no_leftovers, checkpoint_counts, read_csv

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["host-main.sh", "host-a1.sh", "host-a2.sh"]


def _env(marker: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK_VAR: marker})
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("MUJOCO_GL", "egl")
    return env


def _prepare(workdir: Path, max_actor_steps: int, marker: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "projects/drq_v2/lp_main.py"),
            "--config=tests/multihost_config.py",
            f"--workdir={workdir}",
            "--launcher=hosts",
            *tiny.flags(),
            f"--config.max_actor_steps={max_actor_steps}",
            "--config.variable_update_period=10",
            "--config.logging.time_delta=0.0",
        ],
        cwd=ROOT,
        env=_env(marker),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "prepared the program for 7 nodes" in result.stderr
    return result.stderr


def _run_hosts(workdir: Path, marker: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [
                sys.executable,
                str(ROOT / "tests/multihost_driver.py"),
                str(workdir / "cluster"),
                *SCRIPTS,
            ],
            cwd=ROOT,
            env=_env(marker),
            capture_output=True,
            text=True,
            timeout=360,
        )
    except subprocess.TimeoutExpired:
        processes.kill_marked(MARK_VAR, marker)
        pytest.fail("the hosts did not finish in 360 s")


def _check_clean_stop(result: subprocess.CompletedProcess, workdir: Path, marker: str) -> None:
    logs = workdir / "nodes"
    detail = result.stdout + result.stderr[-3000:] + (logs / "coordinator/0").read_text()[-3000:]
    assert result.returncode == 0, detail
    for script in SCRIPTS:
        assert f"{script}: exit code 0" in result.stdout
    for host, count in (("main", 5), ("a1", 1), ("a2", 1)):
        assert f"magi_lp host {host}: all {count} nodes ended; exit code 0" in result.stderr
    coordinator = (logs / "coordinator/0").read_text()
    assert "lp.stop() in coordinator/0: stopping 6 nodes" in coordinator
    assert "all 6 nodes ended" in coordinator
    assert "node coordinator/0 exits with code 0" in coordinator
    assert_no_leftovers(marker)


ACTORS = 2  # tests/multihost_config.py


def _actor_steps(workdir: Path) -> tuple[int, int]:
    """Episodes the actors logged, and the actor steps the final checkpoint counted."""
    rows = [read_csv(workdir / "logs" / f"actor_{i}" / "logs.csv") for i in range(ACTORS)]
    return sum(len(r) for r in rows), checkpoint_counts(workdir)["actor_steps"]


def _checkpoints(workdir: Path) -> list[int]:
    return sorted(
        int(p.name) for p in (workdir / "checkpoints/learner").iterdir() if p.name.isdigit()
    )


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_tiny_drq_on_three_loopback_hosts_stops_cleanly_and_resumes(tmp_path):
    workdir = tmp_path / "run"
    marker = uuid.uuid4().hex
    start = time.monotonic()
    _prepare(workdir, 300, marker)
    for script in SCRIPTS:
        assert (workdir / "cluster" / script).is_file()
    prepared = time.monotonic()
    result = _run_hosts(workdir, marker)
    _check_clean_stop(result, workdir, marker)
    first_run = time.monotonic()

    episodes, steps = _actor_steps(workdir)
    # Stopped at the limit, within the steps an actor takes between two reports to the
    # counter (episodes are 50 steps here: a stop at an episode's end would be up to 50 late).
    assert 300 <= steps < 300 + ACTORS * DISTRIBUTED_COUNT_EVERY
    assert read_csv(workdir / "logs/evaluator_0/logs.csv"), "no evaluation was logged"
    learner_rows = read_csv(workdir / "logs/learner/logs.csv")
    assert learner_rows and "critic_loss" in learner_rows[-1]
    saved = _checkpoints(workdir)
    assert saved, "no learner checkpoint"

    # Resume from the same workdir with a higher limit.
    _prepare(workdir, steps + 100, marker)
    result = _run_hosts(workdir, marker)
    _check_clean_stop(result, workdir, marker)
    more_episodes, more_steps = _actor_steps(workdir)
    assert more_episodes > episodes
    assert steps + 100 <= more_steps < steps + 100 + ACTORS * DISTRIBUTED_COUNT_EVERY
    # The counts came back with the learner's checkpoint: the actors only took the 100 new
    # steps (from zero they would have needed all steps + 100 of them).
    assert more_steps - steps < steps
    # The learner restored its checkpoint: its step count goes on from it (a learner still
    # compiling when the short second run stops saves the restored step again).
    assert _checkpoints(workdir)[-1] >= saved[-1]
    resumed_rows = read_csv(workdir / "logs/learner/logs.csv")[len(learner_rows) :]
    assert all(int(float(row["learner_steps"])) > saved[-1] for row in resumed_rows)
    print(
        f"multi-host e2e: prepare {prepared - start:.1f}s, first run "
        f"{first_run - prepared:.1f}s, resume (prepare + run) {time.monotonic() - first_run:.1f}s"
    )
