"""Learning curves of one or more runs as a PNG: `python -m magi_lp.plot WORKDIR [WORKDIR ...]`.

Top: evaluation return against environment frames, from every `logs/evaluator_*/logs.csv`:
one point per evaluation, its episodes' mean (or, in a run without evaluators, the actors'
episode returns). With several workdirs
(seeds of one config) the curves are put on a common frame grid and drawn as their mean
with a band from the lowest to the highest run. Bottom: the learner's losses (every
`*_loss` column of `logs/learner/logs.csv`) against learner steps, one line per run.

Frames are `actor_steps * frames_per_step`; the logs hold agent steps, so pass the config's
`env.action_repeat` as `--frames_per_step` (default 1). Writes `<first workdir>/curves.png`
unless `--out` says otherwise. Matplotlib draws with its Agg backend: no display needed.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from magi_lp import console
from magi_lp.runtime.evaluations import group_evaluations, integer, number
from magi_lp.runtime.workdir import Workdir


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def _series(rows: list[dict[str, str]], x_key: str, y_key: str) -> tuple[np.ndarray, np.ndarray]:
    points = []
    for row in rows:
        try:
            points.append((float(row[x_key]), float(row[y_key])))
        except (KeyError, TypeError, ValueError):
            continue
    if not points:
        return np.zeros(0), np.zeros(0)
    xs, ys = np.asarray(points).T
    order = np.argsort(xs, kind="stable")
    return xs[order], ys[order]


def _evaluation_points(rows: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """An evaluator's rows (whose file has the evaluation columns) as one point per
    evaluation (`group_evaluations`): the mean return of its last whole attempt, at its
    `Evaluation.actor_steps` (a distributed run's actors go on while the episodes run, so
    each episode's row has other counts). What makes one whole is the config's
    `evaluation.episodes`, not in the workdir: the most episodes any attempt here has. Rows
    written before the columns existed are grouped in runs of that many; a row without a
    return (cut short by a kill) is left out."""
    rows = [row for row in rows if number(row.get("episode_return")) is not None]
    whole = max((integer(row.get("evaluation_episode")) or 0 for row in rows), default=0)
    points = []
    for evaluation in group_evaluations(rows, whole or 1):
        returns = [float(r["episode_return"]) for r in evaluation.rows]
        points.append((evaluation.actor_steps, sum(returns) / len(returns)))
    if not points:
        return np.zeros(0), np.zeros(0)
    xs, ys = np.asarray(sorted(points, key=lambda point: point[0])).T
    return xs, ys


def evaluation_curve(workdir: Path, frames_per_step: int) -> tuple[np.ndarray, np.ndarray]:
    """(frames, return) of a run: its evaluators' evaluations, else its actors' episodes."""
    for pattern, key in (("evaluator_*", "evaluator_steps"), ("actor_*", "actor_steps")):
        xs, ys = [], []
        for log in Workdir(workdir).log_csvs(pattern):
            rows = _rows(log)
            # Evaluators log their own steps; the actors' total is what frames mean here.
            x_key = "actor_steps" if rows and "actor_steps" in rows[0] else key
            if pattern == "evaluator_*" and x_key == "actor_steps" and "evaluation_at" in rows[0]:
                x, y = _evaluation_points(rows)
            else:
                if x_key == "actor_steps" and pattern == "evaluator_*":
                    # An evaluation before any actor step was counted (main.py's first, at
                    # step 0) has the count empty: it is at 0, not a row to drop.
                    rows = [{**row, x_key: row.get(x_key) or "0"} for row in rows]
                x, y = _series(rows, x_key, "episode_return")
            xs.append(x)
            ys.append(y)
        if xs and sum(len(x) for x in xs):
            # Episodes of one evaluation (older logs), or evaluators at one count: one point,
            # their mean.
            x, y = np.concatenate(xs), np.concatenate(ys)
            grid = np.unique(x)
            means = np.asarray([y[x == value].mean() for value in grid])
            return grid * frames_per_step, means
    return np.zeros(0), np.zeros(0)


def mean_and_spread(
    curves: list[tuple[np.ndarray, np.ndarray]], points: int = 100
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Curves on a common grid (up to where every run got): grid, mean, lowest, highest."""
    ends = [x[-1] for x, _ in curves if len(x)]
    starts = [x[0] for x, _ in curves if len(x)]
    if not ends:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    drawn = [x for x, _ in curves if len(x)]  # a run with no evaluation yet has no say
    grid = np.linspace(max(starts), min(ends), points) if len(ends) > 1 else drawn[0]
    values = np.stack([np.interp(grid, x, y) for x, y in curves if len(x)])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def plot(workdirs: list[Path], out: Path, frames_per_step: int = 1) -> Path:
    """Draws the curves of `workdirs` into `out` (PNG); returns `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8))
    curves = [evaluation_curve(w, frames_per_step) for w in workdirs]
    if len(workdirs) > 1:
        for (x, y), workdir in zip(curves, workdirs, strict=True):
            top.plot(x, y, alpha=0.25, linewidth=0.8, label=workdir.name)
        grid, mean, low, high = mean_and_spread(curves)
        counted = sum(1 for x, _ in curves if len(x))
        top.plot(grid, mean, color="black", label=f"mean of {counted} runs")
        top.fill_between(grid, low, high, color="gray", alpha=0.3, label="lowest-highest")
    elif len(curves[0][0]):
        top.plot(*curves[0], marker=".", label=workdirs[0].name)
    top.set_xlabel("environment frames")
    top.set_ylabel("evaluation return")
    if top.lines:
        top.legend(fontsize="small")
    top.grid(alpha=0.3)

    for workdir in workdirs:
        rows = _rows(Workdir(workdir).log_csv("learner"))
        losses = sorted(k for k in (rows[0] if rows else {}) if k.endswith("_loss"))
        for key in losses:
            x, y = _series(rows, "learner_steps", key)
            label = key if len(workdirs) == 1 else f"{workdir.name}: {key}"
            bottom.plot(x, y, linewidth=0.8, label=label)
    bottom.set_xlabel("learner steps")
    bottom.set_ylabel("loss")
    if bottom.lines:  # none before the learner's first logged row
        bottom.legend(fontsize="small")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m magi_lp.plot WORKDIR [WORKDIR ...] [--out PNG] [--frames_per_step N]`."""
    parser = argparse.ArgumentParser(prog="python -m magi_lp.plot", description=__doc__)
    parser.add_argument("workdirs", nargs="+", type=Path, help="run folders (seeds of one config)")
    parser.add_argument("--out", type=Path, help="PNG to write (default <first>/curves.png)")
    parser.add_argument("--frames_per_step", type=int, default=1, help="the action repeat")
    args = parser.parse_args(argv)
    missing = [str(w) for w in args.workdirs if not Workdir(w).logs_folder.is_dir()]
    if missing:
        console.error(f"no logs/ folder in {', '.join(missing)}: give run folders (--workdir)")
        return 2
    if args.frames_per_step < 1:
        console.error(f"--frames_per_step={args.frames_per_step}: give the action repeat, >= 1")
        return 2
    empty = [str(w) for w in args.workdirs if not len(evaluation_curve(w, 1)[0])]
    if len(empty) == len(args.workdirs):
        console.error(
            f"no evaluation or episode logged yet in {', '.join(empty)}: nothing to plot; "
            "try again once the run has logged one (logs/evaluator_*/logs.csv)"
        )
        return 2
    if empty:
        console.say(
            f"notice: no evaluation or episode logged yet in {', '.join(empty)}: left out",
            source="plot",
        )
    out = plot(args.workdirs, args.out or args.workdirs[0] / "curves.png", args.frames_per_step)
    console.say(f"wrote {out}", source="plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
