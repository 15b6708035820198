"""`make learn-check`: a comparison that can fail, and its negative controls.

- The arithmetic: AUC over the evaluations after frame 0, the learning rule, only the
  preregistered seeds, the verdict and the command's exit code.
- Negative controls: a learner that never updates (each seed's frame-0 return carried to
  every point) fails the check, on made-up curves and on the superseded first check's kept
  runs; a tiny real run whose critic target has the wrong sign fails the learning rule.
- The one frames/s rule (episode-end windows) and a relaunch's rows.
- A tiny run of this project's side, killed and run again: it resumes from its checkpoint
  (no frame 0 again, each evaluation once); the official side where its code is present (a
  checkout named by $MAGI_LP_DRQV2_CHECKOUT).

The tiny runs need the current stack's `.venv312` (what the command runs), so they are in
the current-stack leg of `make test` (`PY312_TESTS`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from benchmarks import common
from benchmarks.learn_check import __main__ as cli
from benchmarks.learn_check import comparison, official, runs, saturation
from benchmarks.learn_check.settings import (
    ACTION_REPEAT,
    ALLOCATOR,
    FULL,
    KEPT,
    PREREGISTERED_AT,
    RESULT,
    SEEDS,
    TINY,
    Settings,
    kept_result,
    progress_record,
    run_dir,
)
from magi_lp.launch.files import write_text_atomically
from projects.drq_v2.config import get_agent_config, replay_schedule
from tests.e2e_utils import CURRENT_STACK_LEG

ROOT = Path(__file__).resolve().parents[1]
FULL_LIKE = Settings(frames=40_000, eval_every_frames=10_000)


def _result(agent: str, seed: int, curve: list[float], settings=FULL_LIKE, fps=10.0) -> dict:
    points = range(0, settings.frames + 1, settings.eval_every_frames)
    return {
        "agent": agent,
        "task": "cartpole_balance",
        "seed": seed,
        "settings": vars(settings),
        "versions": {},
        "evaluations": [[p, v] for p, v in zip(points, curve, strict=False)],
        "train_frames_per_s": fps,
    }


LEARNING = {
    "magi_lp": [[350, 300, 600, 850, 950], [340, 250, 500, 900, 980], [360, 300, 700, 800, 900]],
    "official": [[350, 380, 650, 900, 970], [330, 300, 500, 850, 990], [370, 350, 600, 800, 950]],
}


def _runs(curves: dict[str, list[list[float]]], settings=FULL_LIKE) -> list[dict]:
    return [
        _result(agent, seed, curve, settings)
        for agent, agent_curves in curves.items()
        for seed, curve in zip(SEEDS, agent_curves, strict=True)
    ]


def test_auc_after_frame_zero_both_learned_and_the_goal_held():
    found = comparison.compare(_runs(LEARNING), FULL_LIKE)["tasks"]["cartpole_balance"]
    verdict = found["comparison"]
    ours, theirs = found["magi_lp"], found["official"]
    # AUC: the mean over 10k..40k only (frame 0 left out).
    assert ours["auc"][0] == pytest.approx((300 + 600 + 850 + 950) / 4)
    assert theirs["auc"][2] == pytest.approx((350 + 600 + 800 + 950) / 4)
    assert ours["learning"]["learned"] and theirs["learning"]["learned"]
    assert verdict["verdict"] == comparison.HELD
    ratio = sum(ours["auc"]) / sum(theirs["auc"])
    assert verdict["auc_ratio"] == pytest.approx(ratio)
    low, high = verdict["auc_ratio_95"]
    assert low <= ratio <= high and low < high
    assert verdict["seeds"] == [3, 3]


def test_a_learner_that_never_updates_fails_the_check():
    """Negative control: ours replaced by each seed's frame-0 return carried to every point."""
    frozen = [
        comparison.frozen(run) if run["agent"] == "magi_lp" else run for run in _runs(LEARNING)
    ]
    found = comparison.compare(frozen, FULL_LIKE)["tasks"]["cartpole_balance"]
    assert not found["magi_lp"]["learning"]["learned"]
    assert found["comparison"]["verdict"] == comparison.NOT_HELD
    assert "magi_lp did not learn" in found["comparison"]["why"]
    assert found["comparison"]["auc_ratio"] < comparison.GOAL_RATIO


def test_the_superseded_first_check_fails_today_and_its_frozen_learner_too():
    """The first check's kept runs (32x32, batch 32, 50k frames): neither agent learned, so
    neither they nor a learner that never updates pass the check as it stands."""
    kept = comparison.load_runs(KEPT / comparison.SUPERSEDED)
    assert len(kept) == 10
    old = Settings(**{**kept[0]["settings"], "episode_frames": 0})
    for runs_ in (kept, [comparison.frozen(r) if r["agent"] == "magi_lp" else r for r in kept]):
        found = comparison.compare(runs_, old, seeds=(1, 2, 3))["tasks"]["cartpole_balance"]
        assert found["comparison"]["verdict"] == comparison.NOT_HELD
        assert not found["official"]["learning"]["learned"]
        assert not found["magi_lp"]["learning"]["learned"]
    summary = comparison.superseded(KEPT)
    # The old rule (frame 0 inside the AUC) let the frozen learner through.
    assert summary["old_rule_frozen"]["ratio"] > comparison.GOAL_RATIO


