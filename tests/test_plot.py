"""`python -m magi_lp.plot`: curves of several runs as one PNG."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np

from magi_lp.plot import evaluation_curve, mean_and_spread
from tests.e2e_utils import REPO


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _run(workdir, scale):
    _write(
        workdir / "logs/evaluator_0/logs.csv",
        [
            {"actor_steps": s, "evaluator_steps": i, "episode_return": scale * s + e}
            for i, s in enumerate((0, 100, 200, 300))
            for e in (0, 2)  # two episodes per evaluation
        ],
    )
    _write(
        workdir / "logs/learner/logs.csv",
        [{"learner_steps": s, "critic_loss": 1 / (s + 1), "actor_loss": -s} for s in range(50)],
    )


def test_curves_of_two_seeds_mean_and_spread_and_png(tmp_path):
    _run(tmp_path / "seed0", 1.0)
    _run(tmp_path / "seed1", 3.0)
    x, y = evaluation_curve(tmp_path / "seed0", frames_per_step=2)
    np.testing.assert_array_equal(x, [0, 200, 400, 600])  # frames = actor steps * 2
    np.testing.assert_array_equal(y, [1, 101, 201, 301])  # the mean of each evaluation
    grid, mean, low, high = mean_and_spread(
        [evaluation_curve(tmp_path / f"seed{i}", 2) for i in (0, 1)], points=4
    )
    np.testing.assert_allclose(mean, 2 * grid / 2 + 1)  # (1x + 3x) / 2 at x = grid / 2
    assert (low <= mean).all() and (mean <= high).all()

    out = tmp_path / "curves.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "magi_lp.plot",
            str(tmp_path / "seed0"),
            str(tmp_path / "seed1"),
            "--frames_per_step",
            "2",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_a_folder_without_logs_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "magi_lp.plot", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: no logs/ folder in")


def test_main_pys_first_evaluation_before_any_counted_step_is_at_frame_0(tmp_path):
    # main.py evaluates before its actor has counted a step: that row's actor_steps is empty.
    _write(
        tmp_path / "logs/evaluator_0/logs.csv",
        [
            {"actor_steps": "", "evaluator_steps": 250, "episode_return": 120.0},
            {"actor_steps": 1000, "evaluator_steps": 500, "episode_return": 80.0},
        ],
    )
    x, y = evaluation_curve(tmp_path, frames_per_step=2)
    np.testing.assert_array_equal(x, [0, 2000])
    np.testing.assert_array_equal(y, [120, 80])


def test_an_evaluation_is_one_point_and_a_cut_attempt_gives_way_to_its_redo(tmp_path):
    # A distributed run: the actors go on while the evaluator's episodes run, so each row of
    # one evaluation has other counts; a stop cut the evaluation at 200 after one episode,
    # and the relaunch evaluated 200 again, whole, at its own counts.
    def row(at, episode, steps, ret):
        return {"actor_steps": steps, "evaluator_steps": 0, "episode_return": ret,
                "evaluation_at": at, "evaluation_episode": episode}  # fmt: skip

    _write(
        tmp_path / "logs/evaluator_0/logs.csv",
        [
            row(0, 1, "", 10.0), row(0, 2, 4, 20.0),
            row(100, 1, 104, 30.0), row(100, 2, 130, 50.0),
            row(200, 1, 208, 999.0),  # cut: the stop came during the second episode
            row(200, 1, 240, 60.0), row(200, 2, 260, 80.0),
            # Cut again; the redo's first episode ended before the counter had its counts
            # back (it says 0, or nothing), and a kill cut the last row short.
            row(300, 1, 310, 999.0), row(300, 1, "", 90.0), row(300, 2, 0, 110.0),
            {"actor_steps": 330, "evaluator_steps": ""},
        ],
    )  # fmt: skip
    x, y = evaluation_curve(tmp_path, frames_per_step=2)
    np.testing.assert_array_equal(x, [0, 208, 480, 600])
    np.testing.assert_array_equal(y, [15, 40, 70, 100])


def test_runs_without_an_evaluation_yet_are_one_line_and_no_png(tmp_path):
    # A run that started but logged nothing yet (or died first): its logs/ has no rows.
    (tmp_path / "logs/learner").mkdir(parents=True)
    (tmp_path / "logs/learner/logs.csv").write_text("")
    out = tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, "-m", "magi_lp.plot", str(tmp_path), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no evaluation or episode logged"), lines
    assert not out.exists()


def test_a_run_without_an_evaluation_among_several_is_left_out_of_the_mean(tmp_path):
    (tmp_path / "empty/logs/learner").mkdir(parents=True)
    _run(tmp_path / "seed0", 1.0)
    curves = [evaluation_curve(tmp_path / name, 2) for name in ("empty", "seed0")]
    grid, mean, _, _ = mean_and_spread(curves)
    np.testing.assert_array_equal(grid, [0, 200, 400, 600])  # seed0's own points
    np.testing.assert_array_equal(mean, [1, 101, 201, 301])
