"""One (agent, task, seed) run on one pinned core, resumed where it stopped, and what it
leaves: `result.json` when it reached its last evaluation, a failure record when it did not.

Both agents read the same `Settings`. A run's folder holds its work folder, one log per
launch (`run-<n>.log`) and `attempts.jsonl` (one line per launch: when, the code it ran, how
it ended). A folder without `result.json` is a run that was cut off: the same command
continues it from its checkpoint (ours: the learner and the device store, saved every
`checkpoint_minutes` and on SIGTERM; the official agent: its `snapshot.pt`, written at each
episode's start, and the replay episodes it keeps on disk with `save_snapshot=true`). The
frames after the last checkpoint are run again, and their evaluation rows are replaced, not
repeated (`_last_per_frame`). Run folders are too large to commit, so an unfinished run also
keeps a small progress record (launches, evaluations so far) beside the kept results: when a
machine comes up new without the folder, the run starts again from frame 0 and the record of
the lost one is set aside under `lost/`, counted in the figure (`set_aside_lost`).

Training frames/s, one rule for both (`episode_windows`): the wall time between the rows
written when consecutive training episodes end (both agents write one, with `wall_time`),
over the windows that start at or after the seed frames and hold no evaluation and no
relaunch; the frames of those windows over their seconds, updates included. The official
agent's replay worker is a second process pinned to the same core (`taskset`): its budget
is the one core, as ours is.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import fcntl
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check import comparison, official
from benchmarks.learn_check.settings import (
    ACTION_REPEAT,
    ALLOCATOR,
    RESULT,
    Settings,
    failed_record,
    kept_result,
    lost_record,
    progress_record,
)
from magi_lp.launch.files import write_text_atomically
from magi_lp.runtime.workdir import Workdir

VENV312 = common.REPO / ".venv312"
VENV_OFFICIAL = common.REPO / ".venv-official"
ATTEMPTS = "attempts.jsonl"
CODE_PATHS = ("projects/drq_v2", "magi_lp/agent", "magi_lp/replay", "magi_lp/runtime")
"""The agent's, the replay's and the runner's code (the runner decides when the learner
updates): a run made by other code than HEAD's is marked."""
LOG_TAIL = 30


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _pinned(core: int | None, command: list[str]) -> list[str]:
    return command if core is None else ["taskset", "-c", str(core), *command]