def test_the_ratio_rule_cannot_hold_above_half_the_top_and_the_gap_rule_can():
    """What the GPU comparison's first preregistration met (ours' seeds 4-6 on the H200: 503
    at frame 0, 987 at 40k) and the second's rule, which a frozen learner still fails."""
    ratio = comparison.learned("cartpole_balance", 503.0, 987.0, rule=comparison.RATIO)
    assert not ratio["learned"] and not ratio["reachable"] and ratio["needed"] == 1006.0
    assert comparison.learned("cartpole_balance", 503.0, 1000.0)["learned"] is False
    gap = comparison.learned("cartpole_balance", 503.0, 987.0, rule=comparison.GAP)
    assert gap["learned"] and gap["reachable"] and gap["needed"] == 751.5
    for start in (150.0, 333.0, 503.0, 643.0, 900.0):  # a learner that never updates
        for rule in comparison.RULES:
            assert not comparison.learned("cartpole_balance", start, start, rule=rule)["learned"]
    # Alike at a frame-0 mean of 1000 / 3; the floor of 700 below about 400 for both.
    at = 1000.0 / 3
    needs = [comparison.learned("cartpole_balance", at, 0.0, rule=r)["needed"] for r in
             comparison.RULES]  # fmt: skip
    assert needs == [700.0, 700.0]
    assert comparison.learned("cartpole_balance", 380.0, 760.0, rule=comparison.GAP)["learned"]
    assert not comparison.learned("cartpole_balance", 380.0, 680.0, rule=comparison.GAP)["learned"]
    # A check cut short scales the top with the episode (200 frames: at most 200).
    short = comparison.learned("cartpole_balance", 50.0, 130.0, 200, comparison.GAP)
    assert short["needed"] == 140.0 and not short["learned"]


