"""`make gpu-learn` at a tiny size on this machine: one line saying there is no GPU, then the
same code path as on the GPU machine (3 seeds of single-process DrQ-v2 on the device store
side by side, each pinned to its cores, stopped at the deadline if need be, frames/s by the
learn check's one rule), the curves written beside the official agent's published returns
(read from the committed reference table) and a summary naming the device and versions."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess

import pytest

from benchmarks import gpu_learn
from benchmarks.learn_check.settings import ALLOCATOR
from tests.e2e_utils import CURRENT_STACK_LEG


def test_reference_table_holds_the_official_figures():
    balance = gpu_learn.reference_curve("cartpole_balance")
    assert balance[100_000]["mean"] == pytest.approx(987.4)
    assert balance[60_000]["mean"] == pytest.approx(984.6)
    assert gpu_learn.reference_curve("cartpole_swingup")[200_000]["mean"] == pytest.approx(807.0)


def test_the_paper_run_fits_one_device_call_of_eight_minutes():
    assert gpu_learn.MINUTES <= 8.0 - 0.5  # room to start and to write the figure
    assert gpu_learn.SEEDS == (1, 2, 3) and gpu_learn.FRAMES == 60_000
    assert "--config.env.image_size=84" in gpu_learn.PAPER
    assert "--config.agent.batch_size=256" in gpu_learn.PAPER
    assert gpu_learn.GPU_MEMORY_FRACTION * len(gpu_learn.SEEDS) < 0.9
    groups = gpu_learn.core_groups(3)
    assert len(groups) == 3 and all(groups)


@pytest.mark.parametrize(
    ("count", "sizes"),
    [(3, [5, 5, 6]), (4, [4, 4, 4, 4]), (6, [2, 2, 3, 3, 3, 3]), (16, [1] * 16)],
)
def test_every_core_goes_to_a_run_and_the_last_runs_get_the_spare_ones(count, sizes):
    groups = gpu_learn.core_groups(count, list(range(16)))
    assert [len(g) for g in groups] == sizes
    assert sorted(c for g in groups for c in g) == list(range(16))  # each core once


def test_fewer_cores_than_runs_share_them_round_robin():
    assert gpu_learn.core_groups(3, [0, 1]) == [[0], [1], [0]]
    assert gpu_learn.core_groups(0, [0, 1]) == []


@CURRENT_STACK_LEG  # the GPU machine's stack (Python 3.12, no matplotlib); 81-99 s here
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_tiny_learning_run_writes_three_seeds_beside_the_reference(tmp_path, capsys):
    if gpu_learn.has_gpu():
        pytest.skip("a GPU is here: make gpu-learn runs at the paper's size")
    code = gpu_learn.main(["--minutes", "12", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "no GPU: running at a tiny size" in printed
    with open(tmp_path / "curves.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    # Each seed evaluated at 0, 200, 400 and 600 frames, each beside the official mean.
    for seed in gpu_learn.SEEDS:
        mine = [r for r in rows if r["seed"] == str(seed)]
        assert [int(r["frame"]) for r in mine] == [0, 200, 400, 600]
        assert all(r["agent"] == "magi_lp" and r["official_mean"] for r in mine)
        assert all(0.0 <= float(r["return"]) <= 100.0 for r in mine)  # 100-frame episodes
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "curves.png").stat().st_size > 10_000
    else:  # the GPU machine's stack: the CSV has the curves, and the run says so
        assert "no PNG (matplotlib is not installed here)" in printed
    summary = json.loads((tmp_path / "gpu_learn.json").read_text())
    assert summary["tiny"] and summary["device"].startswith("cpu")
    # A tiny run is never a figure: the page renders only a stored result whose status is ok.
    assert summary["status"] == "tiny" and summary["commit"] and summary["machine"]["cores"]
    assert summary["versions"]["jax"] and summary["allocator"] == ALLOCATOR
    assert [r["seed"] for r in summary["runs"]] == list(gpu_learn.SEEDS)
    assert all(r["train_frames_per_s"] for r in summary["runs"]), summary["runs"]
    # Where each seed's actor loop spent its time, ms a step: the environment always some.
    assert all(r["time_ms"]["env_ms"] > 0 for r in summary["runs"]), summary["runs"]
    assert printed.count("train frames/s") == 3
    assert "every run has its evaluation at 600 frames: no further call" in printed
    # A second call with the same --out (a warm machine's) starts none of the finished runs
    # again and reports them as they were.
    launches = [(tmp_path / f"magi_lp_seed_{s}" / "launches.json").read_text() for s in (1, 2, 3)]
    assert gpu_learn.main(["--minutes", "12", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(finished in an earlier call: not started again)") == 3, printed
    again = json.loads((tmp_path / "gpu_learn.json").read_text())
    assert [r["evaluations"] for r in again["runs"]] == [r["evaluations"] for r in summary["runs"]]
    assert [len(c["frames"]) for c in again["calls"]] == [3, 3]
    assert launches == [
        (tmp_path / f"magi_lp_seed_{s}" / "launches.json").read_text() for s in (1, 2, 3)
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib draws the PNG"
)
def test_the_stored_gpu_runs_are_drawn_beside_the_published_curves(tmp_path):
    """The PNG of `make gpu-learn` (the tiny run's test is in the current-stack leg, whose
    venv has no matplotlib): the stored GPU call's runs, each a line, over the official
    agent's published band."""
    stored = json.loads((gpu_learn.ROOT / "benchmarks" / "gpu_learn.json").read_text())
    path = gpu_learn._plot(stored["runs"], tmp_path, "the stored call")
    assert path == tmp_path / "curves.png" and path.stat().st_size > 10_000
    (tmp_path / "none").mkdir()
    bare = gpu_learn._plot([], tmp_path / "none", "no run")  # the published band alone
    assert bare == tmp_path / "none" / "curves.png"
    assert bare.stat().st_size < path.stat().st_size


