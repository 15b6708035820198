"""The preregistered GPU comparison (benchmarks/gpu_learn_check.py) over gpu_learn.json files
shaped as `make gpu-learn` writes them: it holds for two learners alike, and fails, with its
exit code, for a learner that never updates, for one that learns at half the rate, and while
a preregistered seed is missing. Runs of other seeds or settings are not counted. (The same
rules, against a tiny run with a broken critic target, are tests/test_learn_check.py's.)"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_learn, gpu_learn_check
from benchmarks.learn_check import comparison

LEARNS = [(0, 380.0), (20_000, 520.0), (40_000, 960.0)]


def _result(agent: str, curves: dict[int, list[tuple[int, float]]], **change) -> dict:
    result = {
        "tiny": False,
        "task": gpu_learn.TASK,
        "device": "gpu: NVIDIA H100 80GB HBM3",
        "machine": {"cpu": "Intel(R) Xeon(R) Processor", "cores": 16},
        "versions": {"jax": "0.11.2"},
        "commit": "abc1234",
        "settings": {
            "frames_goal": 40_000,
            "eval_every_frames": 20_000,
            "eval_episodes": 10,
            "args": list(gpu_learn.PAPER),
        },
        "runs": [
            {
                "agent": agent,
                "seed": seed,
                "frames": max(f for f, _ in curve),
                "evaluations": curve,
                "train_frames_per_s": 130.0 if agent == "magi_lp" else 76.0,
            }
            for seed, curve in curves.items()
        ],
    }
    result.update(change)
    return result


def _write(folder: Path, name: str, result: dict) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result))
    return path


def _check(tmp_path: Path, ours: dict, official: dict, capsys) -> tuple[int, str]:
    paths = [_write(tmp_path, "ours", ours), _write(tmp_path, "official", official)]
    code = gpu_learn_check.main([str(p) for p in paths])
    return code, capsys.readouterr().out


def _seeds(curve: list[tuple[int, float]]) -> dict[int, list[tuple[int, float]]]:
    # A little spread between seeds, so that the bootstrap has something to resample.
    return {s: [(f, v + 10 * (s - 5)) for f, v in curve] for s in gpu_learn_check.SEEDS}


def test_two_agents_learning_alike_hold_with_the_ratio_and_its_interval(tmp_path, capsys):
    ours = _result("magi_lp", _seeds(LEARNS))
    code, out = _check(tmp_path, ours, _result("official", _seeds(LEARNS)), capsys)
    assert code == comparison.EXIT[comparison.HELD], out
    assert "AUC ratio (ours / official) 1.000, 95% [" in out
    assert "seeds [4, 5, 6]" in out and "train frames/s 130.0" in out


def test_a_learner_that_never_updates_fails(tmp_path, capsys):
    frozen = [(f, LEARNS[0][1]) for f, _ in LEARNS]  # the frame-0 return, carried
    ours = _result("magi_lp", _seeds(frozen))
    code, out = _check(tmp_path, ours, _result("official", _seeds(LEARNS)), capsys)
    assert code == comparison.EXIT[comparison.NOT_HELD], out
    assert "magi_lp did not learn" in out and "AUC ratio 0.5" in out


def test_a_learner_at_half_the_rate_fails_on_the_ratio_alone(tmp_path, capsys):
    slow = [(0, 380.0), (20_000, 380.0), (40_000, 760.0)]  # learned by the rule, later
    ours = _result("magi_lp", _seeds(slow))
    code, out = _check(tmp_path, ours, _result("official", _seeds(LEARNS)), capsys)
    assert code == comparison.EXIT[comparison.NOT_HELD], out
    assert "did not learn" not in out and "AUC ratio 0.770 < 0.9" in out


def test_a_missing_seed_or_point_leaves_it_incomplete_and_other_runs_do_not_count(tmp_path, capsys):
    curves = _seeds(LEARNS)
    curves[6] = LEARNS[:2]  # seed 6 stopped before its 40k evaluation
    ours = _result("magi_lp", curves)
    # Seeds 1-3 ran before the preregistration; a tiny result is a check of the command.
    earlier = _result("magi_lp", {s: LEARNS for s in (1, 2, 3)})
    tiny = _result("magi_lp", {6: LEARNS}, tiny=True)
    paths = [
        _write(tmp_path, name, result)
        for name, result in [
            ("ours", ours),
            ("earlier", earlier),
            ("tiny", tiny),
            ("official", _result("official", _seeds(LEARNS))),
        ]
    ]
    code = gpu_learn_check.main([str(p) for p in paths])
    out = capsys.readouterr().out
    assert code == comparison.EXIT[comparison.INCOMPLETE], out
    assert "missing: {'magi_lp': [6], 'official': []}" in out


def test_a_continued_runs_furthest_record_counts_once(tmp_path, capsys):
    first = _result("official", {s: LEARNS[:2] for s in gpu_learn_check.SEEDS})
    later = _result("official", _seeds(LEARNS))
    paths = [_write(tmp_path, "first", first), _write(tmp_path, "later", later)]
    found = gpu_learn_check.check(
        [*paths, _write(tmp_path, "ours", _result("magi_lp", _seeds(LEARNS)))]
    )
    assert found["agents"]["official"]["seeds"] == [4, 5, 6]
    assert len(found["left_out"]) == 3 and found["agents"]["comparison"]["verdict"] == "held"


def test_no_result_yet_is_incomplete_and_a_missing_file_is_one_line(tmp_path, capsys):
    assert gpu_learn_check.check([])["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE
    try:
        gpu_learn_check.main([str(tmp_path / "nope.json")])
    except SystemExit as stop:
        assert "gpu_learn_check: no such file" in str(stop)
    else:
        raise AssertionError("a missing file must stop the check with one line")