def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=common.REPO, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def code_state() -> dict:
    """HEAD, whether the tree is dirty, and the agent's, replay's and runner's code (`CODE_PATHS`):
    HEAD's git tree hash of each, or "dirty:" and a hash of its changes (tracked and new
    files) where the work tree differs from HEAD there."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    code = {}
    for path in CODE_PATHS:
        changed = _git("status", "--porcelain", "--", path)
        if changed:
            diff = _git("diff", "HEAD", "--", path) + changed
            code[path] = "dirty:" + hashlib.sha256(diff.encode()).hexdigest()[:16]
        else:
            code[path] = _git("rev-parse", f"HEAD:{path}")
    return {"commit": _git("rev-parse", "HEAD"), "dirty": dirty, "code": code}


def machine() -> dict:
    found = common.machine()
    keys = ("cpu", "cpu_id", "cores", "ram_gib")
    return {key: found[key] for key in keys}


def _last_per_frame(
    pairs: list[tuple[int, float]], keep: int, launch_of_row: list[int] | None = None
) -> list[tuple[int, float]]:
    """Mean of the last whole evaluation at each frame (`keep` values), by frame: a
    relaunched run evaluates again at a point it had reached, and its rows (written last)
    replace the earlier ones. An evaluation cut short (a deadline's stop in the middle of it:
    seen on the H100, 5 of 10 episodes at 40k frames before a device call's deadline) is no
    point: a relaunch that gets there evaluates it again. `launch_of_row`: the launch (its
    index) that wrote each row (None: one launch), so a cut-short evaluation's rows are
    never averaged with the whole one of another launch before it (of other parameters: a
    relaunch from an older checkpoint); the latest launch with a whole evaluation at the
    frame gives it."""
    by_frame: dict[int, dict[int, list[float]]] = {}
    for index, (frame, value) in enumerate(pairs):
        launch = launch_of_row[index] if launch_of_row is not None else 0
        by_frame.setdefault(frame, {}).setdefault(launch, []).append(value)
    found = []
    for frame, launched in sorted(by_frame.items()):
        whole = [values for _, values in sorted(launched.items()) if len(values) >= keep]
        if whole:
            found.append((frame, sum(whole[-1][-keep:]) / keep))
    return found


def _launch_of(wall_time: str | None, launches: list[float]) -> int:
    """Which launch (by start, epoch seconds) wrote a row stamped `wall_time`: the last one
    started before it (0 when it has no stamp)."""
    return bisect.bisect_right(launches, float(wall_time)) if wall_time else 0


def episode_windows(
    ends: list[tuple[int, float, float | None]],
    eval_frames: list[int],
    seed_frames: int,
    launches: list[float],
) -> tuple[int, float, float | None]:
    """(frames, seconds, CPU seconds) of the clean windows between consecutive episode ends.

    `ends`: (frame, wall_time, cpu_time) of each training episode's end, by frame, one
    run's rows after a relaunch's repeats are removed. A window (previous end, this end]
    counts when it starts at or after `seed_frames`, no evaluation falls at its start or
    inside it (an evaluation at frame e runs after the episode ending at e, before the
    next), and no launch (`launches`, epoch seconds) falls inside it (a restart's gap).
    CPU seconds: the process tree's (the official replay worker included); None when a
    row lacks them.
    """
    frames, seconds, cpu = 0, 0.0, 0.0
    for (start, t0, c0), (end, t1, c1) in itertools.pairwise(ends):
        if start < seed_frames or end <= start or t1 <= t0:
            continue
        if any(start <= e < end for e in eval_frames):
            continue
        if any(t0 < launch < t1 for launch in launches):
            continue
        frames += end - start
        seconds += t1 - t0
        cpu = None if cpu is None or c0 is None or c1 is None else cpu + (c1 - c0)
    return frames, seconds, cpu


def _rate(frames: int, seconds: float, cpu: float | None) -> dict:
    fps = frames / seconds if seconds else None
    return {
        "train_frames_per_s": fps,
        "seconds_per_1000_frames": 1000.0 / fps if fps else None,
        "cpu_seconds_per_1000_frames": 1000.0 * cpu / frames if frames and cpu else None,
        "fps_frames": frames,
        "fps_rule": "episode_end_windows",
    }


def _float(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def ours_command(settings: Settings, task: str, seed: int, workdir: Path) -> list[str]:
    """`projects/drq_v2/main.py` (through `ours_main`, which stamps rows; main.py checkpoints on
    SIGTERM) on the current stack's device store, at `settings`."""
    steps = settings.frames // ACTION_REPEAT
    episode = settings.episode_frames
    cut = [f"--config.env.max_episode_frames={episode}"] if episode else []
    return [
        str(VENV312 / "bin" / "python"),
        "-m",
        "benchmarks.learn_check.ours_main",
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
        "--config.checkpoint.replay=True",
        f"--config.checkpoint.every_minutes={settings.checkpoint_minutes}",
        "--config.logging.tensorboard=False",
        "--config.env.video.every_evaluations=0",
        *cut,
    ]


def official_command(
    settings: Settings, task: str, seed: int, code_dir: Path, workdir: Path
) -> list[str]:
    """The official train.py (prepared in `code_dir`) on CPU at `settings`."""
    return official.command(
        code_dir,
        VENV_OFFICIAL / "bin" / "python",
        task=task,
        seed=seed,
        image_size=settings.image_size,
        batch_size=settings.batch_size,
        # One step past the last frame: train.py evaluates at the top of a step, and stops
        # before the step at num_train_frames: this gives the evaluation at `frames`.
        train_frames=settings.frames + ACTION_REPEAT,
        eval_every_frames=settings.eval_every_frames,
        eval_episodes=settings.eval_episodes,
        seed_frames=settings.seed_frames,
        replay_size=settings.replay_size,
        workdir=workdir,
    )


def _ours_episode_ends(rows: list[dict[str, str]]) -> list[tuple[int, float, float | None]]:
    """(end frame, wall_time, cpu_time) of each training episode, a relaunch's repeats
    removed. One launch's episodes follow each other (each starts where the last ended); a
    row that starts before the last one ended is a relaunch's first, starting at the step
    it resumed from, and the earlier rows that end after that step are dropped."""
    kept: list[tuple[int, int, float, float | None]] = []  # (start, end, wall, cpu)
    for row in rows:
        if not row.get("wall_time"):
            continue
        length = ACTION_REPEAT * int(float(row["episode_length"]))
        end = ACTION_REPEAT * int(float(row["actor_steps"]))
        start = end - length
        if kept and start < kept[-1][1]:  # a relaunch: its first episode starts at `start`
            kept = [k for k in kept if k[1] <= start]
        kept.append((start, end, float(row["wall_time"]), _float(row.get("cpu_time"))))
    return [(end, t, cpu) for _, end, t, cpu in kept]


def ours_result(settings: Settings, workdir: Path, launches: list[float]) -> dict:
    """Evaluation means by frame and training frames/s from main.py's CSV logs."""
    rows = _rows(Workdir(workdir).log_csv("evaluator_0"))
    pairs = [
        (ACTION_REPEAT * int(float(row.get("actor_steps") or 0)), float(row["episode_return"]))
        for row in rows
    ]
    started = sorted(launches)
    by = [_launch_of(row.get("wall_time"), started) for row in rows]
    evaluations = _last_per_frame(pairs, settings.eval_episodes, by)
    actor_rows = _rows(Workdir(workdir).log_csv("actor_0"))
    ends = _ours_episode_ends(actor_rows)
    # Every evaluation's frame, a cut-short one too: it took its window's time all the same.
    evaluated = sorted({f for f, _ in pairs})
    windows = episode_windows(ends, evaluated, settings.seed_frames, launches)
    rewards = {
        ACTION_REPEAT * int(float(row["actor_steps"])): float(row["episode_return"])
        for row in actor_rows
    }
    return {
        "evaluations": evaluations,
        "train_episode_rewards": sorted(rewards.items()),
        **_rate(*windows),
    }


def official_result(settings: Settings, workdir: Path, launches: list[float]) -> dict:
    """Evaluation returns by frame and training frames/s from the official eval.csv and
    train.csv (its Logger already drops rows a relaunch writes again; the last row per
    frame is kept besides)."""
    found = official.read_result(workdir)
    evaluations = _last_per_frame(found["evaluations"], 1)
    ends = sorted({frame: (frame, t, cpu) for frame, t, cpu in found["episode_ends"]}.values())
    windows = episode_windows(ends, [f for f, _ in evaluations], settings.seed_frames, launches)
    return {
        "evaluations": evaluations,
        "train_episode_rewards": found["train_episode_rewards"],
        **_rate(*windows),
    }


LIVE: set[subprocess.Popen] = set()
"""The runs this process has started and not yet seen end (`stop_all`)."""


def stop_all() -> None:
    """SIGTERM to every live run: ours saves a checkpoint and exits; the official agent
    stops (its snapshot is at the start of its episode). Both resume on the next call."""
    for process in list(LIVE):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)


def _launch(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> tuple[int, float]:
    """Runs `command` to its end; (exit code, CPU seconds of it and the children it waited
    for: the official replay worker included). Its own wait4, not the process-wide
    RUSAGE_CHILDREN: two runs end at different times in one process."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
        LIVE.add(process)
        try:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_utime + usage.ru_stime
        except BaseException:  # Ctrl-C or a kill of the command: stop the run (it resumes)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
        finally:
            LIVE.discard(process)


def read_attempts(folder: Path) -> list[dict]:
    path = folder / ATTEMPTS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_attempts(folder: Path, attempts: list[dict]) -> None:
    write_text_atomically(folder / ATTEMPTS, "".join(json.dumps(a) + "\n" for a in attempts))


def _close_cut_off(folder: Path, attempts: list[dict]) -> None:
    """A launch with no end recorded was killed with this command: its end is its log's
    last write."""
    for attempt in attempts:
        if "ended" not in attempt:
            log = folder / attempt["log"]
            attempt["ended"] = log.stat().st_mtime if log.is_file() else attempt["started"]
            attempt["exit_code"] = None
            attempt["end"] = "cut off (no exit recorded: the command was killed)"


def set_aside_lost(
    kept: Path, agent: str, task: str, seed: int, attempts: list[dict]
) -> Path | None:
    """The kept progress record of this (agent, task, seed), when it is not this folder's run
    (its first launch is not this folder's first): that run's folder was lost with its
    machine, and this one starts again from frame 0. The record is moved under `LOST` (the
    figure counts it) and its path returned; None when there is nothing to set aside."""
    path = progress_record(kept, agent, task, seed)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    theirs = record.get("attempts") or [{}]
    if attempts and theirs[0].get("started") == attempts[0].get("started"):
        return None
    target = lost_record(kept, agent, task, seed, str(theirs[0].get("started_at", "unknown")))
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)
    evaluations = comparison.evaluations_text(record.get("evaluations", []))
    print(f"learn_check: {agent} {task} seed {seed}: its earlier run ({len(theirs)} launch(es), "
          f"evaluations {evaluations or 'none'}) left no folder here (lost with its machine); "
          f"starting again from frame 0; its record is kept in {target}",
          file=sys.stderr)  # fmt: skip
    return target


def _keep_progress(
    kept: Path, agent: str, task: str, seed: int, settings: Settings, attempts: list[dict],
    found: dict,
) -> None:  # fmt: skip
    """Writes the run's progress record (`progress_record`): what a lost machine leaves."""
    path = progress_record(kept, agent, task, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "agent": agent,
        "task": task,
        "seed": seed,
        "settings": vars(settings),
        "machine": machine(),
        "attempts": attempts,
        "evaluations": found.get("evaluations", []),
    }
    rewards = found.get("train_episode_rewards") or []
    if rewards:  # what a lost run's record tells of how far it got, and how it was doing
        last = ", ".join(f"{reward:.0f}" for _, reward in rewards[-3:])
        record["at_stop"] = (
            f"{int(rewards[-1][0]):,} frames; training returns of its last episodes {last}"
        )
    write_text_atomically(path, json.dumps(record, indent=2) + "\n")


def log_tail(path: Path, lines: int = LOG_TAIL) -> list[str]:
    if not path.is_file():
        return []
    return path.read_text(errors="replace").splitlines()[-lines:]


def versions(agent: str) -> dict[str, str]:
    """The packages that make the agent's numbers (read from its venv)."""
    python = (VENV312 if agent == "magi_lp" else VENV_OFFICIAL) / "bin" / "python"
    names = (
        ("jax", "jaxlib", "dm-haiku", "optax", "numpy", "mujoco", "dm_control")
        if agent == "magi_lp"
        else ("torch", "numpy", "mujoco", "dm_control", "hydra-core")
    )
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "out = {'python': sys.version.split()[0]}\n"
        f"for n in {names!r}:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        output = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        return json.loads(output.stdout)
    except (OSError, ValueError):
        return {}


def _complete(result: dict, settings: Settings) -> bool:
    frames = [frame for frame, _ in result["evaluations"]]
    return bool(frames) and max(frames) >= settings.frames


@dataclasses.dataclass(frozen=True)
class Run:
    """One (agent, task, seed) run: its folder (`settings.run_dir`) and the folder its
    result and records are kept in (`kept`)."""

    agent: str
    task: str
    seed: int
    folder: Path
    kept: Path

    @property
    def name(self) -> str:
        """`<agent> <task> seed <seed>`, as the command's lines name a run."""
        return f"{self.agent} {self.task} seed {self.seed}"


def run_one(run: Run, settings: Settings, core: int | None, checkout: Path | None) -> dict:
    """Runs (or continues) `run`; when it has evaluated at `frames`, writes `result.json`
    into its folder and to `kept`. A launch that exits otherwise is kept as a failure record
    (`settings.failed_record`) with its exit code and log tail."""
    run.folder.mkdir(parents=True, exist_ok=True)
    with open(run.folder / ".lock", "w") as lock:
        try:  # one launch of a run at a time, whichever command started it
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"learn_check: {run.folder} is being run by another command; left to it",
                  file=sys.stderr)  # fmt: skip
            return {"exit_code": None, "wall_s": 0.0, "evaluations": [], "skipped": True}
        return _run_locked(run, settings, core, checkout)


def _run_locked(run: Run, settings: Settings, core: int | None, checkout: Path | None) -> dict:
    agent, task, seed, folder, kept = run.agent, run.task, run.seed, run.folder, run.kept
    attempts = read_attempts(folder)
    _close_cut_off(folder, attempts)
    set_aside_lost(kept, agent, task, seed, attempts)
    number = len(attempts) + 1
    workdir = folder / "work"
    attempt = {
        "attempt": number,
        "log": f"run-{number}.log",
        "started": time.time(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "core": core,
        "resumed": workdir.exists(),
        "allocator": ALLOCATOR,
        "machine": machine(),  # a run's launches can land on other hosts of one model name
        **code_state(),
    }
    attempts.append(attempt)
    _write_attempts(folder, attempts)
    reader = ours_result if agent == "magi_lp" else official_result
    launches = [a["started"] for a in attempts]
    try:  # the evaluations so far (a resumed run's)
        so_far = reader(settings, workdir, launches[:-1]) if attempt["resumed"] else {}
    except (OSError, ValueError, KeyError):
        so_far = {}
    _keep_progress(kept, agent, task, seed, settings, attempts, so_far)
    log = folder / attempt["log"]
    if agent == "magi_lp":
        env = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "JAX_PLATFORMS": "cpu",
               **ALLOCATOR}  # fmt: skip
        command = ours_command(settings, task, seed, workdir)
        code, cpu_s = _launch(_pinned(core, command), env, log, common.REPO)
    else:
        assert checkout is not None
        code_dir = official.prepare(checkout, folder / "code")
        command = official_command(settings, task, seed, code_dir, workdir)
        env = {**official.environment(folder), **ALLOCATOR}
        try:
            code, cpu_s = _launch(_pinned(core, command), env, log, code_dir)
        finally:
            official.remove_temp(env)
    attempt["ended"] = time.time()
    attempt["exit_code"] = code
    attempt["wall_s"] = attempt["ended"] - attempt["started"]
    attempt["cpu_s"] = cpu_s  # the run's processes (the official replay worker included)
    _write_attempts(folder, attempts)
    found = reader(settings, workdir, launches)
    result = {
        "agent": agent,
        "task": task,
        "seed": seed,
        "settings": vars(settings),
        "versions": versions(agent),
        "machine": machine(),
        "exit_code": code,
        "wall_s": sum(a["ended"] - a["started"] for a in attempts),
        "cpu_s_recorded": sum(a.get("cpu_s", 0.0) for a in attempts),
        "processes": 1 if agent == "magi_lp" else 2,  # the official replay worker
        "cores": 1,
        "attempts": attempts,
        **found,
    }
    if code == 0 and _complete(found, settings):
        text = json.dumps(result, indent=2) + "\n"
        write_text_atomically(folder / RESULT, text)
        path = kept_result(kept, agent, task, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
        progress_record(kept, agent, task, seed).unlink(missing_ok=True)  # the result holds it
        return result
    _keep_progress(kept, agent, task, seed, settings, attempts, found)
    if code != 0 and code not in (-signal.SIGTERM, -signal.SIGINT):
        record = {**result, "log_tail": log_tail(log), "log": str(log)}
        path = failed_record(kept, agent, task, seed, number)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(record, indent=2) + "\n")
        print(f"learn_check: {run.name} failed (exit {code}); kept in {path}; "
              f"log {log}", file=sys.stderr)  # fmt: skip
    return result
