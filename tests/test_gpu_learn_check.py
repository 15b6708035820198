"""The preregistered GPU comparison (benchmarks/gpu_learn_check.py) over gpu_learn.json files
shaped as `make gpu-learn` writes them, and over CPU runs kept as `learn_check --paper` keeps
them: it holds for two learners alike, and fails, with its exit code, for a learner that never
updates, for one that learns at half the rate, and while a preregistered seed is missing. Runs
of other seeds or settings are not counted; one kind of machine counts, the one whose six runs
finished first, or, for the third preregistration (the current one), the GPU's only. (The same
rules, against a tiny run with a broken critic target, are tests/test_learn_check.py's.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks import gpu_learn, gpu_learn_check
from benchmarks.learn_check import __main__ as learn_check_main
from benchmarks.learn_check import comparison, official, runs, saturation
from benchmarks.learn_check import settings as learn_check_settings

LEARNS = [(0, 380.0), (20_000, 520.0), (40_000, 960.0)]


def _result(agent: str, curves: dict[int, list[tuple[int, float]]], **change) -> dict:
    result = {
        "tiny": False,
        "task": gpu_learn.TASK,
        "device": "gpu: NVIDIA H100 80GB HBM3",
        "machine": {"cpu": "Intel(R) Xeon(R) Processor", "cores": 16},
        "versions": {"jax": "0.11.2"},
        "commit": "abc1234",
        "measured_at": "2026-12-01T10:00:00+0000",
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


def _check(
    tmp_path: Path,
    ours: dict,
    official: dict,
    capsys,
    prereg: gpu_learn_check.Preregistration = gpu_learn_check.CURRENT,
) -> tuple[int, str]:
    """`prereg`'s exit code over the two results (main's, which is the current one's) and its
    lines."""
    paths = [_write(tmp_path, "ours", ours), _write(tmp_path, "official", official)]
    code = gpu_learn_check.main([*map(str, paths), "--cpu-results", str(folder_of_none(tmp_path))])
    capsys.readouterr()
    found = gpu_learn_check.check(paths, folder_of_none(tmp_path), prereg)
    own = comparison.EXIT[found["agents"]["comparison"]["verdict"]]
    assert prereg is not gpu_learn_check.CURRENT or code == own  # the exit code: the current's
    return own, "\n".join(gpu_learn_check.lines(found))


def folder_of_none(tmp_path: Path) -> Path:
    return tmp_path / "no-cpu-runs"


def _keep_cpu(kept: Path, agent: str, curves: dict, ended: float, **change) -> None:
    """CPU runs as `python -m benchmarks.learn_check --paper` keeps them (runs.run_one)."""
    for seed, curve in curves.items():
        result = {
            "agent": agent,
            "task": gpu_learn.TASK,
            "seed": seed,
            "settings": dataclasses.asdict(gpu_learn_check.SETTINGS),
            "versions": {"jax": "0.4.30"},
            "machine": {"cpu": "AMD EPYC", "cores": 2},
            "cores": 1,  # how many, as runs.run_one keeps it (a GPU run lists its cores)
            "attempts": [{"attempt": 1, "started": ended - 3600, "ended": ended + seed}],
            "evaluations": curve,
            "train_frames_per_s": 2.5 if agent == "magi_lp" else 1.8,
            **change,
        }
        path = kept / agent / gpu_learn.TASK / f"seed_{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))


def _seeds(
    curve: list[tuple[int, float]], seeds: tuple[int, ...] = gpu_learn_check.SEEDS
) -> dict[int, list[tuple[int, float]]]:
    """`curve` for each of `seeds` (by default the second's, which the CPU machine runs)."""
    # A little spread between seeds, so that the bootstrap has something to resample.
    middle = seeds[len(seeds) // 2]
    return {s: [(f, v + 10 * (s - middle)) for f, v in curve] for s in seeds}


EVERY = pytest.mark.parametrize("prereg", gpu_learn_check.PREREGISTRATIONS, ids=lambda p: p.name)


@EVERY
def test_two_agents_learning_alike_hold_with_the_ratio_and_its_interval(tmp_path, capsys, prereg):
    ours = _result("magi_lp", _seeds(LEARNS, prereg.seeds))
    official = _result("official", _seeds(LEARNS, prereg.seeds))
    code, out = _check(tmp_path, ours, official, capsys, prereg)
    assert code == comparison.EXIT[comparison.HELD], out
    assert "AUC ratio (ours / official) 1.000, 95% [" in out
    assert f"seeds {list(prereg.seeds)}" in out and "train frames/s 130.0" in out


@EVERY
def test_a_learner_that_never_updates_fails(tmp_path, capsys, prereg):
    """The negative control, for every preregistration: a broken agent fails each."""
    frozen = [(f, LEARNS[0][1]) for f, _ in LEARNS]  # the frame-0 return, carried
    ours = _result("magi_lp", _seeds(frozen, prereg.seeds))
    official = _result("official", _seeds(LEARNS, prereg.seeds))
    code, out = _check(tmp_path, ours, official, capsys, prereg)
    assert code == comparison.EXIT[comparison.NOT_HELD], out
    assert "magi_lp did not learn" in out and "AUC ratio 0.5" in out


@EVERY
def test_a_learner_at_half_the_rate_fails_on_the_ratio_alone(tmp_path, capsys, prereg):
    slow = [(0, 380.0), (20_000, 380.0), (40_000, 760.0)]  # learned by the rule, later
    ours = _result("magi_lp", _seeds(slow, prereg.seeds))
    official = _result("official", _seeds(LEARNS, prereg.seeds))
    code, out = _check(tmp_path, ours, official, capsys, prereg)
    assert code == comparison.EXIT[comparison.NOT_HELD], out
    assert "did not learn" not in out and "AUC ratio 0.770 < 0.9" in out


@EVERY
def test_a_missing_seed_or_point_leaves_it_incomplete_and_other_runs_do_not_count(
    tmp_path, capsys, prereg
):
    last = prereg.seeds[-1]
    curves = _seeds(LEARNS, prereg.seeds)
    curves[last] = LEARNS[:2]  # the last seed stopped before its 40k evaluation
    ours = _result("magi_lp", curves)
    # Seeds 1-3 ran before the preregistrations; a tiny result is a check of the command.
    earlier = _result("magi_lp", {s: LEARNS for s in (1, 2, 3)})
    tiny = _result("magi_lp", {last: LEARNS}, tiny=True)
    paths = [
        _write(tmp_path, name, result)
        for name, result in [
            ("ours", ours),
            ("earlier", earlier),
            ("tiny", tiny),
            ("official", _result("official", _seeds(LEARNS, prereg.seeds))),
        ]
    ]
    code = gpu_learn_check.main([*map(str, paths), "--cpu-results", str(folder_of_none(tmp_path))])
    out = capsys.readouterr().out
    found = gpu_learn_check.check(paths, folder_of_none(tmp_path), prereg)
    assert found["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE
    assert code == comparison.EXIT[comparison.INCOMPLETE], out  # every one's, the current's too
    assert f"missing: {{'magi_lp': [{last}], 'official': []}}" in "\n".join(
        gpu_learn_check.lines(found)
    )
    runs = 2 * len(prereg.seeds)
    assert f"runs not finished ({runs - 1} of its {runs} runs on gpu" in out


def test_a_continued_runs_furthest_record_counts_once(tmp_path, capsys):
    first = _result("official", {s: LEARNS[:2] for s in gpu_learn_check.SEEDS})
    later = _result("official", _seeds(LEARNS))
    paths = [_write(tmp_path, "first", first), _write(tmp_path, "later", later)]
    found = gpu_learn_check.check(
        [*paths, _write(tmp_path, "ours", _result("magi_lp", _seeds(LEARNS)))],
        None,
        gpu_learn_check.SECOND,
    )
    assert found["agents"]["official"]["seeds"] == [10, 11, 12]
    assert len(found["left_out"]) == 3 and found["agents"]["comparison"]["verdict"] == "held"


def test_no_result_yet_is_incomplete_and_a_missing_file_is_one_line(tmp_path, capsys):
    assert gpu_learn_check.check([])["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE
    assert (
        "gpu_learn_check (third): incomplete: runs not finished (0 of its 10 runs; GPU runs only)"
        in gpu_learn_check.lines(gpu_learn_check.check([], tmp_path / "none"))
    )
    try:
        gpu_learn_check.main([str(tmp_path / "nope.json")])
    except SystemExit as stop:
        assert "gpu_learn_check: no such file" in str(stop)
    else:
        raise AssertionError("a missing file must stop the check with one line")


def test_six_cpu_runs_alone_make_the_verdict_on_cpu(tmp_path, capsys):
    kept = tmp_path / "cpu"
    frozen = [(f, LEARNS[0][1]) for f, _ in LEARNS]
    _keep_cpu(kept, "magi_lp", _seeds(frozen), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    code = gpu_learn_check.main(["--cpu-results", str(kept)])  # no GPU result given
    out = capsys.readouterr().out
    # The exit code is the current preregistration's: the third's, which counts GPU runs only
    # (the standing order of 2026-12-06 made it current; it was the second's).
    assert code == comparison.EXIT[comparison.INCOMPLETE], out
    assert "gpu_learn_check (second): not held (on cpu): magi_lp did not learn" in out
    assert "on cpu (counted):" in out and "train frames/s 2.5" in out


def test_cpu_runs_at_other_settings_do_not_count(tmp_path):
    kept = tmp_path / "cpu"
    figure_13 = dataclasses.asdict(dataclasses.replace(gpu_learn_check.SETTINGS, image_size=48))
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9, settings=figure_13)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    found = gpu_learn_check.check([], kept, gpu_learn_check.SECOND)
    assert found["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE
    assert "magi_lp" not in found["machines"]["cpu"]["agents"]


def test_the_machine_whose_six_runs_finished_first_counts_and_sets_never_mix(tmp_path, capsys):
    gpu = [
        _write(tmp_path, "ours", _result("magi_lp", _seeds(LEARNS))),
        _write(tmp_path, "official", _result("official", _seeds(LEARNS))),
    ]
    gpu_done = gpu_learn_check._epoch("2026-12-01T10:00:00+0000")
    kept = tmp_path / "cpu"
    # The CPU's ours did not learn; its official runs finished an hour before the GPU's.
    frozen = [(f, LEARNS[0][1]) for f, _ in LEARNS]
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=gpu_done - 3600)
    # Three GPU runs of ours beside three CPU runs of the official agent: no set is complete.
    second = gpu_learn_check.SECOND
    mixed = gpu_learn_check.check(gpu[:1], kept, second)
    assert mixed["machine"] is None
    assert mixed["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE

    _keep_cpu(kept, "magi_lp", _seeds(frozen), ended=gpu_done + 60)  # after the GPU's sixth
    found = gpu_learn_check.check(gpu, kept, second)
    assert found["machine"] == "gpu"
    assert found["agents"]["comparison"]["verdict"] == comparison.HELD
    assert found["machines"]["cpu"]["agents"]["comparison"]["verdict"] == comparison.NOT_HELD

    _keep_cpu(kept, "magi_lp", _seeds(frozen), ended=gpu_done - 60)  # before it
    found = gpu_learn_check.check(gpu, kept, second)
    assert found["agents"]["comparison"]["verdict"] == comparison.NOT_HELD
    out = "\n".join(gpu_learn_check.lines(found))
    assert "on gpu (not counted):" in out and "on cpu (counted):" in out


def test_the_cpu_runs_are_the_gpu_runs_commands_at_the_same_settings(monkeypatch, tmp_path):
    """The amendment's claim: `learn_check --paper` runs each agent with `make gpu-learn`'s
    arguments (ours: a checkpoint every 10 minutes besides; the official agent: on the CPU)."""
    workdir = tmp_path / "work"
    cpu = runs.ours_command(gpu_learn_check.SETTINGS, gpu_learn.TASK, 4, workdir)
    gpu = gpu_learn.ours_command(4, workdir, tiny=False, frames=gpu_learn_check.FRAMES)
    assert sorted(cpu[1:]) == sorted([*gpu[1:], "--config.checkpoint.every_minutes=10.0"])
    monkeypatch.setattr(official, "prepare", lambda checkout, folder: folder)
    gpu_official, code_dir = gpu_learn.official_command(
        tmp_path / "drqv2", tmp_path, 4, gpu_learn_check.FRAMES
    )
    cpu_official = runs.official_command(
        gpu_learn_check.SETTINGS, gpu_learn.TASK, 4, code_dir, tmp_path / "work"
    )
    assert gpu_official == [a.replace("device=cpu", "device=cuda") for a in cpu_official]
    assert "device=cuda" in gpu_official


def test_learn_check_paper_reports_the_gpu_checks_verdict_and_refuses_tiny(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(gpu_learn_check, "KEPT", tmp_path / "gpu")  # no GPU result
    kept = tmp_path / "cpu"
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    argv = ["--paper", "--report-only", "--kept", str(kept), "--out", str(tmp_path / "runs")]
    # Its exit code is the verdict of the comparison these CPU runs serve (CPU_CURRENT: the
    # second; the third counts GPU runs only), printed with the others'.
    assert learn_check_main.main(argv) == comparison.EXIT[comparison.HELD]
    out = capsys.readouterr().out
    assert "report only (84x84 pixels" in out
    assert "gpu_learn_check (second): held (on cpu)" in out
    assert "not started" not in out  # every run is kept
    argv = ["--paper", "--report-only", "--kept", str(tmp_path / "none"), "--out", argv[-1]]
    assert learn_check_main.main(argv) == comparison.EXIT[comparison.INCOMPLETE]
    assert "learn_check: official seed 12: not started" in capsys.readouterr().out
    for wrong in (["--tiny"], ["--tasks", "walker_stand"]):
        try:
            learn_check_main.main(["--paper", "--report-only", *wrong])
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"--paper with {wrong} must be refused")
        assert "--paper" in capsys.readouterr().err


def test_the_figure_names_the_machine_counted_with_each_run_and_the_published_curve(tmp_path):
    kept = tmp_path / "cpu"
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    gpu = [_write(tmp_path, "ours", _result("magi_lp", _seeds(LEARNS)))]  # 3 of 6 on the GPU
    # The first preregistration's ours seed 4, launched here once and left for the second's.
    seed_4 = tmp_path / "runs" / "magi_lp" / gpu_learn.TASK / "seed_4"
    seed_4.mkdir(parents=True)
    (seed_4 / runs.ATTEMPTS).write_text(json.dumps({"attempt": 1, "started": 1.7e9}) + "\n")
    result = gpu_learn_check.write(
        gpu_learn_check.check_all(gpu, kept),
        tmp_path / "check.json",
        tmp_path / "curves.png",
        cpu_kept=kept,
        cpu_runs_out=tmp_path / "runs",
    )
    # The headline is the third's since the standing order of 2026-12-06 (it was the
    # second's): incomplete, none of its ten GPU runs; the second's verdict beside it.
    written = json.loads((tmp_path / "check.json").read_text())
    assert written["verdict"] == comparison.INCOMPLETE
    assert [e["verdict"] for e in written["earlier"]] == [comparison.HELD, comparison.INCOMPLETE]
    assert result["png"] == "no PNG (no run finished)"
    second_png = tmp_path / "curves_second.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert result["earlier"][0]["png"] == "no PNG (matplotlib is not installed here)"
    else:
        assert second_png.stat().st_size > 0
    number, against, rule = gpu_learn_check.summary(result)
    assert number.startswith(
        "third: incomplete, 0 of 10 runs finished (gpu 0 / 10; GPU runs only); "
        "second (seeds [10, 11, 12]): held on cpu: AUC ratio 1.000 (95% ["
    ), number
    assert "; first (seeds [4, 5, 6]): in progress: runs finished: gpu 0 / 6" in number
    assert "seeds [20, 21, 22, 23, 24]" in against and "0.9" in rule
    page = gpu_learn_check.report(result)
    third, rest = page.split("**The second preregistration** (seeds 10, 11, 12; registered")
    assert "**Verdict: incomplete**: runs not finished (0 of its 10 runs; GPU runs only)" in third
    assert "On cpu: never counted (GPU runs only)." in third
    assert "not started" not in third  # the CPU machine never runs the third's seeds
    assert "**On cpu** (counted):" in rest and "**On gpu** (not counted):" in rest
    assert "| official, published (10 seeds) | 10 | 374 (309-508) | 375 (135-492) | 835" in page
    current, first = rest.split("**The first preregistration** (seeds 4, 5, 6; registered")
    assert "Runs not finished yet" not in current  # every CPU run of its seeds is kept
    assert f"| magi_lp | 4 | {gpu_learn_check.PAUSED} | - | 1 |" in first
    assert "| official | 4 | not started | - | 0 |" in first

    def nothing(prereg: gpu_learn_check.Preregistration) -> dict:
        return gpu_learn_check.write(
            [gpu_learn_check.check([], tmp_path / "none", prereg)],
            tmp_path / "empty.json",
            tmp_path / "e.png",
            cpu_kept=tmp_path / "none",
            cpu_runs_out=tmp_path / "runs",
        )

    second = nothing(gpu_learn_check.SECOND)
    assert second["png"] == "no PNG (no run finished)"
    assert "| magi_lp | 10 | not started | - | 0 |" in gpu_learn_check.report(second)
    # The headline's words for an incomplete one (the third's now): how many of its runs.
    assert gpu_learn_check.summary(second)[0] == (
        "second: incomplete, 0 of 6 runs finished (gpu 0 / 6, cpu 0 / 6)"
    )
    third = nothing(gpu_learn_check.THIRD)
    assert gpu_learn_check.summary(third)[0] == (
        "third: incomplete, 0 of 10 runs finished (gpu 0 / 10; GPU runs only)"
    )
    page = gpu_learn_check.report(third)
    assert (
        "Runs still to make on a GPU: magi_lp seeds 20, 21, 22, 23, 24; official seeds 20, 21, "
        "22, 23, 24" in page
    ), page
    assert "It counts GPU runs only" in page and "never counted" in page


def test_the_first_preregistration_says_ours_cannot_pass_its_rule_and_the_second_counts_apart():
    """The H200 runs of ours' seeds 4-6 (committed): by the first's rule they did not learn,
    and the check says that no return could have passed; the second counts none of them."""
    kept = sorted(gpu_learn_check.KEPT.glob("2026-11-27_magi_lp.json"))
    assert kept, "the first preregistration's runs of ours are committed"
    first = gpu_learn_check.check(kept, None, gpu_learn_check.FIRST)
    learning = first["machines"]["gpu"]["agents"]["magi_lp"]["learning"]
    assert not learning["learned"] and not learning["reachable"]
    assert learning["needed"] > comparison.TOP_RETURN
    assert "more than any return: cannot hold" in "\n".join(gpu_learn_check.lines(first))
    assert first["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE  # no official run
    for later in (gpu_learn_check.SECOND, gpu_learn_check.THIRD):
        found = gpu_learn_check.check(kept, None, later)
        assert "magi_lp" not in found["machines"]["gpu"]["agents"]
        assert found["machines"]["gpu"]["agents"]["not_counted"]
    assert set(gpu_learn_check.FIRST.seeds).isdisjoint(gpu_learn_check.SECOND.seeds)


def _module_at(commit: str, path: str, name: str) -> types.ModuleType:
    """`path` as `commit` had it, loaded as a module (skips in a shallow clone)."""
    shown = subprocess.run(
        ["git", "show", f"{commit}:{path}"],
        cwd=gpu_learn_check.common.REPO, capture_output=True, text=True,
    )  # fmt: skip
    if shown.returncode != 0:
        pytest.skip(f"{commit} is not in this clone's history (a shallow clone)")
    then = types.ModuleType(f"{name}_at_{commit}")
    sys.modules[then.__name__] = then  # dataclasses look their module up there
    try:
        exec(compile(shown.stdout, f"{path}@{commit}", "exec"), then.__dict__)
    finally:
        del sys.modules[then.__name__]
    return then


def _file_at(commit: str) -> types.ModuleType:
    """benchmarks/gpu_learn_check.py as `commit` had it, loaded as a module."""
    return _module_at(commit, "benchmarks/gpu_learn_check.py", "gpu_learn_check")


def test_each_preregistration_is_as_its_commit_registered_it():
    """Seeds, rule and machines never change after their registration: the first's seeds as
    061548f (which added this file) had them, the second as d943121 (which added it) had it,
    the third as 1aeec12 (which added it) had it. The first two count both kinds of machine, as
    the amendment let them (`machines`, added with the third, defaults to that)."""
    first = _file_at("061548f")
    assert first.SEEDS == gpu_learn_check.FIRST.seeds == (4, 5, 6)
    assert gpu_learn_check.FIRST.rule == comparison.RATIO
    assert dataclasses.asdict(first.SETTINGS) == dataclasses.asdict(gpu_learn_check.SETTINGS)
    second = _file_at("d943121")
    for name in ("FIRST", "SECOND"):
        then, now = dataclasses.asdict(getattr(second, name)), getattr(gpu_learn_check, name)
        assert {k: v for k, v in dataclasses.asdict(now).items() if k in then} == then, name
        assert now.machines == gpu_learn_check.MACHINES == ("gpu", "cpu"), name
    # The third as 1aeec12 (which added it, before any of its runs) had it; the standing order
    # of 2026-12-06 made it current (it was the second).
    third = _file_at("1aeec12")
    for name in ("FIRST", "SECOND", "THIRD"):
        then, now = getattr(third, name), getattr(gpu_learn_check, name)
        assert dataclasses.asdict(then) == dataclasses.asdict(now), name
    assert third.SEEDS == gpu_learn_check.SEEDS == (10, 11, 12)  # the CPU machine's: the second's
    assert gpu_learn_check.CURRENT is gpu_learn_check.THIRD
    assert gpu_learn_check.PREREGISTRATIONS == (
        gpu_learn_check.THIRD,
        gpu_learn_check.SECOND,
        gpu_learn_check.FIRST,
    )


def test_the_rules_are_as_the_second_preregistration_registered_them():
    """The learned rules, the AUC, the goal and the bootstrap as comparison.py had them at
    d943121 (the commit that registered the second): the same answers on a grid of means and
    curves, so an edit of a constant or a rule after the runs were seen fails here."""
    then = _module_at("d943121", "benchmarks/learn_check/comparison.py", "comparison")
    for name in ("GOAL_RATIO", "LEARN_FACTOR", "GAP_SHARE", "TOP_RETURN", "LEARN_MIN", "RULES"):
        assert getattr(then, name) == getattr(comparison, name), name
    for rule in comparison.RULES:
        for start in (0.0, 136.0, 333.3, 400.0, 500.0, 616.0, 900.0):
            for final in (136.0, 650.0, 699.9, 700.0, 760.0, 950.0, 1000.0):
                now = comparison.learned(gpu_learn.TASK, start, final, rule=rule)
                was = then.learned(gpu_learn.TASK, start, final, rule=rule)
                assert (now["learned"], now["needed"]) == (was["learned"], was["needed"])
    for curve in ([300.0, 600.0, 990.0], [400.0, 136.0, 136.0], [500.0, 950.0]):
        assert comparison.auc(curve) == then.auc(curve)
    ours, theirs = [821.0, 811.0, 640.0], [672.0, 666.0, 700.0]
    assert comparison.bootstrap_ratio(ours, theirs) == then.bootstrap_ratio(ours, theirs)


def test_a_longer_run_at_other_settings_does_not_displace_the_counted_one(tmp_path):
    """One run per (agent, seed) counts, the furthest: of the runs at the preregistered
    settings; a longer one at others (a probe, a tiny run) is not a candidate."""
    ours = _result("magi_lp", _seeds(LEARNS))
    longer = _result(
        "magi_lp",
        {s: [*LEARNS, (60_000, 990.0)] for s in gpu_learn_check.SEEDS},
        settings={**ours["settings"], "args": ["--other"]},
    )
    official = _result("official", _seeds(LEARNS))
    paths = [_write(tmp_path, n, r) for n, r in (("a", ours), ("b", longer), ("c", official))]
    found = gpu_learn_check.check(paths, folder_of_none(tmp_path), gpu_learn_check.SECOND)
    assert found["agents"]["comparison"]["verdict"] == comparison.HELD, found["agents"]
    assert found["agents"]["magi_lp"]["seeds"] == list(gpu_learn_check.SEEDS)


def _cpu_figure(tmp_path: Path, kept: Path) -> tuple[dict, str]:
    """The figure written from the CPU runs kept in `kept` (no GPU result): the second
    preregistration's result (the last to count CPU runs), and its part of the page."""
    result = gpu_learn_check.write(
        gpu_learn_check.check_all([], kept),
        tmp_path / "check.json",
        tmp_path / "curves.png",
        cpu_kept=kept,
        cpu_runs_out=tmp_path / "runs",
    )
    assert result["preregistration"] == "third" and result["earlier"][0]["preregistration"] == (
        "second"
    )
    page = gpu_learn_check.report(result).split("**The second preregistration**")[1]
    return result["earlier"][0], page.split("**The first preregistration**")[0]


def test_the_figure_keeps_lost_runs_failed_launches_and_the_ratio_rules_answer(tmp_path):
    """A finished figure still shows a seed's earlier run lost with its machine and a failed
    launch of a counted run (the seed ran again: visible), and, under the gap rule, what the
    ratio rule (issue 35's rule 1) says of the same means."""
    kept = tmp_path / "cpu"
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds([(0, 485.0), (20_000, 400.0), (40_000, 950.0)]), ended=1.8e9)
    lost = learn_check_settings.lost_record(
        kept, "magi_lp", gpu_learn.TASK, 10, "2026-11-28T18:28:11+0000"
    )
    lost.parent.mkdir(parents=True)
    lost.write_text(json.dumps({"attempts": [{}], "evaluations": [[0, 320.0], [20000, 369.0]]}))
    failed = learn_check_settings.failed_record(kept, "official", gpu_learn.TASK, 11, 4)
    failed.parent.mkdir(parents=True)
    failed.write_text(
        json.dumps({"exit_code": 1, "evaluations": [[0, 485.0]], "log_tail": ["x", "Err: disk"]})
    )
    result, page = _cpu_figure(tmp_path, kept)
    assert result["verdict"] == comparison.HELD
    assert (
        "| magi_lp | 10 | earlier run (started 2026-11-28 18:28 UTC), lost with its machine; the "
        "seed ran again from frame 0 | 0k: 320, 20k: 369 |" in page
    ), page
    assert (
        "| official | 11 | launch 4 failed (exit 1; resumed from its last checkpoint): "
        "`Err: disk` | 0k: 485 |" in page
    ), page
    # 950 closes half the gap from 485 (742.5) but is not 2 x 485.
    assert "magi_lp yes (960 against 760); official no (950 against 970)" in page, page
    assert "one of 10 multisets of its seeds" in page


def test_the_agent_table_names_every_seeds_package_versions(tmp_path):
    """A package that differs between seeds is shown with each version, not the first's."""
    kept = tmp_path / "cpu"
    first, *rest = gpu_learn_check.SEEDS
    _keep_cpu(kept, "magi_lp", {first: LEARNS}, ended=1.8e9)
    _keep_cpu(kept, "magi_lp", {s: LEARNS for s in rest}, ended=1.8e9, versions={"jax": "0.5.0"})
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    agents = gpu_learn_check.check([], kept, gpu_learn_check.SECOND)["machines"]["cpu"]["agents"]
    assert agents["magi_lp"]["versions"] == {"jax": "0.4.30 / 0.5.0"}
    assert agents["official"]["versions"] == {"jax": "0.4.30"}


def test_the_cpu_runs_saturation_probe_is_shown_for_the_counted_seeds(tmp_path):
    """Why a run did not learn (figure 17): the probe's rows of this preregistration's seeds
    at these settings, under the CPU runs; another size's probe is not shown."""
    kept = tmp_path / "cpu"
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)

    def probe(image_size: int) -> None:
        row = {"frames": 23_000, "saturated": 1.0, "mean_action": 1.0, "action_spread": 0.0}
        runs = [{"agent": "official", "seed": s, "pinned": True, **row} for s in (12, 2)]
        (kept / gpu_learn_check.SATURATION.name).write_text(json.dumps({
            "task": gpu_learn.TASK, "image_size": image_size, "observations": 100,
            "saturated_above": 0.99, "measured_at": "2027-01-15T09:00:00+0000",
            "commit": "abc", "runs": runs,
        }))  # fmt: skip

    probe(84)  # after the runs' first launches (1.8e9 - 3600 s: 2027-01-15 07:00 UTC)
    shown = _cpu_figure(tmp_path, kept)[1]
    assert "| official | 12 | this run | 23,000 | **yes** | 1.00 | +1.000 | 0.000 |" in shown
    assert "| official | 2 |" not in shown
    probe(48)
    assert "| official | 12 | this run | 23,000" not in _cpu_figure(tmp_path, kept)[1]


def test_a_probe_of_a_run_lost_with_its_machine_is_not_shown_as_the_seeds_run(tmp_path):
    """Seed 12's official run was probed pinned, then lost with its machine; the seed runs
    again. The probe's row is the lost run's, not the new run's, whether it names its run
    (`run_started`) or, written before rows did, only says when it was measured."""
    kept = tmp_path / "cpu"
    first_start = 1.8e9 - 3600  # the new run's (`_keep_cpu`)
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS), ended=1.8e9)
    _keep_cpu(kept, "official", _seeds(LEARNS), ended=1.8e9)
    lost = learn_check_settings.lost_record(
        kept, "official", gpu_learn.TASK, 12, "2027-01-14T05:00:00+0000"
    )
    lost.parent.mkdir(parents=True)
    lost.write_text(json.dumps({"attempts": [{"started": first_start - 86_400}],
                                "evaluations": [[0, 312.0], [20000, 136.0]]}))  # fmt: skip
    row = {"agent": "official", "seed": 12, "pinned": True, "frames": 23_000,
           "saturated": 1.0, "mean_action": 1.0, "action_spread": 0.0}  # fmt: skip
    for named in ({"run_started": first_start - 86_400}, {}):
        (kept / gpu_learn_check.SATURATION.name).write_text(json.dumps({
            "task": gpu_learn.TASK, "image_size": 84, "observations": 100,
            "saturated_above": 0.99, "measured_at": "2027-01-14T17:00:00+0000",
            "commit": "abc", "runs": [{**row, **named}],
        }))  # fmt: skip
        shown = _cpu_figure(tmp_path, kept)[1]
        assert (
            "| official | 12 | earlier run (started 2027-01-14 05:00 UTC), lost | 23,000 | **yes**"
            in shown
        ), shown
        assert "| official | 12 | this run |" not in shown


def test_the_probe_keeps_a_lost_runs_rows_beside_the_new_runs():
    """saturation.merge: a probe of the seeds' runs replaces their earlier rows, and keeps
    the rows of a seed's earlier run (lost: told by its start, or by when it was measured)."""
    old_row = {"agent": "official", "seed": 12, "pinned": True}
    earlier = {"measured_at": "2027-01-14T17:00:00+0000", "commit": "abc",
               "runs": [old_row, {"agent": "official", "seed": 11, "pinned": False,
                                  "run_started": 1.0e9}]}  # fmt: skip
    new = [
        {"agent": "official", "seed": 12, "pinned": False, "run_started": 1.8e9},
        {"agent": "official", "seed": 11, "pinned": False, "run_started": 1.0e9},
    ]
    merged = saturation.merge(new, earlier)
    assert [(r["seed"], r["pinned"], r.get("measured_at")) for r in merged] == [
        (11, False, None),  # the new row of seed 11's same run replaced the earlier one
        (12, True, "2027-01-14T17:00:00+0000"),  # measured before the new run began: kept
        (12, False, None),
    ], merged
    # Measured after the new run began: the earlier row was of it, and is replaced.
    later = {**earlier, "runs": [old_row], "measured_at": "2027-01-16T00:00:00+0000"}
    assert saturation.merge([new[0]], later) == [new[0]]
    # A new row that names no run (its folder lost its launches file) replaces the seed's.
    unnamed = {"agent": "official", "seed": 12, "pinned": False, "run_started": None}
    merged = saturation.merge([unnamed], earlier)
    assert [(r["seed"], r.get("measured_at")) for r in merged] == [
        (11, "2027-01-14T17:00:00+0000"),
        (12, None),
    ], merged


def test_a_probe_row_is_matched_to_its_task_and_left_out_without_a_run():
    """probed_runs: a row is labelled by the state of its own task (another task's run of
    the same seed, listed first, is not its run), and a row of a seed the figure has no run
    of is not shown as 'this run'."""
    rows = [{"agent": "official", "seed": 12}, {"agent": "official", "seed": 4}]
    probe = {"task": "cartpole_balance", "measured_at": "2027-01-16T00:00:00+0000", "runs": rows}
    states = [
        {"task": "cartpole_swingup", "agent": "official", "seed": 12, "run_started": 1.9e9},
        {"task": "cartpole_balance", "agent": "official", "seed": 12, "run_started": 1.8e9},
    ]
    rows = comparison.probed_runs(probe, states)
    assert [(r["seed"], r["run"]) for r in rows] == [(12, "this run")], rows
    assert comparison.saturation_lines({**probe, "runs": probe["runs"][1:]}, states) == []
    assert saturation.utc_text("2027-01-15T19:30:00-0500") == "2027-01-16 00:30 UTC"


# -- the third preregistration: seeds 20-24 of each agent, the gap rule, GPU runs only -------

THIRD = gpu_learn_check.THIRD


def test_the_third_counts_seeds_20_to_24_with_the_gap_rule_on_the_gpu_only():
    """What the standing order of 2026-12-06 fixed; the CPU machine keeps the second's seeds
    (`learn_check --paper`), explicitly, not as the current one's."""
    assert THIRD.seeds == (20, 21, 22, 23, 24) and THIRD.rule == comparison.GAP
    assert THIRD.machines == ("gpu",) and gpu_learn_check.CURRENT is THIRD
    assert THIRD.registered.startswith("2026-12-06, before any run it counts")
    earlier = {*gpu_learn_check.FIRST.seeds, *gpu_learn_check.SECOND.seeds, 1, 2, 3, 7, 8, 9}
    assert earlier.isdisjoint(THIRD.seeds)  # seeds seen before (figure 16, the probe): none
    assert gpu_learn_check.CPU_CURRENT is gpu_learn_check.SECOND
    assert "cpu" in gpu_learn_check.CPU_CURRENT.machines
    assert gpu_learn_check.SEEDS == gpu_learn_check.SECOND.seeds == (10, 11, 12)
    assert gpu_learn.parse_seeds("20,21,22,23,24") == THIRD.seeds  # `make gpu-learn` runs them


def test_the_third_holds_on_gpu_runs_and_main_exits_with_its_verdict(tmp_path, capsys):
    ours = _result("magi_lp", _seeds(LEARNS, THIRD.seeds))
    official = _result("official", _seeds(LEARNS, THIRD.seeds))
    paths = [_write(tmp_path, "ours", ours), _write(tmp_path, "official", official)]
    code = gpu_learn_check.main([*map(str, paths), "--cpu-results", str(folder_of_none(tmp_path))])
    out = capsys.readouterr().out
    assert code == comparison.EXIT[comparison.HELD], out
    assert "gpu_learn_check (third): held (on gpu): both learned and AUC ratio 1.000" in out
    assert "seeds [20, 21, 22, 23, 24], mean return 380, 520, 960" in out


def test_the_third_judges_learning_by_the_gap_rule(tmp_path, capsys):
    """An official curve from 485 to 950: learned by the gap (742.5), not by the ratio (970)."""
    high_start = [(0, 485.0), (20_000, 520.0), (40_000, 950.0)]
    ours = _result("magi_lp", _seeds(LEARNS, THIRD.seeds))
    official = _result("official", _seeds(high_start, THIRD.seeds))
    code, out = _check(tmp_path, ours, official, capsys, THIRD)
    assert code == comparison.EXIT[comparison.HELD], out
    first = gpu_learn_check.Preregistration("ratio", THIRD.seeds, comparison.RATIO, "", ("gpu",))
    code, out = _check(tmp_path, ours, official, capsys, first)
    assert code == comparison.EXIT[comparison.NOT_HELD] and "official did not learn" in out


def test_one_official_collapse_in_five_seeds_is_survivable_and_not_in_three(tmp_path, capsys):
    """Why five seeds (the docstring): the second's official seeds 10 and 11 reached about 950
    and seed 12 collapsed to 136. Four such and one collapse learn by the gap rule (about 790
    against about 700); two and one, as in the second, do not."""
    good = [(0, 485.0), (20_000, 400.0), (40_000, 950.0)]
    collapsed = [(0, 312.0), (20_000, 136.0), (40_000, 136.0)]
    ours = _result("magi_lp", _seeds(LEARNS, THIRD.seeds))
    official = _result("official", {**{s: good for s in THIRD.seeds[:4]}, 24: collapsed})
    code, out = _check(tmp_path, ours, official, capsys, THIRD)
    assert code == comparison.EXIT[comparison.HELD], out
    assert "official: seeds [20, 21, 22, 23, 24], mean return 450, 347, 787" in out
    second = gpu_learn_check.SECOND
    ours = _result("magi_lp", _seeds(LEARNS, second.seeds))
    official = _result("official", {10: good, 11: good, 12: collapsed})
    code, out = _check(tmp_path, ours, official, capsys, second)
    assert code == comparison.EXIT[comparison.NOT_HELD] and "official did not learn" in out


def test_cpu_runs_of_the_thirds_seeds_are_never_counted_and_the_verdict_says_so(tmp_path):
    kept = tmp_path / "cpu"
    _keep_cpu(kept, "magi_lp", _seeds(LEARNS, THIRD.seeds), ended=1.0e9)  # long before any GPU
    _keep_cpu(kept, "official", _seeds(LEARNS, THIRD.seeds), ended=1.0e9)
    alone = gpu_learn_check.check([], kept, THIRD)
    assert alone["agents"]["comparison"]["verdict"] == comparison.INCOMPLETE
    assert alone["machine"] is None and alone["excluded"] == {"cpu": 10}
    text = "\n".join(gpu_learn_check.lines(alone))
    assert (
        "gpu_learn_check (third): incomplete: runs not finished (0 of its 10 runs; GPU runs "
        "only); 10 run(s) of its seeds on cpu not counted (it counts GPU runs only)" in text
    ), text
    assert "on cpu (never counted: GPU runs only):" in text
    assert (
        gpu_learn_check.main(["--cpu-results", str(kept)]) == comparison.EXIT[comparison.INCOMPLETE]
    )
    # The second would have counted such a set; its seeds are others, so it has none here.
    assert gpu_learn_check.check([], kept, gpu_learn_check.SECOND)["machine"] is None

    # Ten GPU runs, finished after the CPU's: they count, and a frozen ours fails the third
    # although the CPU's set, not counted, held.
    frozen = [(f, LEARNS[0][1]) for f, _ in LEARNS]
    gpu = [
        _write(tmp_path, "ours", _result("magi_lp", _seeds(frozen, THIRD.seeds))),
        _write(tmp_path, "official", _result("official", _seeds(LEARNS, THIRD.seeds))),
    ]
    found = gpu_learn_check.check(gpu, kept, THIRD)
    assert found["machine"] == "gpu"
    assert found["agents"]["comparison"]["verdict"] == comparison.NOT_HELD
    assert found["machines"]["cpu"]["agents"]["comparison"]["verdict"] == comparison.HELD
    line = "\n".join(gpu_learn_check.lines(found))
    assert "(third): not held (on gpu): magi_lp did not learn" in line
    assert "10 run(s) of its seeds on cpu not counted (it counts GPU runs only)" in line


def test_the_committed_results_leave_the_third_incomplete_with_none_of_its_runs(capsys):
    """Now (2026-12-06): no run of seeds 20-24 anywhere; `make gpu-learn-check` exits 3 on the
    third and reports the second's and the first's verdicts beside it."""
    code = gpu_learn_check.main([])
    out = capsys.readouterr().out
    assert code == comparison.EXIT[comparison.INCOMPLETE], out
    assert (
        "gpu_learn_check (third): incomplete: runs not finished (0 of its 10 runs; GPU runs only)"
        in out
    )
    assert "gpu_learn_check (second): not held (on cpu): official did not learn (679 < 714)" in out
    assert "gpu_learn_check (first): incomplete" in out


def test_the_device_calls_written_for_the_third_run_each_of_its_runs_once():
    """benchmarks/README.md's calls for the third: every seed of each agent in exactly one
    session, at 40k frames, each call within the device's 10 minutes."""
    import re
    import shlex

    readme = (gpu_learn_check.common.REPO / "benchmarks" / "README.md").read_text()
    section = readme.split("**The third's ten runs**")[1].split("The second's, for the record")[0]
    calls = [
        line.strip() for line in section.splitlines() if "gpu_learn_device.sh" in line
    ]  # fmt: skip
    sessions: dict[tuple[str, str], int] = {}
    for call in calls:
        minutes = float(re.search(r"MINUTES=([0-9.]+)", call).group(1))
        assert minutes * 60 + 60 <= 600, call  # the script's own timeout, within a call
        args = shlex.split(call.split("gpu_learn_device.sh", 1)[1])
        given = dict(zip(args[1::2], args[2::2], strict=True))
        assert given["--frames"] == str(gpu_learn_check.FRAMES), call
        key = (given["--seeds"], given["--official-seeds"])
        sessions[key] = sessions.get(key, 0) + 1
    ours = [s for key in sessions for s in gpu_learn.parse_seeds(key[0])]
    theirs = [s for key in sessions for s in gpu_learn.parse_seeds(key[1])]
    assert sorted(ours) == sorted(theirs) == list(THIRD.seeds), sessions
    assert all(count <= 2 for count in sessions.values())  # at most two calls a session
