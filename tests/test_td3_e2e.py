"""End to end: the small TD3 agent through both runners, and resuming a killed run.

These run the real entry points (`projects/td3/main.py`, `projects/td3/lp_main.py`) as
subprocesses with real Reverb, real dm_control and, for the distributed run, real Launchpad
local multi-processing. Settings are tiny so the whole file stays within a few minutes.
"""

from __future__ import annotations

import math
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from magi_lp.launch import isolation, run_folders
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from tests.e2e_utils import (
    TD3_EPISODE_STEPS,
    TD3_MIN_REPLAY,
    TD3_TINY,
    checkpoint_counts,
    column,
    marked_processes,
    read_csv,
    run_entry_point,
    start_entry_point,
    wait_while_running,
)

pytestmark = pytest.mark.integration

CONFIG = "configs/td3_cartpole.py"
# Episodes of 100 agent steps (TD3_TINY); every policy call and update checks its devices.
TINY = [*TD3_TINY, "--config.debug.check_devices=True"]
# Steps of a resumed single-process run: its replay starts empty (main.py's is not saved),
# so it updates again once TD3_MIN_REPLAY new steps are in.
RESUMED = 3 * TD3_EPISODE_STEPS


def _workdir_args(workdir: Path) -> list[str]:
    return ["--config", CONFIG, "--workdir", str(workdir)]


def _run_tiny(
    script: str, workdir: Path, *flags: str, timeout: float, mark: str | None = None
) -> subprocess.CompletedProcess:
    """`script` on TD3's tiny settings in `workdir`, with `flags` added."""
    args = [*_workdir_args(workdir), *TINY, *flags]
    return run_entry_point(script, args, timeout=timeout, mark=mark)