def test_the_stored_gpu_result_renders_with_its_device_and_versions_beside_every_run():
    stored = json.loads((gpu_learn.ROOT / "benchmarks" / "gpu_learn.json").read_text())
    assert stored["status"] == "ok" and not stored["tiny"]
    page = gpu_learn.report(stored)
    runs = [r for call in [stored, *stored.get("replicates", [])] for r in call["runs"]]
    for agent in ("magi_lp", "official"):
        assert page.count(f"| {agent} ") == sum(r["agent"] == agent for r in runs), agent
    assert stored["device"] in page and f"jax {stored['versions']['jax']}" in page
    assert "torch" in stored["versions"]
    number, against, _ = gpu_learn.summary(stored)
    assert "official, published" in against and stored["device"] in number
    beside = [r for r in runs if r["agent"] == "official" and r["train_frames_per_s"]]
    assert beside, "the stored result holds the official seed run beside ours"
    assert f"official seed beside ours: {beside[0]['train_frames_per_s']:.0f}" in against


@pytest.mark.parametrize(
    ("agent", "exit_code", "stopped", "well"),
    [
        ("magi_lp", 0, True, True),  # ours: SIGTERM saves a checkpoint and exits 0
        ("magi_lp", -15, True, False),  # ours killed by it: its stop failed
        ("official", -15, True, True),  # no handler in its train.py: what the deadline does
        ("official", -15, False, False),  # killed by someone else
        ("official", 1, True, False),
        ("official", 0, False, True),
    ],
)
def test_a_run_ended_well_when_it_exited_0_or_the_official_met_the_deadline(
    agent, exit_code, stopped, well
):
    run = {"agent": agent, "exit_code": exit_code, "stopped_at_deadline": stopped}
    assert gpu_learn.ended_well(run) is well


def test_seeds_are_parsed_and_a_bad_list_is_one_message():
    assert gpu_learn.parse_seeds("1,2,3") == (1, 2, 3)
    assert gpu_learn.parse_seeds("") == () and gpu_learn.parse_seeds(" 2 ") == (2,)
    for bad in ("1,x", "1,1", "-1"):
        with pytest.raises(SystemExit, match="gpu_learn: seeds"):
            gpu_learn.parse_seeds(bad)


def test_a_continued_run_keeps_every_launch_for_the_frames_per_second_rule(tmp_path):
    assert gpu_learn.record_launch(tmp_path, 100.0) == [100.0]
    assert gpu_learn.record_launch(tmp_path, 700.0) == [100.0, 700.0]
    assert json.loads((tmp_path / "launches.json").read_text()) == [100.0, 700.0]


def test_no_run_of_ours_is_drawn_like_the_official_seed():
    official = gpu_learn._style({"agent": "official"}, 1)
    ours = [gpu_learn._style({"agent": "magi_lp"}, index) for index in range(3)]
    assert official not in ours and len({o["color"] for o in ours}) == 3


def test_a_continued_call_names_every_call_that_made_its_runs(tmp_path):
    def call(minutes: float, frames: int) -> dict:
        return {
            "measured_at": f"t{minutes}", "commit": "abc", "device": "gpu: H100",
            "minutes": minutes, "wall_s": 60 * minutes,
            "runs": [{"agent": "magi_lp", "seed": 1, "frames": frames}],
        }  # fmt: skip

    saved = tmp_path / "gpu_learn.json"
    first = call(8.6, 40_000)
    first["calls"] = gpu_learn.call_history(saved, first)  # nothing there yet: one call
    assert [c["minutes"] for c in first["calls"]] == [8.6]
    saved.write_text(json.dumps(first))
    second = call(4.4, 58_000)
    second["calls"] = gpu_learn.call_history(saved, second)
    assert [c["frames"]["magi_lp 1"] for c in second["calls"]] == [40_000, 58_000]
    assert "8.6 + 4.4 min over 2 calls" in gpu_learn._stamp(second)


