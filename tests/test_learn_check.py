"""`make learn-check`: the comparison's arithmetic, a tiny run of this project's side, and the
official side where its code is present (a checkout named by $MAGI_LP_DRQV2_CHECKOUT).

The tiny run needs the current stack's `.venv312` (what the command runs), so this file is in
the current-stack leg of `make test` (`PY312_TESTS`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.learn_check import comparison, official
from benchmarks.learn_check.settings import RESULT, TINY, kept_result, run_dir

ROOT = Path(__file__).resolve().parents[1]
CURRENT_STACK_LEG = pytest.mark.skipif(
    importlib.util.find_spec("launchpad") is not None,
    reason="the current-stack leg (make test runs it in .venv312, as make learn-check does)",
)


def _result(agent: str, seed: int, curve: list[float], fps: float = 10.0) -> dict:
    points = range(0, TINY.frames + 1, TINY.eval_every_frames)
    return {
        "agent": agent,
        "task": "cartpole_balance",
        "seed": seed,
        "settings": vars(TINY),
        "versions": {},
        "evaluations": [[p, v] for p, v in zip(points, curve, strict=False)],
        "train_frames_per_s": fps,
    }


def test_auc_ratio_interval_and_final_range():
    runs = [
        _result("magi_lp", 1, [100, 200, 300], fps=20.0),
        _result("magi_lp", 2, [100, 300, 500], fps=30.0),
        _result("official", 1, [100, 200, 400], fps=10.0),
        _result("official", 2, [100, 200, 200], fps=10.0),
        _result("official", 3, [100, 200]),  # cut off: no evaluation at the last point
    ]
    runs.append({**_result("official", 4, [0, 0, 0]), "settings": {"frames": 1}})  # not these
    found = comparison.compare(runs, TINY)["tasks"]["cartpole_balance"]
    verdict = found["comparison"]
    assert found["official"]["seeds"] == [1, 2]
    # Mean AUC: ours (200 + 300) / 2 = 250, official (233.3 + 166.7) / 2 = 200.
    assert verdict["auc_ratio"] == pytest.approx(1.25)
    low, high = verdict["auc_ratio_95"]
    assert low <= 1.25 <= high and low < high
    assert verdict["final_mean"] == 400
    assert verdict["official_final_range"] == [200, 400]
    assert verdict["final_inside_official_range"]
    assert verdict["fps_ratio"] == pytest.approx(2.5)
    assert verdict["seeds"] == [2, 2]
    page = comparison.report(
        {
            "tasks": {"cartpole_balance": found},
            "points": [0, 1200, 2400],
            "reduced": TINY.reduced(),
            "settings": vars(TINY),
            "goal_ratio": 0.9,
            "goal_seeds": 3,
        }
    )
    assert "AUC ratio (this / official): **1.250**" in page
    assert "| magi_lp | 2 | 100 (100-100) | 250 (200-300) | 400 (300-500) | 250 |" in page


def test_a_missing_official_checkout_is_one_line_saying_what_to_fetch(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.learn_check", "--official", str(tmp_path / "none")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert official.OFFICIAL_REPO in lines[0] and official.OFFICIAL_COMMIT[:7] in lines[0]
    with pytest.raises(official.OfficialCodeMissing, match="facebookresearch/drqv2"):
        official.check_checkout(tmp_path)  # a folder without the official files


@CURRENT_STACK_LEG
@pytest.mark.integration  # a tiny main.py run on the current stack, ~1-2 min
@pytest.mark.timeout(600)
def test_tiny_run_of_this_projects_side_writes_its_result_and_is_kept(tmp_path):
    if not (ROOT / ".venv312" / "bin" / "python").exists():
        pytest.skip("needs .venv312 (make setup312): the learn check runs the current stack")
    # (It runs ours with .venv312's Python whichever Python runs the command.)
    command = [sys.executable, "-m", "benchmarks.learn_check", "--tiny", "--agents", "magi_lp"]
    command += ["--seeds", "1", "--cores", "0", "--out", str(tmp_path)]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (run_dir(tmp_path, "magi_lp", "cartpole_balance", 1) / RESULT).is_file()
    kept = kept_result(tmp_path / "results", "magi_lp", "cartpole_balance", 1)
    result = json.loads(kept.read_text())
    # Evaluations at exactly the frames it was told, the last at the step limit.
    assert [frame for frame, _ in result["evaluations"]] == [0, 1200, 2400]
    assert result["train_frames_per_s"] > 0 and result["versions"]["jax"]
    assert (tmp_path / "curves.csv").read_text().count("magi_lp") >= 3
    # Kept: a second call runs nothing.
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "0 run(s) to do" in again.stdout, again.stdout + again.stderr


@CURRENT_STACK_LEG
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_tiny_run_of_the_official_side_where_its_code_is_present(tmp_path):
    checkout = os.environ.get("MAGI_LP_DRQV2_CHECKOUT", "")
    if not checkout or not (ROOT / ".venv-official" / "bin" / "python").exists():
        pytest.skip(
            "the official DrQ-v2 is not here: set MAGI_LP_DRQV2_CHECKOUT to a checkout of "
            f"{official.OFFICIAL_REPO} at {official.OFFICIAL_COMMIT[:7]} and run "
            "scripts/setup_official_venv.sh"
        )
    command = [sys.executable, "-m", "benchmarks.learn_check", "--tiny", "--agents", "official"]
    command += ["--official", checkout, "--seeds", "1", "--cores", "0", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(
        kept_result(tmp_path / "results", "official", "cartpole_balance", 1).read_text()
    )
    assert [frame for frame, _ in result["evaluations"]] == [0, 1200, 2400]