def test_the_preregistered_settings_and_seeds_are_those_of_their_commit():
    """The file has changed since (the paper comparison's folders): never FULL or SEEDS."""
    shown = subprocess.run(
        ["git", "show", f"{PREREGISTERED_AT}:benchmarks/learn_check/settings.py"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if shown.returncode != 0:
        pytest.skip(f"{PREREGISTERED_AT} is not in this clone's history (a shallow clone)")
    then = types.ModuleType("settings_at_preregistration")
    sys.modules[then.__name__] = then  # dataclasses look their module up there
    try:
        exec(compile(shown.stdout, f"settings.py@{PREREGISTERED_AT}", "exec"), then.__dict__)
    finally:
        del sys.modules[then.__name__]
    assert dataclasses.asdict(then.FULL) == dataclasses.asdict(FULL)
    assert then.SEEDS == SEEDS
    assert comparison._settings_commit().startswith(PREREGISTERED_AT + " 2026-11-26")


def test_provenance_marks_our_runs_made_by_other_code_and_not_the_official_agents():
    head = runs.code_state()
    attempt = {"attempt": 1, "commit": head["commit"], "dirty": False, "code": head["code"]}
    before_runner = {**attempt, "code": {k: v for k, v in head["code"].items()
                                         if k != "magi_lp/runtime"}}  # fmt: skip
    ours = {"agent": "magi_lp", "seed": 4, "attempts": [attempt]}
    assert comparison.provenance(ours)["head_code"] is True
    mixed = {**ours, "attempts": [attempt, {**before_runner, "attempt": 2}]}
    assert comparison.provenance(mixed)["head_code"] is False
    theirs = {"agent": "official", "seed": 4, "attempts": [before_runner]}
    assert comparison.provenance(theirs)["head_code"] is None
    table = comparison.provenance_table(
        {"magi_lp": {"runs": [comparison.provenance(mixed)]},
         "official": {"runs": [comparison.provenance(theirs)]}}
    )  # fmt: skip
    assert "not HEAD's agent/replay/runner code" in table[2] and "official, pinned" in table[3]
    # Launches on two hosts of one model name: both CPUs named in the run's row.
    hosts = [{**a, "machine": {"cpu": "AMD EPYC", "cpu_id": f"family 25 model {m}, avx2"}}
             for a, m in ((attempt, 1), (before_runner, 17))]  # fmt: skip
    row = comparison.provenance_table({"magi_lp": {"runs": [comparison.provenance(
        {**ours, "attempts": hosts})]}})[2]  # fmt: skip
    assert "(family 25 model 1, avx2; family 25 model 17, avx2)" in row, row
    # A GPU call's run records only its commit (its tree has no .git): the code is looked up.
    # (HEAD's commit is this tree's code only while nothing under CODE_PATHS is changed here:
    # the test holds on an edited tree too, where the edited files are named.)
    paths = runs.CODE_PATHS
    edited = sorted(
        {
            *runs._git("diff", "--name-only", "HEAD", "--", *paths).split(),
            *runs._git("ls-files", "--others", "--exclude-standard", "--", *paths).split(),
        }
    )
    call = {"agent": "magi_lp", "seed": 4, "commit": head["commit"][:7]}
    assert comparison.provenance(call)["head_code"] is (not edited)
    assert comparison.provenance(call)["differs"] == edited
    assert comparison.provenance({**call, "commit": call["commit"] + "-dirty"})["head_code"] is None
    changed = runs._git("log", "-1", "--format=%H", "--", "magi_lp/agent")  # its parent differs
    if runs._git("rev-parse", "--verify", "--quiet", f"{changed}^"):  # not a shallow clone
        older = comparison.provenance({**call, "commit": f"{changed}^"})
        assert older["head_code"] is False
        # The figure names the files HEAD changed since: at least that commit's.
        that = runs._git("diff", "--name-only", f"{changed}^", changed, "--", "magi_lp/agent")
        assert that and set(that.split()) <= set(older["differs"]), older["differs"]
        row = comparison.provenance_table({"magi_lp": {"runs": [older]}})[2]
        assert f"the code here differs in {older['differs'][0]}" in row
    # The same commit: nothing to name but what is edited here.
    differs = comparison.provenance(mixed)["differs"]
    assert set(edited) <= set(differs) if edited else differs == [], differs
    assert comparison.provenance({**call, "commit": "0000000"})["head_code"] is None


def test_a_run_resumed_across_commits_names_what_changed_between_its_launches():
    """Seed 11 of the second preregistration, as its launches recorded it: a0d8373, then
    6f20b29 (a8e2b93 between them changed magi_lp/runtime/checkpointing.py)."""
    if not runs._git("rev-parse", "--verify", "--quiet", "a0d8373^{commit}"):
        pytest.skip("a0d8373 is not in this clone's history (a shallow clone)")
    code = {path: runs._git("rev-parse", f"a0d8373:{path}") for path in runs.CODE_PATHS}
    later = {path: runs._git("rev-parse", f"6f20b29:{path}") for path in runs.CODE_PATHS}
    attempts = [
        {"attempt": 1, "commit": "a0d8373", "code": code},
        {"attempt": 2, "commit": "6f20b29", "code": later},
        {"attempt": 3, "commit": "6f20b29", "code": later},
    ]
    found = comparison.provenance({"agent": "magi_lp", "seed": 11, "attempts": attempts})
    assert found["changed_between_launches"] == ["magi_lp/runtime/checkpointing.py"]
    row = comparison.provenance_table({"magi_lp": {"runs": [found]}})[2]
    assert "its launches ran different code: magi_lp/runtime/checkpointing.py changed" in row
    same = comparison.provenance({"agent": "magi_lp", "seed": 11, "attempts": attempts[1:]})
    assert same["changed_between_launches"] == []
    theirs = comparison.provenance({"agent": "official", "seed": 11, "attempts": attempts})
    assert theirs["changed_between_launches"] == []  # its code is not CODE_PATHS


def test_only_preregistered_seeds_count_and_missing_ones_leave_it_incomplete():
    extra = [*_runs(LEARNING), _result("magi_lp", 99, [350, 350, 350, 350, 350])]
    found = comparison.compare(extra, FULL_LIKE)["tasks"]["cartpole_balance"]
    assert found["magi_lp"]["seeds"] == list(SEEDS)
    assert found["not_counted"] == [
        {"agent": "magi_lp", "seed": 99, "why": "not a preregistered seed"}
    ]
    short = [r for r in _runs(LEARNING) if not (r["agent"] == "official" and r["seed"] == 3)]
    found = comparison.compare(short, FULL_LIKE)["tasks"]["cartpole_balance"]
    assert found["comparison"]["verdict"] == comparison.INCOMPLETE
    assert found["comparison"]["missing_seeds"]["official"] == [3]


def _keep(folder: Path, results: list[dict]) -> None:
    for result in results:
        path = kept_result(folder, result["agent"], result["task"], result["seed"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))


@pytest.mark.parametrize(
    ("curves", "code"),
    [
        (LEARNING, 0),
        ({"magi_lp": [[300, 300, 300]] * 3, "official": LEARNING["official"]}, 1),
        ({"magi_lp": LEARNING["magi_lp"][:2], "official": LEARNING["official"]}, 3),
    ],
)
def test_the_exit_code_says_whether_the_goal_held(tmp_path, curves, code):
    tiny_points = [[curve[0], curve[2], curve[-1]] for curve in curves["magi_lp"]]
    theirs = [[curve[0], curve[2], curve[-1]] for curve in curves["official"]]
    # At TINY's 200-frame episodes the floor is 700 x 200 / 1000 = 140: scale the returns.
    scale = 0.2
    results = [
        _result(agent, seed, [v * scale for v in curve], TINY)
        for agent, agent_curves in (("magi_lp", tiny_points), ("official", theirs))
        for seed, curve in zip(SEEDS, agent_curves, strict=False)
    ]
    _keep(tmp_path / "results", results)
    argv = ["--tiny", "--report-only", "--out", str(tmp_path)]
    assert cli.main(argv) == code
    written = json.loads((tmp_path / "learn_check.json").read_text())
    assert written["verdict"] == {0: "held", 1: "not held", 3: "incomplete"}[code]


def test_the_figure_gives_cpu_seconds_per_frame_and_each_runs_core(tmp_path):
    """Wall frames/s depend on what else shares a run's core; the CPU seconds over the same
    windows, and the core each run was pinned to, stand beside them."""
    results = []
    for agent, cpu, core in (("magi_lp", 110.0, 0), ("official", 99.0, 1)):
        for seed, curve in zip(SEEDS, LEARNING[agent], strict=True):
            run = _result(agent, seed, curve, fps=4.0 if agent == "magi_lp" else 5.0)
            run["cpu_seconds_per_1000_frames"] = cpu + seed
            run["attempts"] = [{"attempt": 1, "core": core}, {"attempt": 2, "core": core}]
            run["machine"] = {"cpu": "AMD EPYC", "cores": 2}
            results.append(run)
    _keep(tmp_path / "results", results)
    found = comparison.write(tmp_path / "results", FULL_LIKE, tiny=True, out=tmp_path)
    agents = found["tasks"]["cartpole_balance"]
    assert agents["magi_lp"]["cpu_seconds_per_1000_frames"] == pytest.approx(112.0)
    assert agents["comparison"]["cpu_ratio"] == pytest.approx(101.0 / 112.0)
    assert agents["comparison"]["fps_ratio"] == pytest.approx(0.8)
    assert [run["cores"] for run in agents["official"]["runs"]] == [[1]] * 3
    page = comparison.report(found)
    assert "| CPU s / 1,000 train frames |" in page
    assert "| 4.00 | 112.0 |" in page and "| 5.00 | 101.0 |" in page
    assert page.count("2 cores | 0 |") == 3 and page.count("2 cores | 1 |") == 3
    # The saturation probe's result, when there is one, says which actor collapsed.
    assert "Pinned" not in page
    probe = {"task": "cartpole_balance", "observations": 100, "saturated_above": 0.99}
    runs = [
        {"agent": "official", "seed": 2, "frames": 60_000, "pinned": True, "saturated": 1.0,
         "mean_action": -1.0, "action_spread": 0.0},
        {"agent": "magi_lp", "seed": 2, "frames": 60_000, "pinned": False, "saturated": 0.52,
         "mean_action": 0.154, "action_spread": 0.82},
    ]  # fmt: skip
    page = comparison.report({**found, "saturation": {**probe, "runs": runs}})
    assert "| official | 2 | 60,000 | **yes** | 1.00 | -1.000 | 0.000 |" in page
    assert "| magi_lp | 2 | 60,000 | no | 0.52 | +0.154 | 0.820 |" in page


@pytest.mark.integration  # trains an actor and a critic: the probe end to end
def test_the_saturation_probe_tells_a_pinned_actor_from_a_fresh_one(tmp_path):
    """The probe behind "why did this run not learn": our checkpoint's actor on rendered
    observations; an actor whose last bias is pushed far out is pinned at +1."""
    import jax
    import numpy as np
    from dm_env import specs

    from magi_lp.runtime.checkpointing import Checkpointer
    from projects.drq_v2.config import get_agent_config
    from projects.drq_v2.networks import make_networks

    obs = saturation.render_observations("cartpole_balance", 32, 12)
    assert obs.shape == (12, 32, 32, 9) and obs.dtype == np.uint8
    assert len({frame.tobytes() for frame in obs}) == 12  # 12 different states
    action = specs.BoundedArray((1,), np.float32, -1.0, 1.0)
    networks = make_networks(action, get_agent_config("cartpole", "balance"))
    params = jax.tree_util.tree_map(np.asarray, networks.init(jax.random.PRNGKey(0), obs[0]))
    assert saturation.ours_probe(obs, tmp_path / "none") is None  # no checkpoint yet
    found = {}
    for name, bias in (("fresh", 0.0), ("pinned", 50.0)):
        params["actor"]["policy/~/linear_2"]["b"] = np.full((1,), bias, np.float32)
        folder = tmp_path / name
        with Checkpointer(folder) as checkpointer:
            checkpointer.save(7, {"params": params}, {"counts": {"actor_steps": 500}})
        found[name] = saturation.ours_probe(obs, folder)
    assert found["pinned"]["pinned"] and found["pinned"]["saturated"] == 1.0
    assert found["pinned"]["mean_action"] > 0.99 and found["pinned"]["frames"] == 1000
    assert not found["fresh"]["pinned"] and found["fresh"]["saturated"] == 0.0
    assert found["fresh"]["action_spread"] > 0.0
    # Why it stays: the pinned actor's tanh input is the bias, far past where tanh has slope;
    # the fresh one's is near 0. The critic's slope is read at each: a share in [0, 1].
    assert 45.0 < found["pinned"]["pre_tanh"] < 55.0 and found["fresh"]["pre_tanh"] < 1.0
    assert all(0.0 <= f["critic_pushes_out"] <= 1.0 for f in found.values())
    rows = [{"agent": "magi_lp", "seed": 1, **found["pinned"]}]
    assert saturation.why_table(rows)[2].startswith("| magi_lp | 1 | 1,000 | +1.000 | ")
    assert saturation.why_table([{k: v for k, v in rows[0].items() if k != "pre_tanh"}]) == []


def test_a_record_cut_off_while_written_keeps_its_last_whole_version(tmp_path):
    """Run records (attempts.jsonl, progress, results) go through `write_text_atomically`: a
    write that fails halfway (here an unencodable character; a session's end kills what still runs)
    leaves the previous file whole, where `write_text` leaves it truncated."""
    path = tmp_path / runs.ATTEMPTS
    write_text_atomically(path, '{"attempt": 1}\n')
    with pytest.raises(UnicodeEncodeError):
        write_text_atomically(path, '{"attempt": 1}\n{"attempt": "\udc80"}\n')
    assert path.read_text() == '{"attempt": 1}\n'
    assert os.listdir(tmp_path) == [runs.ATTEMPTS]  # no temporary file left
    assert runs.read_attempts(tmp_path) == [{"attempt": 1}]
    with pytest.raises(UnicodeEncodeError):  # what it prevents
        path.write_text('{"attempt": "\udc80"}\n')
    assert path.read_text() == ""


def test_episode_windows_one_rule_for_both_agents():
    # (end frame, wall time, cpu time): episodes of 1000 frames; seed frames 4000;
    # an evaluation at 6000 (after the episode ending there); a relaunch at t=500.
    ends = [(5000, 100.0, 50.0), (6000, 200.0, 100.0), (7000, 330.0, 160.0)]
    ends += [(8000, 430.0, 210.0), (9000, 630.0, 20.0), (10000, 730.0, 70.0)]
    frames, seconds, cpu = runs.episode_windows(ends, [0, 6000, 10000], 4000, [0.0, 500.0])
    # Kept: 5000-6000 (100 s), 7000-8000 (100 s), 9000-10000 (100 s); not 6000-7000 (the
    # evaluation at its start), not 8000-9000 (the relaunch inside).
    assert (frames, seconds) == (3000, 300.0)
    assert cpu == pytest.approx(50.0 + 50.0 + 50.0)
    assert runs.episode_windows(ends[:2], [], 5000, []) == (1000, 100.0, 50.0)


def test_a_relaunchs_rows_replace_the_ones_it_repeats():
    # Ours, episodes of 500 steps: a first launch reached step 2000 and evaluated at 1500;
    # it was killed, and the relaunch resumed from the checkpoint at step 1200.
    rows = [
        {"episode_length": "500", "actor_steps": str(s), "wall_time": str(s), "cpu_time": "1"}
        for s in (500, 1000, 1500, 2000)
    ]
    rows += [
        {"episode_length": "500", "actor_steps": str(s), "wall_time": str(5000 + s)}
        for s in (1700, 2200)
    ]
    ends = runs._ours_episode_ends(rows)
    assert [frame for frame, _, _ in ends] == [1000, 2000, 3400, 4400]
    evaluations = [(3000, 1.0), (3000, 2.0), (3000, 9.0), (3000, 11.0), (0, 5.0)]
    assert runs._last_per_frame(evaluations, keep=2) == [(3000, 10.0)]  # frame 0: 1 of 2
    # An evaluation cut short by a deadline is no point of the curve.
    assert runs._last_per_frame([(0, 5.0), (0, 7.0), (20, 1.0)], keep=2) == [(0, 6.0)]
    # A relaunch from an older checkpoint evaluates a point already whole again and is cut
    # short: its one row is not averaged with the earlier launch's (other parameters).
    again = [(3000, 1.0), (3000, 3.0), (3000, 100.0)]
    assert runs._last_per_frame(again, keep=2, launch_of_row=[1, 1, 2]) == [(3000, 2.0)]
    assert runs._last_per_frame(again, keep=2, launch_of_row=[1, 1, 1]) == [(3000, 51.5)]
    assert runs._launch_of("150.0", [0.0, 100.0, 200.0]) == 2
    assert runs._launch_of("", [0.0]) == 0


def test_a_run_whose_folder_was_lost_with_its_machine_is_set_aside_and_counted(tmp_path):
    """Run folders are not committed; each unfinished run's progress record is. A machine that
    comes up new has the record and not the folder: the figure shows the record's evaluations,
    and when the run starts again from frame 0 the record is set aside and counted."""
    kept, out, task = tmp_path / "kept", tmp_path / "runs", "cartpole_balance"
    earlier = [{"attempt": 1, "started": 100.0, "started_at": "2026-11-28T14:52:00+0000",
                "commit": "d943121", "core": 0}]  # fmt: skip
    found = {
        "evaluations": [[0, 320.0], [1200, 369.0]],
        "train_episode_rewards": [(1000, 136.2), (2000, 411.0), (3000, 702.6), (4000, 869.4)],
    }
    runs._keep_progress(kept, "magi_lp", task, 1, TINY, earlier, found)
    record = progress_record(kept, "magi_lp", task, 1)

    def ours() -> dict:
        states = comparison.progress(out, TINY, (task,), kept, (1,))
        (state,) = [s for s in states if s["agent"] == "magi_lp"]
        return state

    assert ours()["state"].startswith("no folder here")
    assert ours()["evaluations"] == [[0, 320.0], [1200, 369.0]] and ours()["launches"] == 1
    # The run's own folder's next launch leaves its record alone.
    assert runs.set_aside_lost(kept, "magi_lp", task, 1, earlier) is None and record.is_file()
    # A folder with no launch of that run: it was lost; its record is set aside, not deleted.
    moved = runs.set_aside_lost(kept, "magi_lp", task, 1, [])
    assert moved and not record.exists()
    assert json.loads(moved.read_text())["attempts"] == earlier
    # How far it got, in the figure's list of earlier runs.
    assert (
        "at its last stop: 4,000 frames; training returns of its last episodes 411, 703, 869"
        in ("\n".join(comparison.history_table([ours()])))
    ), comparison.history_table([ours()])
    assert ours()["state"] == "not started" and ours()["lost_runs"] == 1
    assert "1 earlier run(s) of this seed lost with a machine" in "\n".join(
        comparison.progress_table([ours()])
    )
    # What is set aside is not a kept result.
    assert comparison.load_runs(kept) == []


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


def _needs_venv312() -> None:
    if not (ROOT / ".venv312" / "bin" / "python").exists():
        pytest.skip("needs .venv312 (make setup312): the learn check runs the current stack")


def _tiny(out: Path, agents: str, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "benchmarks.learn_check", "--tiny", "--agents", agents]
    return [*command, "--seeds", "1", "--cores", "0", "--out", str(out), *extra]


def _kill_when(command: list[str], ready, timeout: float) -> None:
    """Starts `command` in its own process group and SIGKILLs the group (as the end of a
    session does) once `ready()`; fails if it ends first."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never became ready to kill"
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _environments(marker: str) -> list[dict[str, str]]:
    """The environment variables of each process here whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or marker not in (proc / "cmdline").read_text("latin-1"):
                continue
            text = (proc / "environ").read_text("latin-1")
        except OSError:  # ended meanwhile
            continue
        found.append(dict(item.split("=", 1) for item in text.split("\0") if "=" in item))
    return found


@CURRENT_STACK_LEG
@pytest.mark.integration  # a tiny main.py run on the current stack, killed and resumed
@pytest.mark.timeout(900)
def test_tiny_run_of_this_projects_side_resumes_after_a_kill_and_is_kept(tmp_path):
    _needs_venv312()
    folder = run_dir(tmp_path, "magi_lp", "cartpole_balance", 1)
    learner = folder / "work" / "checkpoints" / "learner"
    actor_log = folder / "work" / "logs" / "actor_0" / "logs.csv"
    running: list[dict[str, str]] = []

    def checkpointed_past_seed_frames() -> bool:
        if not actor_log.is_file() or not learner.is_dir() or not any(learner.iterdir()):
            return False
        with open(actor_log, newline="") as file:
            steps = [int(float(r["actor_steps"])) for r in csv.DictReader(file)]
        running[:] = _environments(f"--workdir={folder / 'work'}")
        return bool(steps) and 2 * max(steps) >= TINY.seed_frames + 400

    _kill_when(_tiny(tmp_path, "magi_lp"), checkpointed_past_seed_frames, timeout=600)
    assert not (folder / RESULT).is_file()
    # The run's process had the allocator's settings both agents share.
    assert running and all(env.items() >= ALLOCATOR.items() for env in running), running
    # What a lost machine would leave: the launch, in the progress record beside the results.
    record = progress_record(tmp_path / "results", "magi_lp", "cartpole_balance", 1)
    assert [a["attempt"] for a in json.loads(record.read_text())["attempts"]] == [1]
    again = subprocess.run(
        _tiny(tmp_path, "magi_lp"), cwd=ROOT, capture_output=True, text=True, timeout=540
    )
    assert again.returncode == 3, again.stdout + again.stderr  # 1 of 3 seeds: incomplete
    attempts = runs.read_attempts(folder)
    assert len(attempts) == 2 and attempts[1]["resumed"] and attempts[1]["exit_code"] == 0
    assert attempts[0]["exit_code"] is None and "cut off" in attempts[0]["end"]
    assert attempts[1]["commit"] and "dirty" in attempts[1]
    assert all(a["allocator"] == ALLOCATOR for a in attempts)
    # Each launch names the CPU it ran on, beyond a VM's generic model name.
    assert all(a["machine"]["cpu_id"] == common.cpu_id() != "" for a in attempts)
    log = (folder / "run-2.log").read_text()
    assert "resumed from learner step" in log, log[-2000:]
    # With its replay restored the relaunch keeps the schedule: as many updates in all as
    # one uninterrupted run of the same frames makes.
    agent = get_agent_config()
    agent.min_replay_frames, agent.batch_size = TINY.seed_frames, TINY.batch_size
    updates = max(int(p.name) for p in learner.iterdir())  # the final checkpoint's step
    assert updates == replay_schedule(agent, ACTION_REPEAT).updates_due(
        TINY.frames // ACTION_REPEAT
    ), updates
    # The relaunch went on from its checkpoint: its first episode starts past frame 0, and
    # the rows of the first launch it repeats are left out of the frames/s windows.
    with open(actor_log, newline="") as file:
        rows = list(csv.DictReader(file))
    relaunched = [r for r in rows if float(r["wall_time"]) >= attempts[1]["started"]]
    resumed_at = float(relaunched[0]["actor_steps"]) - float(relaunched[0]["episode_length"])
    assert resumed_at > 0
    first = [2 * int(float(r["actor_steps"])) for r in rows[: len(rows) - len(relaunched)]]
    again = [2 * int(float(r["actor_steps"])) for r in relaunched]
    ends = [frame for frame, _, _ in runs._ours_episode_ends(rows)]
    assert ends == [e for e in first if e <= 2 * resumed_at] + again
    result = json.loads(kept_result(tmp_path / "results", "magi_lp", "cartpole_balance", 1)
                        .read_text())  # fmt: skip
    # Each evaluation once, at exactly the frames it was told.
    assert [frame for frame, _ in result["evaluations"]] == [0, 1200, 2400]
    assert result["train_frames_per_s"] > 0 and result["versions"]["jax"]
    assert result["machine"]["cpu"] and result["machine"]["cores"]
    assert result["wall_s"] > 0 and len(result["attempts"]) == 2
    assert not record.exists()  # finished: the result holds it all
    assert (tmp_path / "curves.csv").read_text().count("magi_lp") >= 3
    # Kept: a third call runs nothing.
    third = subprocess.run(
        _tiny(tmp_path, "magi_lp"), cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "0 run(s) to do" in third.stdout, third.stdout + third.stderr


@CURRENT_STACK_LEG
@pytest.mark.integration  # a tiny main.py run with a broken update
@pytest.mark.timeout(900)
def test_a_tiny_run_with_the_critic_target_negated_fails_the_learning_rule(tmp_path):
    """Negative control: the critic regresses on -(r + gamma min Q'): it cannot learn.

    At TINY's sizes with half its frames (ours only: the official agent's 1000-frame
    episodes need TINY's 1,200 seed frames): 201 updates, from frame 400. A correct update
    does not learn in 201 updates either: what this shows is that the switch breaks the
    update (the targets turn negative) and that the rules and the comparison fail such a run.
    That they pass agents that do learn is shown by the real runs (figure 17), not here."""
    _needs_venv312()
    settings = dataclasses.replace(
        TINY, frames=1_200, eval_every_frames=600, seed_frames=400, checkpoint_minutes=10.0
    )
    folder = tmp_path / "broken"
    folder.mkdir()
    os.environ["MAGI_LP_LEARN_CHECK_BREAK"] = "critic_target_sign"
    try:
        run = runs.Run("magi_lp", "cartpole_balance", 1, folder, tmp_path / "kept")
        result = runs.run_one(run, settings, None, None)
    finally:
        del os.environ["MAGI_LP_LEARN_CHECK_BREAK"]
    assert result["exit_code"] == 0, runs.log_tail(folder / "run-1.log")
    # The switch took effect: the TD targets the critic regressed on were negative (rewards
    # are >= 0: a correct target is positive, about 3 here).
    with open(folder / "work" / "logs" / "learner" / "logs.csv", newline="") as file:
        targets = [float(r["critic_target_q"]) for r in csv.DictReader(file)]
    late = targets[len(targets) // 2 :]
    assert late and sum(late) / len(late) < 0.0, targets
    curve = [value for _, value in result["evaluations"]]
    good = [_result("official", seed, [40.0, 100.0, 190.0], settings) for seed in SEEDS] + [
        {**result, "seed": seed} for seed in SEEDS
    ]
    for rule in comparison.RULES:  # the learn check's and the GPU comparison's second
        verdict = comparison.learned(
            "cartpole_balance", curve[0], curve[-1], settings.episode_frames, rule
        )
        assert not verdict["learned"], verdict
        # And the comparison with it in ours' place fails.
        found = comparison.compare(good, settings, rule=rule)["tasks"]["cartpole_balance"]
        assert found["comparison"]["verdict"] == comparison.NOT_HELD
        assert found["official"]["learning"]["learned"], found["official"]["learning"]


@CURRENT_STACK_LEG
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_tiny_run_of_the_official_side_resumes_from_its_snapshot(tmp_path):
    checkout = os.environ.get("MAGI_LP_DRQV2_CHECKOUT", "")
    if not checkout or not (ROOT / ".venv-official" / "bin" / "python").exists():
        pytest.skip(
            "the official DrQ-v2 is not here: set MAGI_LP_DRQV2_CHECKOUT to a checkout of "
            f"{official.OFFICIAL_REPO} at {official.OFFICIAL_COMMIT[:7]} and run "
            "scripts/setup_official_venv.sh"
        )
    folder = run_dir(tmp_path, "official", "cartpole_balance", 1)
    train = folder / "work" / "train.csv"
    command = _tiny(tmp_path, "official", "--official", checkout)
    running: list[dict[str, str]] = []

    def snapshot_and_an_episode_after_it() -> bool:
        running[:] = _environments(f"hydra.run.dir={folder / 'work'}")
        return (
            (folder / "work" / "snapshot.pt").is_file()
            and train.is_file()
            and len(train.read_text().splitlines()) >= 2
        )

    # Killed once snapshot.pt is written and a training episode after it is logged.
    _kill_when(command, snapshot_and_an_episode_after_it, timeout=900)
    # train.py and its replay worker had the allocator's settings both agents share.
    assert running and all(env.items() >= ALLOCATOR.items() for env in running), running
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "resuming:" in (folder / "run-2.log").read_text()
    result = json.loads(
        kept_result(tmp_path / "results", "official", "cartpole_balance", 1).read_text()
    )
    assert [frame for frame, _ in result["evaluations"]] == [0, 1200, 2400]
    assert len(result["attempts"]) == 2 and result["attempts"][1]["resumed"]
    # The saturation probe reads the snapshot with the run's official code, in its venv.
    argv = ["--out", str(tmp_path), "--seeds", "1", "--image-size", "32", "--observations", "12"]
    assert saturation.main([*argv, "--write", str(tmp_path / "saturation.json")]) == 0
    probes = json.loads((tmp_path / "saturation.json").read_text())["runs"]
    assert [(p["agent"], p["observations"]) for p in probes] == [("official", 12)]
    assert probes[0]["frames"] > 0 and 0.0 <= probes[0]["saturated"] <= 1.0


def test_a_stopped_official_launch_leaves_its_temp_files_only_until_the_next(tmp_path, monkeypatch):
    """The official replay worker's multiprocessing makes $TMPDIR/pymp-*, which a launch killed
    by a signal (each session's end) leaves: the run's env gives it a TMPDIR of its own, short
    enough for multiprocessing's Unix sockets, emptied by the next launch's env and removed by
    remove_temp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "system_tmp"))
    (tmp_path / "system_tmp").mkdir()
    folder = tmp_path / ("a_long_run_folder_" * 8) / "official" / "cartpole_balance" / "seed_4"
    killed = "import multiprocessing.util as u, os; u.get_temp_dir(); os.kill(os.getpid(), 9)"
    outer = tmp_path / "outer"
    outer.mkdir()
    for name, extra in (("plain", {}), ("run", official.environment(folder))):
        done = subprocess.run(
            [sys.executable, "-c", killed], env={**os.environ, "TMPDIR": str(outer), **extra},
            timeout=120,
        )  # fmt: skip
        assert done.returncode == -signal.SIGKILL
        if name == "plain":  # the check can fail: the folder a kill leaves
            assert [p.name[:5] for p in outer.iterdir()] == ["pymp-"]
            shutil.rmtree(next(outer.iterdir()))
    temp = Path(extra["TMPDIR"])
    assert list(outer.iterdir()) == [] and temp.parent == tmp_path / "system_tmp"
    assert len(temp.name) <= 32 and temp == official.temp_folder(folder)
    assert [p.name[:5] for p in temp.iterdir()] == ["pymp-"]
    official.environment(folder)  # the next launch's
    assert list(temp.iterdir()) == []
    official.remove_temp(extra)
    assert list((tmp_path / "system_tmp").iterdir()) == []


def test_copied_official_files_are_a_checkout_that_passes_the_pinned_hashes(tmp_path):
    """What `DRQV2=... make gpu-learn-wheels` carries to a GPU machine verifies there."""
    checkout = os.environ.get("MAGI_LP_DRQV2_CHECKOUT", "")
    if not checkout:
        pytest.skip("the official DrQ-v2 is not here: set MAGI_LP_DRQV2_CHECKOUT")
    copied = official.copy_files(Path(checkout), tmp_path / "drqv2")
    official.check_checkout(copied)  # raises if a file differs or is missing
    assert not (copied / ".git").exists() and (copied / "train.py").is_file()
    (copied / "train.py").write_text("changed")
    with pytest.raises(official.OfficialCodeMissing, match="differs from commit"):
        official.check_checkout(copied)


def test_the_official_runs_rendering_leaves_nothing_in_home(tmp_path):
    """Mesa's EGL keeps its shader cache under $XDG_CACHE_HOME (else the password database's
    home folder): the official run's env names that cache inside the run's folder instead."""
    env = official.environment(tmp_path / "run")
    assert Path(env["MESA_SHADER_CACHE_DIR"]).parent == tmp_path / "run"
    python = runs.VENV_OFFICIAL / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-official here (scripts/setup_official_venv.sh makes it)")
    render = (
        "from dm_control import suite; e = suite.load('cartpole', 'balance'); e.reset(); "
        "e.physics.render(84, 84, camera_id=0)"
    )
    base = {k: v for k, v in os.environ.items() if k != "MESA_SHADER_CACHE_DIR"}
    for name, extra in (("plain", {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}), ("run", env)):
        cache = tmp_path / f"cache_{name}"
        cache.mkdir()
        subprocess.run(
            [str(python), "-c", render], env={**base, "XDG_CACHE_HOME": str(cache), **extra},
            check=True, timeout=120,
        )  # fmt: skip
        left = [path.name for path in cache.iterdir()]
        assert left == (["mesa_shader_cache"] if name == "plain" else []), (name, left)


def test_the_official_runs_torch_leaves_nothing_in_tmp(tmp_path):
    """torch 2.13's optimizer step makes $TMPDIR/torchinductor_<user> (its inductor cache):
    the official run's env names that cache inside the run's folder instead."""
    env = official.environment(tmp_path / "run")
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == tmp_path / "run"
    python = runs.VENV_OFFICIAL / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-official here (scripts/setup_official_venv.sh makes it)")
    step = "import torch; m = torch.nn.Linear(3, 3); torch.optim.Adam(m.parameters()).step()"
    for name, extra in (("plain", {}), ("run", env)):
        temp = tmp_path / f"tmp_{name}"
        temp.mkdir()
        subprocess.run(
            [str(python), "-c", step], env={**os.environ, "TMPDIR": str(temp), **extra},
            check=True, timeout=120,
        )  # fmt: skip
        left = [path.name.startswith("torchinductor_") for path in temp.iterdir()]
        assert left == ([True] if name == "plain" else []), (name, left)  # the check can fail
