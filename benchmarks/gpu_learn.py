"""Does this DrQ-v2 learn from pixels as the paper's does? `make gpu-learn`.

On a GPU machine: single-process DrQ-v2 (`projects/drq_v2/main.py`, the device replay store)
at the paper's settings on cartpole_balance to 100k frames, then cartpole_swingup for what is
left of `--minutes`; an evaluation of 10 episodes every 10k frames. Writes, under `--out`
(default `runs/gpu_learn`): each task's run folder, `curves.csv` (our evaluation returns and
the official agent's mean/min/max over its seeds at the same frames) and `curves.png`, and
prints the training frames/s.

The reference is the official agent's own published curves: facebookresearch/drqv2 at
c0c650b, `curves/dmc_<task>.csv` (MIT licence), summarised per frame count (mean, lowest and
highest seed, mean wall-clock hour) in `benchmarks/reference/drqv2_official_curves.csv`.

Without a GPU it says so in one line and runs at a tiny size (32x32 pixels, small networks,
a few thousand frames): a check that the command works, not a learning result.

    python -m benchmarks.gpu_learn [--minutes 10] [--out DIR] [--tiny]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "reference" / "drqv2_official_curves.csv"
REFERENCE_SOURCE = "facebookresearch/drqv2 at c0c650b, curves/dmc_<task>.csv"
ACTION_REPEAT = 2  # the paper's, for every task used here

# (task, frames): the first to its end, the next for whatever time is left.
PLAN = (("cartpole_balance", 100_000), ("cartpole_swingup", 500_000))
EVAL_EVERY_FRAMES = 10_000
EVAL_EPISODES = 10

TINY = (
    "--config.env.image_size=32",
    "--config.agent.batch_size=32",
    "--config.agent.feature_dim=16",
    "--config.agent.hidden_dim=64",
    "--config.agent.encoder_channels=8",
    "--config.agent.min_replay_frames=200",
    "--config.agent.num_expl_steps=50",
    "--config.agent.replay_buffer_size=5000",
    "--config.env.max_episode_frames=100",
    "--config.logging.tensorboard=False",
)
TINY_PLAN = (("cartpole_balance", 600), ("cartpole_swingup", 600))
TINY_EVAL = (200, 1)


def has_gpu() -> bool:
    """Whether JAX here computes on a GPU."""
    import jax

    return jax.default_backend() == "gpu"


def reference_curve(task: str) -> dict[int, dict[str, float]]:
    """The official agent's evaluation returns for `task` by frame: mean, min, max, hour."""
    with open(REFERENCE, newline="") as file:
        return {
            int(row["frame"]): {k: float(row[k]) for k in ("mean", "min", "max", "mean_hour")}
            for row in csv.DictReader(file)
            if row["task"] == task
        }


def _run_task(task: str, frames: int, seconds: float, out: Path, tiny: bool) -> dict:
    """Runs main.py on `task` until `frames` or `seconds`, then reads its logs."""
    every, episodes = TINY_EVAL if tiny else (EVAL_EVERY_FRAMES, EVAL_EPISODES)
    workdir = out / task
    command = [
        sys.executable,
        str(ROOT / "projects" / "drq_v2" / "main.py"),
        f"--config={ROOT / 'configs' / f'{task}.py'}",
        f"--workdir={workdir}",
        f"--config.max_actor_steps={frames // ACTION_REPEAT}",
        f"--config.evaluation.every_actor_steps={every // ACTION_REPEAT}",
        f"--config.evaluation.episodes={episodes}",
        "--config.replay.store=device",
        *(TINY if tiny else ()),
    ]
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    try:
        process.wait(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:  # Ctrl-C: main.py saves and stops
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    wall_s = time.monotonic() - start
    evaluations = _rows(workdir / "logs" / "evaluator_0" / "logs.csv")
    actor = _rows(workdir / "logs" / "actor_0" / "logs.csv")
    trained_frames = ACTION_REPEAT * max((int(float(r["actor_steps"])) for r in actor), default=0)
    return {
        "task": task,
        "exit_code": process.returncode,
        "wall_s": wall_s,
        "frames": trained_frames,
        "frames_per_s": trained_frames / wall_s if wall_s else 0.0,
        "evaluations": [
            (ACTION_REPEAT * int(float(r.get("actor_steps") or 0)), float(r["episode_return"]))
            for r in evaluations
        ],
    }


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _curves(results: list[dict], out: Path) -> Path:
    """Our returns beside the official ones at the nearest published frame count."""
    path = out / "curves.csv"
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["task", "frame", "return", "official_frame", "official_mean",
                         "official_min", "official_max"])  # fmt: skip
        for result in results:
            reference = reference_curve(result["task"])
            by_frame: dict[int, list[float]] = {}
            for frame, value in result["evaluations"]:
                by_frame.setdefault(frame, []).append(value)
            for frame, values in sorted(by_frame.items()):
                nearest = min(reference, key=lambda f: abs(f - frame))
                ref = reference[nearest]
                writer.writerow([result["task"], frame, round(sum(values) / len(values), 1),
                                 nearest, ref["mean"], ref["min"], ref["max"]])  # fmt: skip
    return path


def _plot(results: list[dict], out: Path) -> Path | str:
    """The curve as a PNG, or a note where matplotlib is not installed (the CSV has it all)."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no PNG (matplotlib is not installed here)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.5), squeeze=False)
    for axis, result in zip(axes[0], results, strict=True):
        reference = reference_curve(result["task"])
        frames = sorted(reference)
        axis.fill_between(frames, [reference[f]["min"] for f in frames],
                          [reference[f]["max"] for f in frames], alpha=0.2, color="gray",
                          label="official: lowest to highest seed")  # fmt: skip
        axis.plot(frames, [reference[f]["mean"] for f in frames], color="gray",
                  label="official: mean over seeds")  # fmt: skip
        if result["evaluations"]:
            x, y = zip(*result["evaluations"], strict=True)
            axis.plot(x, y, "o-", color="C0", label="magi_lp (1 seed)")
        axis.set_xlim(0, max(result["frames"], EVAL_EVERY_FRAMES) * 1.05)
        axis.set_title(f"{result['task']}: {result['frames_per_s']:.0f} frames/s")
        axis.set_xlabel("frames")
        axis.set_ylabel("evaluation return")
        axis.legend(fontsize=7)
    figure.suptitle(f"reference: {REFERENCE_SOURCE}", fontsize=8)
    figure.tight_layout()
    path = out / "curves.png"
    figure.savefig(path, dpi=100)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="whole budget")
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_learn"))
    parser.add_argument("--tiny", action="store_true", help="tiny sizes even with a GPU")
    parser.add_argument("--tasks", type=int, default=2, help="how many tasks of the plan")
    args = parser.parse_args(argv)
    tiny = args.tiny or not has_gpu()
    if not has_gpu():
        print("gpu_learn: no GPU: running at a tiny size (a check of the command, not a result)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.minutes
    results = []
    for task, frames in (TINY_PLAN if tiny else PLAN)[: args.tasks]:
        left = deadline - time.monotonic()
        if left < 30:
            break
        result = _run_task(task, frames, left, out, tiny)
        results.append(result)
        print(
            f"gpu_learn: {task}: {result['frames']} frames in {result['wall_s']:.0f} s, "
            f"{result['frames_per_s']:.1f} frames/s; returns {result['evaluations']}"
        )
    print(f"gpu_learn: {_curves(results, out)}, {_plot(results, out)}; reference: "
          f"{REFERENCE_SOURCE}")  # fmt: skip
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