@pytest.mark.timeout(300)
def test_single_process_run_updates_logs_and_counts_exactly(tmp_path):
    mark = uuid.uuid4().hex
    result = _run_tiny(
        "projects/td3/main.py",
        tmp_path,
        "--config.max_actor_steps=400",
        "--config.logging.tensorboard=True",
        timeout=280,
        mark=mark,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "done: 400 actor steps" in result.stderr

    learner = read_csv(tmp_path / "logs/learner/logs.csv")
    losses = column(learner, "critic_loss")
    assert losses and all(math.isfinite(loss) for loss in losses)
    steps = column(learner, "learner_steps")
    assert steps == sorted(steps) and steps[-1] >= 150  # (400 - 200) / 1 updates, minus gaps

    actor = read_csv(tmp_path / "logs/actor_0/logs.csv")
    assert column(actor, "actor_steps") == [100, 200, 300, 400]  # whole episodes of 100
    evaluator = read_csv(tmp_path / "logs/evaluator_0/logs.csv")
    assert column(evaluator, "episode_return"), "no evaluation return logged"

    events = list((tmp_path / "tensorboard/learner").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    # The final checkpoint is at exactly the updates the schedule owes after 400 steps:
    # the first at min_replay_size (200), then one per actor step.
    final = max(int(p.name) for p in (tmp_path / "checkpoints/learner").iterdir())
    assert final == 400 - TD3_MIN_REPLAY + 1
    assert not marked_processes(mark)


@pytest.mark.timeout(420)
def test_distributed_run_stops_by_itself_at_the_step_limit(tmp_path):
    mark = uuid.uuid4().hex
    result = _run_tiny(
        "projects/td3/lp_main.py",
        tmp_path,
        "--config.num_actors=2",
        "--config.num_evaluators=1",
        "--config.max_actor_steps=600",
        timeout=400,
        mark=mark,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # The coordinator's lp.stop() is a SIGTERM to the launcher, which says why it came.
    assert "the coordinator reached max_actor_steps: stopping" in output, output[-4000:]
    assert "received SIGTERM" not in output, output[-4000:]
    # The default isolation: where namespaces can be made, the nodes trained and stopped
    # inside a loopback-only one.
    if isolation.probe().available:
        assert "isolated: node ports are reachable over loopback only" in output

    # The actors stepped into the one counter (episodes of 100 steps: together they end
    # several); the run stopped at the limit, within what the 2 actors take between two
    # reports to the counter.
    rows = [read_csv(tmp_path / f"logs/actor_{index}/logs.csv") for index in (0, 1)]
    assert column(rows[0] + rows[1], "episode_return"), "no actor logged an episode"
    assert 600 <= checkpoint_counts(tmp_path)["actor_steps"] < 600 + 2 * DISTRIBUTED_COUNT_EVERY
    learner = read_csv(tmp_path / "logs/learner/logs.csv")
    assert all(math.isfinite(loss) for loss in column(learner, "critic_loss"))
    assert column(read_csv(tmp_path / "logs/evaluator_0/logs.csv"), "episode_return")
    assert list((tmp_path / "checkpoints/learner").iterdir()), "no final checkpoint"
    assert not marked_processes(mark), "processes of the program outlived it"

    # Launched again as it was: the run is done, so nothing starts.
    again = _run_tiny(
        "projects/td3/lp_main.py",
        tmp_path,
        "--config.num_actors=2",
        "--config.max_actor_steps=600",
        timeout=120,
        mark=mark,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to do: the run in" in again.stderr, again.stderr[-3000:]
    assert "started" not in again.stderr and not marked_processes(mark)


def _latest_checkpoint(workdir: Path) -> int | None:
    folder = workdir / "checkpoints/learner"
    steps = [int(p.name) for p in folder.glob("*") if p.name.isdigit()] if folder.exists() else []
    return max(steps) if steps else None


@pytest.mark.timeout(420)
def test_killed_single_process_run_resumes_from_its_checkpoint(tmp_path):
    mark = uuid.uuid4().hex
    args = [
        *_workdir_args(tmp_path),
        *TINY,
        "--config.max_actor_steps=100000",
        "--config.checkpoint.every_minutes=0.05",
    ]
    # The runs' temp folder: what a killed run leaves there goes at the next run's start.
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    log = tmp_path / "run1.log"
    process = start_entry_point("projects/td3/main.py", args, mark=mark, log=log, env=env)
    actor_log = tmp_path / "logs/actor_0/logs.csv"

    # Wait for one episode, then for a checkpoint after it.
    wait_while_running(lambda: actor_log.exists() and read_csv(actor_log), process, log, 300)
    after_episode = _latest_checkpoint(tmp_path) or 0
    wait_while_running(
        lambda: (_latest_checkpoint(tmp_path) or 0) > after_episode, process, log, 300
    )
    process.send_signal(signal.SIGKILL)  # no chance to save anything more
    process.wait(timeout=30)
    killed_at = _latest_checkpoint(tmp_path)
    assert killed_at is not None and killed_at > 0
    # Killed with SIGKILL: TensorFlow's autograph files stay, in the run's own folder.
    left = list(temp.iterdir())
    assert [p.name.startswith(run_folders.RUN_TMP_PREFIX) for p in left] == [True], left
    assert list(left[0].glob("__autograph_generated_file*.py"))

    first_run = read_csv(tmp_path / "logs/actor_0/logs.csv")
    # The steps counted up to the checkpoint (mid-episode: steps are counted as they happen).
    steps_before = checkpoint_counts(tmp_path)["actor_steps"]

    result = run_entry_point(
        "projects/td3/main.py",
        [*args[:-2], f"--config.max_actor_steps={int(steps_before) + RESUMED}"],
        timeout=300,
        mark=mark,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"resumed from learner step {killed_at}" in result.stderr
    assert not list(temp.iterdir())  # the killed run's folder swept, the resumed run's removed
    learner_steps = column(read_csv(tmp_path / "logs/learner/logs.csv"), "learner_steps")
    resumed_rows = [step for step in learner_steps if step > killed_at]
    assert resumed_rows, "no learner rows after the resume"
    assert _latest_checkpoint(tmp_path) > killed_at
    actor_steps = column(read_csv(tmp_path / "logs/actor_0/logs.csv"), "actor_steps")
    # The resumed run continued counting from the checkpoint, not from 0: its episodes
    # (fresh ones of 100 steps) ended at exactly its limit, and the run stopped there.
    resumed_ends = [
        steps_before + TD3_EPISODE_STEPS * (i + 1) for i in range(RESUMED // TD3_EPISODE_STEPS)
    ]
    assert actor_steps[len(first_run) :] == resumed_ends, "actor steps restarted"
    assert checkpoint_counts(tmp_path)["actor_steps"] == steps_before + RESUMED
    assert not marked_processes(mark)


@pytest.mark.timeout(300)
def test_same_seed_gives_the_same_experience_in_one_process(tmp_path):
    # Acting, environments and initial parameters follow the seed. Learner batches do not:
    # Reverb's sampler cannot be seeded (google-deepmind/reverb#25), so this compares what
    # happens before the first update: the random-action phase and the initial policy.
    returns = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        workdir = tmp_path / name
        result = _run_tiny(
            "projects/td3/main.py",
            workdir,
            f"--config.seed={seed}",
            "--config.max_actor_steps=200",
            "--config.agent.min_replay_size=5000",  # no learner step in this run
            "--config.checkpoint.enabled=False",
            timeout=280,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        actor = column(read_csv(workdir / "logs/actor_0/logs.csv"), "episode_return")
        evaluator = column(read_csv(workdir / "logs/evaluator_0/logs.csv"), "episode_return")
        returns[name] = (actor[0], evaluator[0])
    assert returns["a"] == returns["b"]
    assert returns["a"] != returns["c"]
