"""Figure 5: environment frames/s collected with 1, 2 and 4 distributed actors, and by the
single-process runner, with the same config.

Each run is the real entry point (`projects/drq_v2/lp_main.py` or `main.py`) with
configs/reacher_hard_distributed.py: 84x84 pixels, the paper's network sizes in every actor,
frame replay writes, parameter pulls from the learner every 100 steps (the distributed
setting; the single-process runner reads its in-process learner). Learning is kept out of the
measurement (`min_replay_frames` above what the window collects), so the figure is about
collection: the learner is idle, waiting for replay. Episodes are cut at 100 frames so each
actor logs a row every ~50 agent steps, and no evaluator runs.

Measurement: once every actor has logged its first episode (compiled, first parameters
pulled), the agent steps in all actors' CSV logs are summed at the start and the end of a
fixed wall-clock window; frames/s = steps x action repeat / window. The cores of this
machine bound the scaling: actors beyond the core count share cores.
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    cpu_only_env,
    entry_point,
    figure_main,
    fmt,
    marked_env,
    progress,
    ratio,
    started,
    tail,
)
from magi_lp.runtime.workdir import Workdir

TITLE = "Actor scaling: frames/s with 1, 2, 4 actors and in one process"
CONFIG = "configs/reacher_hard_distributed.py"
STARTUP_TIMEOUT_S = 420.0
SETTINGS = [
    "--config.env.max_episode_frames=100",
    "--config.env.video.every_evaluations=0",
    "--config.agent.min_replay_frames=1000000000",
    "--config.num_evaluators=0",
    "--config.logging.tensorboard=False",
    "--config.logging.terminal=False",
    "--config.logging.time_delta=0.0",
    "--config.checkpoint.every_minutes=1000.0",
    "--config.max_actor_steps=1000000000",
    "--config.isolation=off",
]


def subprocess_env() -> dict[str, str]:
    return cpu_only_env()


def _steps(csv_path: Path) -> int | None:
    """Agent steps an actor has logged (sum of episode lengths); None before its first row."""
    try:
        with csv_path.open(newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError:
        return None
    lengths = [row.get("episode_length") for row in rows]
    lengths = [float(x) for x in lengths if x not in (None, "")]
    return int(sum(lengths)) if lengths else None


def collect(script: str, actors: int, window_s: float, workdir: Path) -> dict:
    """Runs one entry point; agent steps over `window_s` after every actor's first row."""
    labels = [f"actor_{i}" for i in range(actors)]
    command = entry_point(
        f"projects/drq_v2/{script}", CONFIG, workdir, *SETTINGS, f"--config.num_actors={actors}"
    )
    log = workdir.parent / f"{workdir.name}.log"
    start = time.monotonic()
    with started(command, marked_env(cpu_only_env()), log) as process:

        def total() -> int | None:
            counts = [_steps(Workdir(workdir).log_csv(label)) for label in labels]
            return None if None in counts else sum(counts)

        while total() is None:
            if process.poll() is not None:
                raise RuntimeError(f"{script} exited early; log tail:\n{tail(log)}")
            if time.monotonic() - start > STARTUP_TIMEOUT_S:
                raise RuntimeError(f"{script}: no actor episode in {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        warm_s = time.monotonic() - start
        steps_before, t0 = total(), time.monotonic()
        time.sleep(window_s)
        steps_after, t1 = total(), time.monotonic()
        if process.poll() is not None:
            raise RuntimeError(f"{script} exited during the window; log tail:\n{tail(log)}")
    steps = steps_after - steps_before
    return {
        "actors": actors,
        "entry_point": script,
        "warm_s": warm_s,
        "window_s": t1 - t0,
        "agent_steps": steps,
        "frames_per_second": steps * 2 / (t1 - t0),  # action repeat 2 (reacher_hard)
    }


def measure(quick: bool) -> dict:
    window = 10.0 if quick else 40.0
    actor_counts = (2,) if quick else (1, 2, 4)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="magi_lp_bench_scaling_") as root:
        progress(f"single-process runner, {window:.0f} s window")
        runs["single_process"] = collect("main.py", 1, window, Path(root) / "single")
        progress(f"  {runs['single_process']['frames_per_second']:.1f} frames/s")
        for actors in actor_counts:
            progress(f"{actors} distributed actor(s), {window:.0f} s window")
            runs[f"actors_{actors}"] = collect(
                "lp_main.py", actors, window, Path(root) / str(actors)
            )
            progress(f"  {runs[f'actors_{actors}']['frames_per_second']:.1f} frames/s")
    base = runs["actors_1"]["frames_per_second"] if "actors_1" in runs else None
    for run in runs.values():
        run["speedup_vs_1_actor"] = ratio(run["frames_per_second"], base)
        run["ratio_to_single_process"] = ratio(
            run["frames_per_second"], runs["single_process"]["frames_per_second"]
        )
    return {"window_s": window, "cores": os.cpu_count(), "runs": runs}


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    runs = result["runs"]
    actors = sorted(
        (r for k, r in runs.items() if k.startswith("actors_")), key=lambda r: r["actors"]
    )
    return (
        ", ".join(f"{r['actors']}: {fmt(r['frames_per_second'])}" for r in actors)
        + " frames/s (actors)",
        f"{fmt(runs['single_process']['frames_per_second'])} frames/s single process",
        ", ".join(f"{fmt(r['ratio_to_single_process'], 2)}" for r in actors),
    )


def report(result: dict) -> str:
    runs = result["runs"]
    single = runs["single_process"]["frames_per_second"]
    most = max((r for k, r in runs.items() if k.startswith("actors_")), key=lambda r: r["actors"])
    lines = [
        f"**{fmt(most['frames_per_second'])} frames/s** with {most['actors']} distributed "
        f"actors against **{fmt(single)} frames/s** in one process (ratio "
        f"**{fmt(most['ratio_to_single_process'], 2)}**) on {result['cores']} cores.",
        "",
        "| runner | actors | frames/s | vs 1 actor | vs one process | startup to first episode |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in runs.items():
        label = "single process (`main.py`)" if name == "single_process" else "`lp_main.py`"
        lines.append(
            f"| {label} | {run['actors']} | {fmt(run['frames_per_second'])} "
            f"| {fmt(run['speedup_vs_1_actor'], 2)} | {fmt(run['ratio_to_single_process'], 2)} "
            f"| {fmt(run['warm_s'])} s |"
        )
    lines += [
        "",
        f"How: `{CONFIG}` (84x84, action repeat 2, the paper's networks in every actor, "
        "frame replay writes, parameter pulls every 100 steps) with `"
        + " ".join(a.replace("--config.", "") for a in SETTINGS)
        + "`: learning never starts, so the window measures collection alone. After every "
        "actor has logged one episode, the agent steps in the actors' CSV logs are summed "
        f"at the start and end of a {fmt(result['window_s'], 0)} s window (episodes of 50 "
        "agent steps: at most one episode per actor of rounding at each end). Every other "
        "node (replay, counter, idle learner, coordinator) runs too and takes its share of "
        f"the {result['cores']} cores.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
