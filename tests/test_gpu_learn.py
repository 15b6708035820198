"""`make gpu-learn` at a tiny size on this machine: one line saying there is no GPU, a real
single-process DrQ-v2 run on the device store with evaluations, and its curve written beside
the official agent's published returns (read from the committed reference table)."""

from __future__ import annotations

import csv

import pytest

from benchmarks import gpu_learn


def test_reference_table_holds_the_official_figures():
    balance = gpu_learn.reference_curve("cartpole_balance")
    assert balance[100_000]["mean"] == pytest.approx(987.4)
    assert gpu_learn.reference_curve("cartpole_swingup")[200_000]["mean"] == pytest.approx(807.0)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_tiny_learning_run_writes_its_curve_beside_the_reference(tmp_path, capsys):
    if gpu_learn.has_gpu():
        pytest.skip("a GPU is here: make gpu-learn runs at the paper's size")
    code = gpu_learn.main(["--minutes", "8", "--out", str(tmp_path), "--tasks", "1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "no GPU: running at a tiny size" in printed
    with open(tmp_path / "curves.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    # Evaluations at 0, 200, 400 and 600 frames, each beside the official mean at frame 0.
    assert [int(r["frame"]) for r in rows] == [0, 200, 400, 600]
    assert all(r["task"] == "cartpole_balance" and r["official_mean"] for r in rows)
    assert all(0.0 <= float(r["return"]) <= 100.0 for r in rows)  # <= 1 per frame, 100 frames
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert (tmp_path / "cartpole_balance" / "checkpoints" / "learner").is_dir()
