"""End to end: DrQ-v2's entry points run to their frame limit at tiny sizes and leave logs,
evaluation returns, videos and a checkpoint behind.

(a) `main.py` (one process); (b) `lp_main.py` through real Launchpad with two actors: the
coordinator stops the program at the frame limit, the launcher returns 0, and no process of
the program is left (every process the run starts carries a marker variable in its
environment, which Launchpad passes on to its nodes; tests/e2e_utils finds it).

Tiny: projects/drq_v2/tiny.py (32x32 pixels, small networks, 50-step episodes, learning after
40 frames, one evaluation episode).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from magi_lp.launch import processes
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from projects.drq_v2 import tiny
from tests.e2e_utils import (
    MARK_VAR,
    assert_no_leftovers,
    checkpoint_counts,
    column,
    marked_processes,
    read_csv,
)

ROOT = Path(__file__).resolve().parents[1]

# Device-check mode on: every policy call and learner update checks its arrays' devices.
TINY = tiny.flags({"debug.check_devices": True})


def _run(script: str, config: str, workdir: Path, extra: list[str], timeout_s: float):
    """Runs an entry point in its own session; returns (exit code, output, marker)."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARK_VAR: marker})
    command = [
        sys.executable,
        str(ROOT / "projects" / "drq_v2" / script),
        f"--config={ROOT / 'configs' / config}",
        f"--workdir={workdir}",
        *TINY,
        *extra,
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        processes.kill_marked(MARK_VAR, marker)
        pytest.fail(f"{script} did not finish in {timeout_s}s; output tail:\n{output[-4000:]}")
    return process.returncode, output, marker


def _distributed_run(
    workdir: Path, flags: list[str], *, max_actor_steps: int, timeout_s: float = 400
) -> str:
    """`lp_main.py` on reacher_hard_distributed.py to `max_actor_steps`; it must stop by
    itself with exit code 0 and leave no process behind. Returns its output."""
    code, output, marker = _run(
        "lp_main.py",
        "reacher_hard_distributed.py",
        workdir,
        [*flags, f"--config.max_actor_steps={max_actor_steps}"],
        timeout_s=timeout_s,
    )
    assert code == 0, output[-6000:]
    assert_no_leftovers(marker)
    return output


def _rows(path: Path) -> list[dict]:
    assert path.is_file(), f"missing {path}"
    return read_csv(path)


def _check_outputs(workdir: Path, actor_labels: list[str]) -> None:
    logs = workdir / "logs"
    for label in actor_labels:
        rows = _rows(logs / label / "logs.csv")
        assert rows and all(float(row["episode_length"]) == 50 for row in rows), label
    evaluations = _rows(logs / "evaluator_0" / "logs.csv")
    assert evaluations, "no evaluation return was logged"
    for row in evaluations:
        assert 0.0 <= float(row["episode_return"]) <= 50.0  # reacher: <= 1 per frame x 50
    videos = list((workdir / "videos").glob("*.gif"))
    assert videos, "no evaluation video"
    assert [p for p in (workdir / "checkpoints" / "learner").iterdir() if p.name.isdigit()]


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_main_runs_to_its_frame_limit(tmp_path):
    workdir = tmp_path / "run"
    start = time.monotonic()
    code, output, marker = _run(
        "main.py",
        "reacher_hard.py",
        workdir,
        ["--config.max_actor_steps=100"],
        timeout_s=360,
    )
    elapsed = time.monotonic() - start
    assert code == 0, output[-4000:]
    assert "done: 100 actor steps" in output, output[-4000:]
    _check_outputs(workdir, ["actor_0"])
    learner_rows = _rows(workdir / "logs" / "learner" / "logs.csv")
    assert learner_rows and "critic_loss" in learner_rows[-1]
    # The learner's steps reach the program's counter under the key loggers index by.
    assert int(float(learner_rows[-1]["learner_steps"])) >= 1
    assert marked_processes(marker) == []
    print(f"main.py e2e: {elapsed:.1f}s")


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_lp_main_stops_at_its_frame_limit_and_a_relaunch_restores_the_reverb_replay(tmp_path):
    """Two actors on the Reverb frame replay: the program stops by itself at its step limit
    (launcher exit code 0, nothing left behind). With `checkpoint.reverb=True` the replay node
    writes its checkpoint at the stop (it stops last, after the actors and the learner's final
    save), and the next launch's server loads it: the relaunched replay starts with the items
    the first run left. (One program for both: each launch costs about a minute here.)"""
    workdir = tmp_path / "run"
    start = time.monotonic()
    flags = [
        # The Reverb frame replay (the tiny capacity would put 'auto' on the device store).
        "--config.replay.store=reverb",
        "--config.checkpoint.reverb=True",
        "--config.num_actors=2",
        "--config.variable_update_period=10",
        "--config.checkpoint.every_minutes=10.0",
        # Keep every episode row: the step sum below must not lose rows to the
        # loggers' 1 s time filter (it did once: 250 of 300 steps seen).
        "--config.logging.time_delta=0.0",
    ]
    # 2 actors may take all 300 steps before the evaluator has started up (seen at load 5):
    # the program then stops only after the evaluation at the limit, as main.py ends.
    limit = 300
    output = _distributed_run(workdir, flags, max_actor_steps=limit, timeout_s=480)
    elapsed = time.monotonic() - start
    _check_outputs(workdir, ["actor_0", "actor_1"])
    at = column(_rows(workdir / "logs" / "evaluator_0" / "logs.csv"), "actor_steps")
    assert at and max(at) >= limit, f"no evaluation at the limit of {limit} steps: {at}"
    # Stopped at the limit, not before, and within what 2 actors take between two reports to
    # the counter (a stop at episode ends would be up to 2 x 50 steps late).
    actor_steps = checkpoint_counts(workdir)["actor_steps"]
    assert limit <= actor_steps < limit + 2 * DISTRIBUTED_COUNT_EVERY, actor_steps
    print(f"lp_main.py e2e: {elapsed:.1f}s")
    replay_log = (workdir / "nodes" / "replay" / "0").read_text()
    written = re.search(r"replay checkpoint written to \S+ in [\d.]+ s: (.+)", replay_log)
    assert written, replay_log[-3000:]
    saved = written.group(1)
    assert re.search(r"[1-9]\d* items", saved), saved  # something worth restoring
    assert "killing them" not in output, output[-6000:]

    # The relaunch: no evaluator, only the replay's restore is checked.
    _distributed_run(workdir, [*flags, "--config.num_evaluators=0"], max_actor_steps=limit + 100)
    replay_log = (workdir / "nodes" / "replay" / "0").read_text()
    # Item counts as the first run's replay saw them at its stop, table by table.
    assert f"replay restored: {saved}" in replay_log, replay_log[-3000:]


@pytest.mark.integration
@pytest.mark.timeout(540)
def test_lp_main_with_a_batched_actor_and_a_two_device_learner(tmp_path):
    """One actor process steps 4 environments (one policy call for all 4); the learner sees
    two host devices and updates data-parallel over them; device checks on; it stops by
    itself at the step limit and leaves nothing behind."""
    workdir = tmp_path / "run"
    start = time.monotonic()
    flags = [
        "--config.num_actors=1",
        "--config.envs_per_actor=4",
        "--config.resources.learner.cpu_devices=2",
        "--config.variable_update_period=10",
        "--config.logging.time_delta=0.0",
        # The actor must wait for the learner: with a short step queue the replay ratio's
        # error buffer (200 steps) plus the queue is less than the 400 steps of the run, so
        # the actor can only finish once the learner has updated. Without it the actor's 400
        # steps could end the run before the learner's 2-device update had compiled (twice
        # in a row at load 10-20: 0 learner steps, final save at step 0).
        "--config.replay.store=device",
        "--config.replay.queue_steps=40",
    ]
    # Two episodes per environment: the learner's first (2-device) update compiles while the
    # actor fills replay; the replay ratio holds the actor until it is done.
    _distributed_run(workdir, flags, max_actor_steps=400, timeout_s=480)
    elapsed = time.monotonic() - start
    _check_outputs(workdir, ["actor_0"])
    rows = _rows(workdir / "logs" / "actor_0" / "logs.csv")
    assert {int(float(row["environment"])) for row in rows} == {0, 1, 2, 3}
    assert sum(int(float(row["episode_length"])) for row in rows) >= 400
    learner_log = "".join(
        p.read_text() for p in (workdir / "nodes" / "learner").rglob("*") if p.is_file()
    )
    assert "data-parallel over 2 devices (cpu:0, cpu:1" in learner_log, learner_log[-3000:]
    learner_rows = _rows(workdir / "logs" / "learner" / "logs.csv")
    assert learner_rows and int(float(learner_rows[-1]["learner_steps"])) >= 1
    print(f"lp_main.py batched actor + 2-device learner e2e: {elapsed:.1f}s")


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_lp_main_on_the_device_store_stops_and_resumes_with_its_replay(tmp_path):
    """The device frame store end to end: actors send each step once through the Reverb
    queue, the learner drains it into its store and learns; the run stops by itself at its
    limit, saves the store with the learner (`checkpoint.replay`), and a relaunch restores
    both and goes on counting where it stopped: no step is repeated."""
    from magi_lp.runtime.checkpoint_metadata import saved_metadata
    from magi_lp.runtime.checkpointing import Checkpointer
    from magi_lp.runtime.workdir import Workdir

    workdir = tmp_path / "run"
    common = [
        "--config.replay.store=device",
        "--config.checkpoint.replay=True",
        "--config.num_actors=2",
        "--config.variable_update_period=10",
        "--config.logging.time_delta=0.0",
    ]
    output = _distributed_run(workdir, common, max_actor_steps=300)
    first = _rows(workdir / "logs" / "learner" / "logs.csv")
    assert first, "the learner never updated on the device store"
    first_updates = int(float(first[-1]["learner_steps"]))
    saved, _ = Checkpointer(workdir / "checkpoints" / "replay_store").restore()
    saved_size = int(sum(saved["size"]))
    assert saved_size > 0
    # Every counted step is in the saved store, those the queue held at the stop too: its
    # frames are the counted steps, one first frame per ended episode, and at most one open
    # episode's first frame and one given-up write per actor.
    counts = saved_metadata(Workdir(str(workdir)).learner_checkpoints)["counts"]
    frames = int(saved["counts"][2])
    extra = frames - int(counts["actor_steps"]) - int(counts["actor_episodes"])
    assert 0 <= extra <= 2 * 2, (frames, counts, output[-3000:])

    _distributed_run(workdir, common, max_actor_steps=600)
    learner_log = (workdir / "nodes" / "learner" / "0").read_text()
    assert f"replay restored: {saved_size} transitions" in learner_log, learner_log[-3000:]
    rows = _rows(workdir / "logs" / "learner" / "logs.csv")[len(first) :]
    assert rows, "the resumed learner never updated"
    # Counting goes on from the checkpoint: no update and no actor step is counted twice.
    assert int(float(rows[0]["learner_steps"])) > first_updates
    assert int(float(rows[0]["actor_steps"])) >= 300
    assert int(float(rows[-1]["actor_steps"])) >= 600
