"""The single-process path on the current stack (Python 3.12, current JAX; no Launchpad,
Reverb or TensorFlow): DrQ-v2 on the device frame store and TD3 on the host transition
replay, each through its real `main.py` to its step limit, then resumed once from its
workdir. Real dm_control, real pixels; tiny sizes.

`make test` runs this file in `.venv312` (requirements-py312.txt); in the Launchpad stack's
venv it is skipped, since there `tests/test_drq_e2e.py` and `tests/test_td3_e2e.py` run the
same entry points with Reverb beside them.
"""

from __future__ import annotations

import importlib.util
import math
import signal
import uuid

import pytest

from projects.drq_v2 import tiny
from tests.e2e_utils import (
    CURRENT_STACK_LEG,
    column,
    marked_processes,
    read_csv,
    run_entry_point,
    start_entry_point,
    wait_while_running,
)

pytestmark = [
    pytest.mark.integration,
    CURRENT_STACK_LEG,
]


def test_this_stack_has_no_launchpad_reverb_or_tensorflow():
    for name in ("launchpad", "reverb", "tensorflow"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed in this venv"


def _run(script: str, config: str, workdir, extra: list[str], timeout: float):
    mark = uuid.uuid4().hex
    result = run_entry_point(
        script, ["--config", config, "--workdir", str(workdir), *extra], timeout=timeout, mark=mark
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert not marked_processes(mark)
    return output


def _newest_checkpoint(workdir) -> int:
    return max(int(p.name) for p in (workdir / "checkpoints/learner").iterdir())


def _run_to(script: str, config: str, workdir, flags: list[str], max_actor_steps: int) -> str:
    """`script` on `workdir` until `max_actor_steps`; a relaunch (a workdir with checkpoints)
    must say it resumed from the newest one."""
    resumes = (workdir / "checkpoints/learner").is_dir()
    newest = _newest_checkpoint(workdir) if resumes else None
    output = _run(
        script, config, workdir, [*flags, f"--config.max_actor_steps={max_actor_steps}"], 280
    )
    if resumes:
        assert f"resumed from learner step {newest}" in output, output[-3000:]
    return output


@pytest.mark.timeout(600)
def test_drq_v2_runs_on_the_device_store_and_resumes(tmp_path):
    workdir = tmp_path / "drq"
    # Every actor row kept: at the default time_delta (1 s) a 50-step episode that ran in
    # under a second was dropped from the log on a quick moment (seen: [50, 100, 150]).
    flags = tiny.flags({"logging.tensorboard": True, "logging.time_delta": 0.0})
    first = _run_to("projects/drq_v2/main.py", "configs/reacher_hard.py", workdir, flags, 100)
    assert "replay: device store" in first
    assert "done: 100 actor steps" in first
    learner = read_csv(workdir / "logs/learner/logs.csv")
    losses = column(learner, "critic_loss")
    assert losses and all(math.isfinite(x) for x in losses)
    assert column(learner, "learner_steps")[-1] >= 1
    first_updates = _newest_checkpoint(workdir)
    assert list((workdir / "tensorboard/learner").glob("events.out.tfevents.*"))
    assert list((workdir / "videos").glob("*.gif")), "no evaluation video"

    _run_to("projects/drq_v2/main.py", "configs/reacher_hard.py", workdir, flags, 200)
    actor = read_csv(workdir / "logs/actor_0/logs.csv")
    steps = column(actor, "actor_steps")
    # The relaunch goes on from 100: no actor step is taken twice.
    assert steps == sorted(steps) and steps[-1] == 200, steps
    assert int(column(read_csv(workdir / "logs/learner/logs.csv"), "learner_steps")[-1]) > (
        first_updates
    )


@pytest.mark.timeout(600)
def test_td3_runs_on_the_host_replay_and_resumes(tmp_path):
    workdir = tmp_path / "td3"
    flags = [
        "--config.agent.min_replay_size=100",
        "--config.agent.batch_size=32",
        "--config.agent.hidden_sizes=(32,32)",
        "--config.evaluation.episodes=1",
        "--config.evaluation.every_actor_steps=100000",
        "--config.logging.time_delta=0.0",
        "--config.logging.tensorboard=False",
        "--config.env.action_repeat=4",  # 250-step episodes: the runs stop at an episode's end
    ]
    first = _run_to("projects/td3/main.py", "configs/td3_cartpole.py", workdir, flags, 250)
    assert "replay: host transitions, in this process" in first, first[-3000:]
    assert "done: 250 actor steps" in first
    learner = read_csv(workdir / "logs/learner/logs.csv")
    assert all(math.isfinite(x) for x in column(learner, "critic_loss"))
    first_updates = _newest_checkpoint(workdir)
    assert first_updates >= 140  # (250 - 100) updates, give or take the schedule's rounding
    # A relaunch with other networks: one line before anything starts (it failed at restore,
    # after the replay and the actor were up, with 60 shapes and no key named).
    other = [f.replace("(32,32)", "(16,16)") for f in flags] + ["--config.max_actor_steps=500"]
    refused = run_entry_point(
        "projects/td3/main.py",
        ["--config", "configs/td3_cartpole.py", "--workdir", str(workdir), *other],
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: agent.hidden_sizes=(16,16): the run in {workdir} was saved with "
        "agent.hidden_sizes=(32,32); a relaunch resumes that run; give "
        "--config.agent.hidden_sizes=(32,32) to resume it, or a new --workdir for a new run"
    ), refused.stderr[-3000:]
    assert _newest_checkpoint(workdir) == first_updates

    second = _run_to("projects/td3/main.py", "configs/td3_cartpole.py", workdir, flags, 500)
    # The counts go on from the first run's: 250 more actor steps, not 500.
    assert "done: 500 actor steps" in second, second[-3000:]
    assert column(read_csv(workdir / "logs/actor_0/logs.csv"), "actor_steps") == [250, 500]
    evaluations = read_csv(workdir / "logs/evaluator_0/logs.csv")

    # The same command once more: the run is done; nothing starts, nothing is logged.
    third = _run(
        "projects/td3/main.py",
        "configs/td3_cartpole.py",
        workdir,
        [*flags, "--config.max_actor_steps=500"],
        60,
    )
    assert "nothing to do: the run in" in third and "max_actor_steps=500" in third, third
    assert "done:" not in third, third
    assert read_csv(workdir / "logs/evaluator_0/logs.csv") == evaluations


@pytest.mark.timeout(300)
def test_sigterm_stops_main_py_with_a_final_checkpoint(tmp_path):
    # `kill` (a scheduler's stop, a benchmark's) saves as Ctrl-C does; the same command resumes.
    mark = uuid.uuid4().hex
    flags = [
        "--config.agent.min_replay_size=100",
        "--config.agent.batch_size=32",
        "--config.agent.hidden_sizes=(32,32)",
        "--config.evaluation.episodes=1",
        "--config.logging.time_delta=0.0",
        "--config.logging.tensorboard=False",
        "--config.checkpoint.every_minutes=1000.0",  # no periodic save: only the final one
        "--config.max_actor_steps=1000000",
    ]
    args = ["--config", "configs/td3_cartpole.py", "--workdir", str(tmp_path), *flags]
    log = tmp_path.parent / f"{tmp_path.name}.log"
    process = start_entry_point("projects/td3/main.py", args, mark=mark, log=log)
    learner = tmp_path / "logs/learner/logs.csv"
    wait_while_running(lambda: learner.exists() and read_csv(learner), process, log)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    output = log.read_text()
    resumes = "the same command resumes from the newest checkpoint: learner step"
    assert "stopped at " in output and resumes in output, output[-3000:]
    assert list((tmp_path / "checkpoints/learner").iterdir()), "no final checkpoint"
    assert not marked_processes(mark)


@pytest.mark.parametrize(
    ("script", "config", "extra", "expected"),
    [
        (
            "projects/drq_v2/lp_main.py",
            "configs/reacher_hard_distributed.py",
            # The Launchpad engine asked for on this stack, where Ray is the default.
            ["--launcher", "local"],
            "--launcher local (Launchpad on this machine, Reverb replay): launchpad, reverb "
            "not installed here (Python 3.12); use --launcher ray on this stack",
        ),
        (
            "projects/td3/main.py",
            "configs/td3_cartpole.py",
            ["--config.replay.store=reverb"],
            "replay.store=reverb: Reverb is not installed here",
        ),
    ],
)
def test_what_needs_launchpad_or_reverb_is_refused_in_one_line(
    tmp_path, script, config, extra, expected
):
    mark = uuid.uuid4().hex
    workdir = tmp_path / "run"
    result = run_entry_point(
        script, ["--config", config, "--workdir", str(workdir), *extra], timeout=120, mark=mark
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (workdir / "nodes").exists() and not marked_processes(mark)


def _event_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from the TFRecord event files under `folder` (read with
    tensorboardX's own protos: no TensorFlow here)."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            record = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_logs_through_tensorboardx(tmp_path):
    from magi_lp.runtime import loggers

    assert loggers.tensorboard_backend() == "tensorboardX"
    logger = loggers.TensorBoardLogger(tmp_path, steps_key="steps")
    logger.write({"steps": 7, "loss": 0.25, "name": "x"})
    logger.write({"steps": 9, "loss": 0.5})
    logger.close()
    assert _event_scalars(tmp_path) == {"loss": [(7, 0.25), (9, 0.5)]}