def _calls(*frames: dict[str, int], wall_s: float = 500.0, evaluated: int = 20_000) -> dict:
    """A summary as gpu_learn writes it: its calls' frames, and its runs at the last call's,
    each with complete evaluations up to `evaluated` frames."""
    runs = []
    for name, reached in frames[-1].items():
        agent, seed = name.split()
        points = range(0, min(reached, evaluated) + 1, 20_000)
        runs.append({"agent": agent, "seed": int(seed), "frames": reached,
                     "evaluations": [[f, 500.0] for f in points]})  # fmt: skip
    return {"wall_s": wall_s, "calls": [{"frames": f} for f in frames], "runs": runs}


def test_a_call_says_how_long_the_next_must_be_for_every_run_to_reach_the_goal():
    # First call: the official seed made 25k frames in 500 s; 15k more at that rate is 300 s,
    # its evaluation 45 s; plus the stop's 45 s and the start's 30 s: 420 s, MINUTES=7.
    # Ours has its 40k evaluation: done.
    summary = _calls({"official 4": 25_000, "magi_lp 4": 40_000}, evaluated=40_000)
    line = gpu_learn.next_call(summary, 40_000)
    assert "official 4 about 345 s" in line and "magi_lp 4" not in line
    assert "MINUTES=7 or more" in line
    # A continued call counts only what it gained itself: 30k -> 36k in 200 s.
    line = gpu_learn.next_call(
        _calls({"official 4": 30_000}, {"official 4": 36_000}, wall_s=200.0), 40_000
    )
    assert "official 4 about 178 s" in line
    stuck = gpu_learn.next_call(_calls({"a 1": 10_000}, {"a 1": 10_000}), 40_000)
    assert "no frames this call" in stuck and "MINUTES" not in stuck
    # At 40k frames with the 40k evaluation cut short by the deadline: not done yet.
    cut = gpu_learn.next_call(_calls({"magi_lp 4": 40_000}, evaluated=20_000), 40_000)
    assert "magi_lp 4 about 45 s" in cut and "MINUTES=2 or more" in cut
    done = gpu_learn.next_call(_calls({"official 4": 40_000}, evaluated=40_000), 40_000)
    assert done == "every run has its evaluation at 40,000 frames: no further call"


@pytest.mark.parametrize("frames", ["0", "30000", "-20000"])
def test_a_goal_off_the_evaluation_points_is_one_message_before_any_run(tmp_path, frames):
    with pytest.raises(SystemExit, match="gpu_learn: --frames is each run's goal"):
        gpu_learn.main(["--frames", frames, "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # no run folder made


def test_the_goal_reaches_both_agents_commands(tmp_path):
    ours = gpu_learn.ours_command(4, tmp_path, tiny=False, frames=40_000)
    assert "--config.max_actor_steps=20000" in ours


def _official_python(venv, paths: str = "/x/site-official:/x/site"):
    return subprocess.run(
        ["bash", str(gpu_learn.ROOT / "benchmarks" / "official_python.sh"), str(venv), paths],
        capture_output=True,
        text=True,
        check=True,
    )


def test_the_official_wrapper_never_writes_through_a_venvs_interpreter_link(tmp_path):
    """gpu_learn_device.sh wrote its wrapper to .venv-official/bin/python, which on a
    development machine is a link to pyenv's python3.11: the interpreter itself was replaced by
    the wrapper (2026-11-27). A real venv is left alone; an earlier wrapper, even a link, is
    replaced, and what it pointed to is not touched."""
    interpreter = tmp_path / "python3.11"
    interpreter.write_bytes(b"\x7fELF a real interpreter")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /somewhere\n")
    (venv / "bin" / "python").symlink_to(interpreter)
    assert "not replaced" in _official_python(venv).stdout
    assert (venv / "bin" / "python").is_symlink()
    assert interpreter.read_bytes() == b"\x7fELF a real interpreter"
    # The device machine: no venv; then a second call finds the first's wrapper (here a link).
    device = tmp_path / "device"
    _official_python(device)
    wrapper = (device / "bin" / "python").read_text()
    assert "PYTHONPATH=/x/site-official:/x/site exec " in wrapper
    assert os.access(device / "bin" / "python", os.X_OK)
    (device / "bin" / "python").unlink()
    (device / "bin" / "python").symlink_to(interpreter)
    _official_python(device)
    assert not (device / "bin" / "python").is_symlink()
    assert interpreter.read_bytes() == b"\x7fELF a real interpreter"
