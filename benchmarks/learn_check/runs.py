"""One (agent, task, seed) run on one pinned core, and what it leaves: `result.json`.

Both agents read the same `Settings`. A run writes `result.json` into its folder when it ends
(evaluation returns by frame, training frames/s, wall time, versions); a folder without one
is a run that was cut off, and is started again from scratch (a resumed run would refill its
replay, a curve neither agent would draw in one go).

Training frames/s, the same rule for both: the frames of training episodes that start after
the seed frames and hold no evaluation, over their seconds (updates included).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check import official
from benchmarks.learn_check.settings import ACTION_REPEAT, RESULT, Settings, kept_result

VENV312 = common.REPO / ".venv312"
VENV_OFFICIAL = common.REPO / ".venv-official"


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _pinned(core: int | None, command: list[str]) -> list[str]:
    return command if core is None else ["taskset", "-c", str(core), *command]


def _run(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> tuple[int, float]:
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            code = process.wait()
        except BaseException:  # Ctrl-C or a kill of the command: no orphan run
            process.terminate()
            process.wait(timeout=60)
            raise
    return code, time.monotonic() - start


def ours_command(settings: Settings, task: str, seed: int, workdir: Path) -> list[str]:
    """`projects/drq_v2/main.py` on the current stack's device store, at `settings`."""
    steps = settings.frames // ACTION_REPEAT
    episode = settings.episode_frames
    cut = [f"--config.env.max_episode_frames={episode}"] if episode else []
    return [
        str(VENV312 / "bin" / "python"),
        str(common.REPO / "projects" / "drq_v2" / "main.py"),
        f"--config={common.REPO / 'configs' / f'{task}.py'}",
        f"--workdir={workdir}",
        f"--config.seed={seed}",
        f"--config.max_actor_steps={steps}",
        f"--config.evaluation.every_actor_steps={settings.eval_every_frames // ACTION_REPEAT}",
        f"--config.evaluation.episodes={settings.eval_episodes}",
        f"--config.env.image_size={settings.image_size}",
        f"--config.agent.batch_size={settings.batch_size}",
        f"--config.agent.replay_buffer_size={settings.replay_size}",
        f"--config.agent.min_replay_frames={settings.seed_frames}",
        f"--config.agent.num_expl_steps={settings.seed_frames // ACTION_REPEAT}",
        "--config.replay.store=device",
        "--config.logging.tensorboard=False",
        "--config.env.video.every_evaluations=0",
        *cut,
    ]


def _ours_result(settings: Settings, workdir: Path) -> dict:
    """Evaluation means by frame and training frames/s from main.py's CSV logs."""
    by_frame: dict[int, list[float]] = {}
    for row in _rows(workdir / "logs" / "evaluator_0" / "logs.csv"):
        frame = ACTION_REPEAT * int(float(row.get("actor_steps") or 0))
        by_frame.setdefault(frame, []).append(float(row["episode_return"]))
    evaluations = [(frame, sum(v) / len(v)) for frame, v in sorted(by_frame.items())]
    points = {frame for frame, _ in evaluations}
    frames = seconds = 0.0
    for row in _rows(workdir / "logs" / "actor_0" / "logs.csv"):
        length = int(float(row["episode_length"]))
        end = ACTION_REPEAT * int(float(row["actor_steps"]))
        start = end - ACTION_REPEAT * length
        if start < settings.seed_frames or any(start < p < end for p in points):
            continue
        frames += ACTION_REPEAT * length
        seconds += length / float(row["steps_per_second"])
    return {
        "evaluations": evaluations,
        "train_frames_per_s": frames / seconds if seconds else None,
        "train_fps_frames": frames,
    }


def run_ours(settings: Settings, task: str, seed: int, folder: Path, core: int | None) -> dict:
    """One run of this project's DrQ-v2 (`.venv312`); returns its result (also written)."""
    workdir = folder / "work"
    env = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "JAX_PLATFORMS": "cpu"}
    command = _pinned(core, ours_command(settings, task, seed, workdir))
    code, wall_s = _run(command, env, folder / "run.log", common.REPO)
    return {"exit_code": code, "wall_s": wall_s, **_ours_result(settings, workdir)}


def run_official(
    settings: Settings, task: str, seed: int, folder: Path, core: int | None, checkout: Path
) -> dict:
    """One run of the official DrQ-v2 from a patched scratch copy of `checkout`."""
    code_dir = official.prepare(checkout, folder / "code")
    workdir = folder / "work"
    command = official.command(
        code_dir,
        VENV_OFFICIAL / "bin" / "python",
        task=task,
        seed=seed,
        image_size=settings.image_size,
        batch_size=settings.batch_size,
        # One step past the last frame: train.py evaluates at the top of a step, and stops
        # before the step at num_train_frames, so this gives the evaluation at `frames`.
        train_frames=settings.frames + ACTION_REPEAT,
        eval_every_frames=settings.eval_every_frames,
        eval_episodes=settings.eval_episodes,
        seed_frames=settings.seed_frames,
        replay_size=settings.replay_size,
        workdir=workdir,
    )
    code, wall_s = _run(
        _pinned(core, command), official.environment(), folder / "run.log", code_dir
    )
    result = official.read_result(workdir)
    shutil.rmtree(code_dir, ignore_errors=True)
    return {"exit_code": code, "wall_s": wall_s, **result}


def versions(agent: str) -> dict[str, str]:
    """The packages that make the agent's numbers (read from its venv)."""
    python = (VENV312 if agent == "magi_lp" else VENV_OFFICIAL) / "bin" / "python"
    names = ("jax", "jaxlib") if agent == "magi_lp" else ("torch",)
    probe = (
        "import importlib.metadata as m, json, sys; "
        f"print(json.dumps({{n: m.version(n) for n in {names!r}}} | "
        "{'python': sys.version.split()[0]}))"
    )
    try:
        output = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        return json.loads(output.stdout)
    except (OSError, ValueError):
        return {}


def run_one(
    agent: str,
    settings: Settings,
    task: str,
    seed: int,
    folder: Path,
    core: int | None,
    checkout: Path | None,
    kept: Path,
) -> dict:
    """Runs one (agent, task, seed) from scratch; writes its `result.json` into its folder
    and to `kept` (`settings.kept_result`)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if agent == "magi_lp":
        result = run_ours(settings, task, seed, folder, core)
    else:
        assert checkout is not None
        result = run_official(settings, task, seed, folder, core, checkout)
    result = {
        "agent": agent,
        "task": task,
        "seed": seed,
        "core": core,
        "started": started,
        "versions": versions(agent),
        "settings": vars(settings),
        **result,
    }
    if result["exit_code"] == 0 and result["evaluations"]:
        text = json.dumps(result, indent=2) + "\n"
        (folder / RESULT).write_text(text)
        path = kept_result(kept, agent, task, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    else:
        print(f"learn_check: {agent} {task} seed {seed} failed (exit {result['exit_code']}); "
              f"see {folder / 'run.log'}", file=sys.stderr)  # fmt: skip
    return result
