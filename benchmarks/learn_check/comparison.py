"""The comparison, stated so that it can fail: curves (mean and each seed), whether each
agent learned, the AUC ratio with a bootstrap interval over seeds, frames/s.

- Only the preregistered seeds count (`settings.SEEDS`, fixed before the runs): a run of
  another seed is listed and left out, and the verdict waits until every preregistered seed
  of both agents has reached its last evaluation.
- Learned (`learned`), by one of two rules (`RULES`); both agents must have learned, else
  the check fails: two flat curves are not two agents learning alike.
  - `RATIO` (this check's, and the first GPU preregistration's): an agent's mean final return
    is >= `LEARN_FACTOR` x its mean return at frame 0 and >= `LEARN_MIN[task]`. It cannot
    hold where the frame-0 mean is above half the most an episode returns (1000 on the
    control suite): on cartpole_balance at 84x84 an untrained policy scored 297 to 643
    (seeds 1-6 of ours, 1 and 4 and 7-9 of the official agent).
  - `GAP` (the GPU comparison's second preregistration): the mean final return has closed at
    least `GAP_SHARE` of the gap between the frame-0 mean and that most, and is >=
    `LEARN_MIN[task]`. The same as `RATIO` at a frame-0 mean of 333; reachable from any
    start; a learner that never updates closes none of it.
- AUC is a run's mean evaluation return over the evaluation points after frame 0 (frame 0 is
  the untrained policy; on cartpole_balance it scores about 350, a learner that never
  updates would bank it). The ratio is our mean AUC over the official mean AUC; its 95%
  interval resamples each agent's seeds with replacement. Goal: ratio >= `GOAL_RATIO`.
- The verdict is "held", "not held" or "incomplete"; `python -m benchmarks.learn_check`
  exits 0, 1 or 3 for them (`EXIT`).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import functools
import importlib.util
import itertools
import json
import math
import random
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check.settings import AGENTS, PREREGISTERED_AT, SEEDS, Settings

JSON = common.REPO / "benchmarks" / "learn_check.json"
CSV = common.REPO / "benchmarks" / "learn_check_curves.csv"
PNG = common.REPO / "benchmarks" / "learn_check_curves.png"
GOAL_RATIO = 0.9
LEARN_FACTOR = 2.0
GAP_SHARE = 0.5
RATIO, GAP = "ratio", "gap"
RULES = (RATIO, GAP)
TOP_RETURN = 1000.0
"""The most a control-suite episode of 1000 frames returns (a reward of at most 1 a frame)."""
LEARN_MIN = {"cartpole_balance": 700.0}
"""A final mean below this has not learned the task (cartpole_balance: the pole held for
most of the episode; the untrained policy scores about 350)."""
BOOTSTRAP_DRAWS = 10_000
HELD, NOT_HELD, INCOMPLETE = "held", "not held", "incomplete"
EXIT = {HELD: 0, NOT_HELD: 1, INCOMPLETE: 3}


def load_runs(kept: Path) -> list[dict]:
    """Every kept result under `kept` (agent/task/seed_N.json; failure records excluded)."""
    return [json.loads(path.read_text()) for path in sorted(Path(kept).glob("*/*/seed_*.json"))]


def _points(settings: Settings) -> list[int]:
    """Every evaluation point, frame 0 first (the table's columns)."""
    return list(range(0, settings.frames + 1, settings.eval_every_frames))


def _curve(run: dict, points: list[int]) -> list[float] | None:
    """The run's return at each evaluation point; None when one is missing."""
    by_frame = {int(frame): float(value) for frame, value in run["evaluations"]}
    if any(point not in by_frame for point in points):
        return None
    return [by_frame[point] for point in points]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def auc(curve: list[float]) -> float:
    """Mean return over the evaluation points after frame 0 (`curve[0]` is frame 0)."""
    return _mean(curve[1:])


def interval_caveat(seeds: int) -> str:
    """What a bootstrap over `seeds` seeds can show: each agent's resample is one of
    C(2n-1, n) multisets of its seeds, so with few seeds the interval is their spread."""
    sets = math.comb(2 * seeds - 1, seeds)
    return (
        f"with {seeds} seeds an agent's resample is one of {sets} multisets of its seeds: the "
        "interval shows these seeds' spread, not what more seeds would give"
    )


def bootstrap_ratio(ours: list[float], theirs: list[float], seed: int = 0) -> tuple[float, float]:
    """95% interval of mean(ours) / mean(theirs), each agent's seeds resampled."""
    rng = random.Random(seed)
    ratios = sorted(
        _mean(rng.choices(ours, k=len(ours))) / _mean(rng.choices(theirs, k=len(theirs)))
        for _ in range(BOOTSTRAP_DRAWS)
    )
    return ratios[int(0.025 * BOOTSTRAP_DRAWS)], ratios[int(0.975 * BOOTSTRAP_DRAWS) - 1]


def same_settings(saved: dict, settings: Settings) -> bool:
    """Whether a run's saved settings are `settings` (a key it predates: at its default;
    how often ours saves a checkpoint does not change what it learns, and is not compared)."""
    try:
        found = Settings(**saved)
    except TypeError:  # a key this version does not know
        return False
    return dataclasses.replace(found, checkpoint_minutes=settings.checkpoint_minutes) == settings


def learned(
    task: str, start_mean: float, final_mean: float, episode_frames: int = 0, rule: str = RATIO
) -> dict:
    """Whether an agent learned, by `rule` (`RULES`): RATIO, final >= LEARN_FACTOR x start;
    GAP, final >= start + GAP_SHARE x (the most a return can be - start); both also final >=
    LEARN_MIN[task]. The floor and the most scale with the episode's length where a check cuts
    it short (`episode_frames`, 0 for the task's 1000). `reachable` says whether any return
    could meet it."""
    scale = (episode_frames or 1000) / 1000
    floor = LEARN_MIN.get(task, 0.0) * scale
    top = TOP_RETURN * scale
    if rule == RATIO:
        need = max(LEARN_FACTOR * start_mean, floor)
        text = f"final mean >= {LEARN_FACTOR:g} x frame-0 mean and >= {floor:g}"
    elif rule == GAP:
        need = max(start_mean + GAP_SHARE * (top - start_mean), floor)
        text = (
            f"final mean closes >= {GAP_SHARE:g} of the gap from the frame-0 mean to {top:g} "
            f"and is >= {floor:g}"
        )
    else:
        raise ValueError(f"learned: rule must be one of {RULES}, not {rule!r}")
    return {
        "learned": final_mean >= need,
        "start_mean": start_mean,
        "final_mean": final_mean,
        "needed": need,
        "reachable": need <= top,
        "rule": text,
    }


def frozen(run: dict) -> dict:
    """A learner that never updates: the run's frame-0 return carried to every point (the
    negative control the comparison must fail)."""
    evaluations = sorted((int(f), float(v)) for f, v in run["evaluations"])
    start = evaluations[0][1]
    return {**run, "evaluations": [(frame, start) for frame, _ in evaluations]}


def compare(
    runs: list[dict], settings: Settings, seeds: tuple[int, ...] = SEEDS, rule: str = RATIO
) -> dict:
    """Per task: each agent's curves, frames/s and learning (by `rule`), and the AUC
    comparison with its verdict (over the preregistered `seeds` only)."""
    points = _points(settings)
    tasks: dict[str, dict] = {}
    for run in runs:
        if not same_settings(run.get("settings", {}), settings):
            continue  # a run at other settings is not part of this comparison
        agents = tasks.setdefault(run["task"], {})
        curve = _curve(run, points)
        if run["seed"] not in seeds:
            agents.setdefault("not_counted", []).append(
                {"agent": run["agent"], "seed": run["seed"], "why": "not a preregistered seed"}
            )
            continue
        if curve is None:
            continue
        agent = agents.setdefault(
            run["agent"],
            {
                "seeds": [],
                "curves": [],
                "fps": [],
                "cpu_per_1000": [],
                "versions": {},
                "runs": [],
            },
        )
        for package, version in run["versions"].items():
            # Every seed's, not only the first's: "jax 0.11.2 / 0.11.3" where seeds differ.
            seen = agent["versions"].get(package, "").split(" / ")
            if str(version) not in seen:
                agent["versions"][package] = " / ".join([*filter(None, seen), str(version)])
        agent["seeds"].append(run["seed"])
        agent["curves"].append(curve)
        agent["fps"].append(run.get("train_frames_per_s"))
        agent["cpu_per_1000"].append(run.get("cpu_seconds_per_1000_frames"))
        agent["runs"].append(provenance(run))
    for task, agents in tasks.items():
        for name in AGENTS:
            agent = agents.get(name)
            if agent is None:
                continue
            columns = list(zip(*agent["curves"], strict=True))
            agent["mean"] = [_mean(list(c)) for c in columns]
            agent["min"] = [min(c) for c in columns]
            agent["max"] = [max(c) for c in columns]
            agent["auc"] = [auc(curve) for curve in agent["curves"]]
            fps = [f for f in agent["fps"] if f]
            agent["train_frames_per_s"] = _mean(fps) if fps else None
            cpu = [c for c in agent["cpu_per_1000"] if c]
            agent["cpu_seconds_per_1000_frames"] = _mean(cpu) if cpu else None
            agent["learning"] = learned(
                task, agent["mean"][0], agent["mean"][-1], settings.episode_frames, rule
            )
            agent["missing_seeds"] = sorted(set(seeds) - set(agent["seeds"]))
        agents["comparison"] = verdict(agents, seeds)
        tasks[task] = agents
    return {"points": points, "seeds": list(seeds), "tasks": tasks}


def verdict(agents: dict, seeds: tuple[int, ...]) -> dict:
    """Held, not held or incomplete, and why; the ratio and interval once both agents have
    every preregistered seed."""
    missing = {
        name: sorted(set(seeds) - set(agents[name]["seeds"])) if name in agents else list(seeds)
        for name in AGENTS
    }
    if any(missing.values()):
        return {"verdict": INCOMPLETE, "missing_seeds": missing, "why": "runs not finished"}
    ours, theirs = agents["magi_lp"], agents["official"]
    low, high = bootstrap_ratio(ours["auc"], theirs["auc"])
    ratio = _mean(ours["auc"]) / _mean(theirs["auc"])
    why = [_not_learned(name, agents[name]["learning"]) for name in AGENTS
           if not agents[name]["learning"]["learned"]]  # fmt: skip
    if ratio < GOAL_RATIO:
        why.append(f"AUC ratio {ratio:.3f} < {GOAL_RATIO}")
    final = ours["mean"][-1]
    return {
        "verdict": NOT_HELD if why else HELD,
        "why": "; ".join(why) or f"both learned and AUC ratio {ratio:.3f} >= {GOAL_RATIO}",
        "auc_ratio": ratio,
        "auc_ratio_95": [low, high],
        "final_mean": final,
        "official_final_range": [theirs["min"][-1], theirs["max"][-1]],
        "final_inside_official_range": theirs["min"][-1] <= final <= theirs["max"][-1],
        "seeds": [len(ours["seeds"]), len(theirs["seeds"])],
        "fps_ratio": (
            ours["train_frames_per_s"] / theirs["train_frames_per_s"]
            if ours["train_frames_per_s"] and theirs["train_frames_per_s"]
            else None
        ),
        # CPU seconds per training frame, official / ours: > 1 when ours costs less.
        "cpu_ratio": (
            theirs["cpu_seconds_per_1000_frames"] / ours["cpu_seconds_per_1000_frames"]
            if ours["cpu_seconds_per_1000_frames"] and theirs["cpu_seconds_per_1000_frames"]
            else None
        ),
    }


def beyond_reach(learning: dict) -> str:
    """ "" where a return could meet the learning rule (`learned`); else what it needs, in
    words."""
    if learning.get("reachable", True):
        return ""
    return f"it needs {learning['needed']:.0f}, more than any return: cannot hold"


def _not_learned(name: str, learning: dict) -> str:
    """Why an agent did not learn, in words: the mean it reached against the one it needed,
    and, where no return could reach that, so."""
    text = f"{name} did not learn ({learning['final_mean']:.0f} < {learning['needed']:.0f}"
    beyond = beyond_reach(learning)
    return text + (f"; {beyond})" if beyond else ")")


def provenance(run: dict) -> dict:
    """What made one kept run: its launches' commits and code, the machine, wall time."""
    attempts = run.get("attempts", [])
    commits = sorted({a.get("commit", "?")[:12] for a in attempts})
    call = str(run.get("commit") or "")  # a gpu_learn.json's run: its call's commit
    if not commits and call:
        commits = [call]
    if attempts:
        dirty = any(a.get("dirty") for a in attempts)
    else:  # a GPU call's, from its commit ("-dirty": `make gpu-learn-wheels` writes .commit so)
        dirty = call.endswith("-dirty") if call else None
    return {
        "seed": run["seed"],
        "commits": commits or ["not recorded"],
        "dirty": dirty,
        "machine": run.get("machine"),
        # The CPUs its launches ran on (a launch records its own since 2026-11-29): a VM's
        # model name is generic, and two hosts behind it can give other last bits.
        "cpu_ids": sorted({str(a["machine"].get("cpu_id")) for a in attempts if a.get("machine")}),
        "wall_s": run.get("wall_s"),
        "launches": len(attempts) or run.get("calls", 0),  # a GPU run's: its device calls
        # A CPU run's launches' cores; a GPU call's run lists its own (a kept CPU result's
        # "cores" is how many it had: 1).
        "cores": _cores(attempts)
        or (list(run["cores"]) if isinstance(run.get("cores"), list) else []),
        # HEAD's agent, replay and runner code made every launch: otherwise marked in the figure;
        # None where it cannot be told, or the code is not ours (the official agent's is
        # pinned by hashes: official.check_checkout).
        "head_code": (head_code := _head_code_of(run, attempts, dirty)),
        # Where HEAD's code is not what made it: the files of CODE_PATHS that HEAD changed
        # since the run's commits (uncommitted changes of a launch named by their folder).
        "differs": _differs_from_head(run, attempts) if head_code is False else [],
        # Files of CODE_PATHS that changed between the run's own launches (a run resumed
        # across commits is made by more than one version of the code).
        # (Not the official agent's: its code is pinned by hashes, CODE_PATHS are ours.)
        "changed_between_launches": []
        if run.get("agent") == "official"
        else _changed_between_launches(attempts),
    }


def _head_code_of(run: dict, attempts: list[dict], dirty: bool | None) -> bool | None:
    """Whether HEAD's agent, replay and runner code made `run`: from its launches' recorded
    code (a CPU run's), or from the commit of the call that made it (a GPU call's, whose copied
    tree has no .git: its code is that commit's, looked up here; None where the call's tree
    was dirty or this clone lacks the commit)."""
    if run.get("agent") == "official":
        return None
    if attempts:
        return all(a.get("code") == _head_code() for a in attempts)
    commit = str(run.get("commit") or "")
    if not commit or dirty:
        return None
    from benchmarks.learn_check.runs import CODE_PATHS, _git

    then = {path: _git("rev-parse", f"{commit}:{path}") for path in CODE_PATHS}
    return None if not all(then.values()) else then == _head_code()


def _differs_from_head(run: dict, attempts: list[dict]) -> list[str]:
    """The files under CODE_PATHS in which this tree differs from the code that made `run`:
    what HEAD changed since the run's commits and what is changed here and not committed (a
    tree edited while the figure is made is not HEAD's code either)."""
    from benchmarks.learn_check.runs import CODE_PATHS, _git

    head = _head_code()
    commits = (
        {str(a.get("commit") or "") for a in attempts if a.get("code") != head}
        if attempts
        else {str(run.get("commit") or "")}  # a GPU call's run: its call's commit
    )
    found = {
        name
        for commit in commits - {""}
        for name in _git("diff", "--name-only", commit, "--", *CODE_PATHS).split()
    }
    if commits - {""}:  # new files here, not yet added (code_state counts them as changes)
        found |= set(_git("ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS).split())
    dirty = {
        f"{path} (uncommitted changes)"
        for a in attempts
        for path, tree in (a.get("code") or {}).items()
        if str(tree).startswith("dirty:")
    }
    return sorted(found | dirty)


def _changed_between_launches(attempts: list[dict]) -> list[str]:
    """The files under CODE_PATHS that differ between the commits of consecutive launches
    whose recorded code differs (uncommitted changes named by their folder)."""
    from benchmarks.learn_check.runs import CODE_PATHS, _git

    found: set[str] = set()
    recorded = [a for a in attempts if a.get("code")]
    for before, after in itertools.pairwise(recorded):
        if before["code"] == after["code"]:
            continue
        old, new = str(before.get("commit") or ""), str(after.get("commit") or "")
        named = (
            _git("diff", "--name-only", old, new, "--", *CODE_PATHS).split()
            if old and new and old != new
            else []
        )
        found |= set(named)
        if not named:  # a commit this clone lacks: the folders whose recorded code differs
            found |= {
                f"{path} (its recorded tree)"
                for path in CODE_PATHS
                if before["code"].get(path) != after["code"].get(path)
                and "dirty:" not in f"{before['code'].get(path)}{after['code'].get(path)}"
            }
        found |= {
            f"{path} (uncommitted changes)"
            for path in CODE_PATHS
            if before["code"].get(path) != after["code"].get(path)
            and "dirty:" in f"{before['code'].get(path)}{after['code'].get(path)}"
        }
    return sorted(found)


def _saturation() -> dict | None:
    """The kept runs' actors probed by `saturation.py`, when it has run."""
    from benchmarks.learn_check.saturation import SATURATION

    return json.loads(SATURATION.read_text()) if SATURATION.is_file() else None


def probed_runs(probe: dict, states: list[dict]) -> list[dict]:
    """The probe's rows of the figure's runs (`progress`'s states: task, agent and seed),
    each with the run it is of (`run`): the seed's run counted or going on now, or an earlier
    one lost with its machine. A row of a lost run is not this seed's run's state, and the
    figure must not say it is; a row of a seed the figure has no run of is left out."""
    from benchmarks.learn_check.saturation import same_run, utc_text

    rows = []
    for row in probe["runs"]:
        key = (probe.get("task"), row["agent"], row["seed"])
        state = next((s for s in states if (s["task"], s["agent"], s["seed"]) == key), None)
        if state is None:
            continue
        measured = row.get("measured_at") or probe.get("measured_at", "")
        started = state.get("run_started")
        lost = [r for r in state.get("lost", []) if same_run(row, r.get("run_started"), measured)]
        if started is not None and same_run(row, started, measured):
            run = "this run"
        elif lost:  # of lost runs started before the probe, the last (rows name none)
            run = f"earlier run (started {_stamp_text(lost[-1]['started'])}), lost"
        else:  # no start to tell by: a seed not started, or a figure written before states had it
            run = "an earlier run" if started is not None else "-"
        if measured and measured != probe.get("measured_at"):  # an earlier probe's row
            run += f"; probed {utc_text(measured)}"
        rows.append({**row, "run": run})
    return rows


def saturation_lines(probe: dict, states: list[dict] | None = None) -> list[str]:
    """Why a run did not learn, when its actor is pinned (figures 13 and 17); `states` (the
    figure's `progress`; none for a tiny figure) tell which run each row is of."""
    from benchmarks.learn_check.saturation import table, why_table

    rows = probed_runs(probe, states) if states else probe["runs"]
    if not rows:
        return []
    why = why_table(rows)
    if why:
        why = [
            "Why an actor stays where it is: the median |x| of the tanh(x) that is its mean "
            "action (past about 5, tanh's slope is under 1e-4: the policy gradient cannot move "
            "it back), and the share of observations whose critic, min(Q1, Q2), rises toward "
            "the end the mean action is at (dQ/da of its sign: the gradient drives it further "
            "out).",
            "",
            *why,
            "",
        ]
    return [
        "Each run's actor at its newest state when probed (`python -m "
        f"benchmarks.learn_check.saturation`; the latest probe {probe.get('measured_at', '?')}, "
        f"commit {probe.get('commit', '?')}): its mean action "
        f"on the same {probe['observations']} rendered frame stacks of {probe['task']} "
        "(random actions, seed 0). Pinned: every one at the same end of [-1, 1] "
        f"(|a| > {probe['saturated_above']}), where tanh passes the actor no gradient and the "
        "cart drives to the wall (a return of about 136); a learned bang-bang controller is "
        "saturated too, but at both ends.",
        "",
        *table(rows),
        "",
        *why,
    ]


def _cores(attempts: list[dict]) -> list[int]:
    """The cores a run's launches were pinned to."""
    return sorted({a["core"] for a in attempts if a.get("core") is not None})


@functools.cache
def _head_code() -> dict:
    from benchmarks.learn_check.runs import code_state

    return code_state()["code"]


def _write_csv(path: Path, comparison: dict) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["task", "agent", "curve", "frame", "return"])
        for task, agents in sorted(comparison["tasks"].items()):
            for name in AGENTS:
                agent = agents.get(name)
                if agent is None:
                    continue
                curves = [("mean", agent["mean"]), ("min", agent["min"]), ("max", agent["max"])]
                seeds = zip(agent["seeds"], agent["curves"], strict=True)
                curves += [(f"seed_{seed}", curve) for seed, curve in seeds]
                for label, values in curves:
                    for frame, value in zip(comparison["points"], values, strict=True):
                        writer.writerow([task, name, label, frame, round(value, 2)])


def _plot(path: Path, comparison: dict, settings: Settings) -> str:
    """The curves as a PNG; a note where matplotlib is missing (the CSV holds them)."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no PNG (matplotlib is not installed here)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted(comparison["tasks"])
    figure, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.5), squeeze=False)
    x = comparison["points"]
    for axis, task in zip(axes[0], tasks, strict=True):
        for name, color in zip(AGENTS, ("C0", "C1"), strict=True):
            agent = comparison["tasks"][task].get(name)
            if agent is None:
                continue
            for curve in agent["curves"]:
                axis.plot(x, curve, color=color, alpha=0.25, linewidth=1)
            label = f"{name} (mean of {len(agent['seeds'])} seeds)"
            axis.plot(x, agent["mean"], "o-", color=color, label=label, linewidth=2)
        axis.set_title(task)
        axis.set_xlabel("frames")
        axis.set_ylabel("evaluation return (10 episodes)")
        axis.legend(fontsize=8)
    figure.suptitle(f"DrQ-v2, one CPU core each\n{settings.reduced()}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def progress(
    out: Path,
    settings: Settings,
    tasks: tuple[str, ...],
    kept: Path,
    seeds: tuple[int, ...] = SEEDS,
) -> list[dict]:
    """Each preregistered run's state: done (kept), in progress (its evaluations so far and
    launches, from its folder under `out`), or not started; failed launches counted."""
    from benchmarks.learn_check import runs
    from benchmarks.learn_check.settings import (
        failed_record,
        kept_result,
        lost_record,
        progress_record,
        run_dir,
    )

    states = []
    for task in tasks:
        for seed in seeds:
            for agent in AGENTS:
                folder = run_dir(out, agent, task, seed)
                failed = sorted(failed_record(kept, agent, task, seed, 0).parent.glob(
                    f"seed_{seed}_attempt_*.json"
                ), key=lambda path: int(path.stem.rsplit("_", 1)[-1]))  # fmt: skip
                lost = sorted(lost_record(kept, agent, task, seed, "").parent.glob(
                    f"seed_{seed}_started_*.json"
                ))  # fmt: skip
                state = {
                    "agent": agent,
                    "task": task,
                    "seed": seed,
                    "failed_launches": len(failed),
                    "lost_runs": len(lost),
                    # What each was, for the figure (`history_table`): a seed that ran again
                    # after a machine was lost, or a launch that failed, stays in sight.
                    "failed": [_failed_launch(path) for path in failed],
                    "lost": [_lost_run(path) for path in lost],
                }
                path = kept_result(kept, agent, task, seed)
                if path.is_file():
                    done = json.loads(path.read_text())
                    if same_settings(done.get("settings", {}), settings):
                        first = (done.get("attempts") or [{}])[0].get("started")
                        state.update(
                            state="done", evaluations=done["evaluations"], run_started=first
                        )
                        states.append(state)
                        continue
                attempts = runs.read_attempts(folder)
                record = progress_record(kept, agent, task, seed)
                kept_progress = None
                if not attempts and record.is_file():  # its folder is on another machine, or lost
                    kept_progress = json.loads(record.read_text())
                    attempts = kept_progress.get("attempts", [])
                if not attempts:
                    states.append({**state, "state": "not started", "evaluations": []})
                    continue
                if kept_progress is not None:
                    found = {"evaluations": kept_progress.get("evaluations", [])}
                else:
                    reader = runs.ours_result if agent == "magi_lp" else runs.official_result
                    launches = [a["started"] for a in attempts]
                    try:
                        found = reader(settings, folder / "work", launches)
                    except (OSError, ValueError, KeyError):
                        found = {"evaluations": []}
                states.append(
                    {
                        **state,
                        "state": "in progress"
                        if kept_progress is None
                        else "no folder here (its progress record's)",
                        "evaluations": found["evaluations"],
                        "launches": len(attempts),
                        "cores": _cores(attempts),
                        "last_launch": attempts[-1].get("started_at"),
                        "run_started": attempts[0].get("started"),
                        "commits": sorted({a.get("commit", "?")[:12] for a in attempts}),
                    }
                )
    return states


def _failed_launch(path: Path) -> dict:
    """A failed launch's record in brief: its attempt, exit code and its log's last line."""
    record = json.loads(path.read_text())
    tail = [line.strip() for line in record.get("log_tail") or [] if line.strip()]
    return {
        "attempt": int(path.stem.rsplit("_attempt_", 1)[-1]),
        "exit_code": record.get("exit_code"),
        "evaluations": record.get("evaluations", []),
        "last_line": tail[-1] if tail else "",
    }


def _lost_run(path: Path) -> dict:
    """An earlier run of a seed, lost with its machine, in brief: what is known of it."""
    record = json.loads(path.read_text())
    return {
        "started": path.stem.rsplit("_started_", 1)[-1],
        "run_started": (record.get("attempts") or [{}])[0].get("started"),
        "launches": len(record.get("attempts", [])),
        "evaluations": record.get("evaluations", []),
        "at_stop": record.get("at_stop", ""),
    }


SUPERSEDED = "superseded/32px_batch32_50k"
"""The kept results of the first learn check (32x32, batch 32, 50k frames), superseded."""


def superseded(kept: Path) -> dict | None:
    """The first learn check's runs under today's rules: neither agent learned, and a learner
    that never updates scored a ratio above 1 by the rule they were judged by."""
    runs = load_runs(Path(kept) / SUPERSEDED)
    if not runs:
        return None
    old = Settings(**{**runs[0]["settings"], "episode_frames": 0})
    points = _points(old)
    curves: dict[str, list[list[float]]] = {}
    for run in runs:
        curve = _curve(run, points)
        if curve is not None:
            curves.setdefault(run["agent"], []).append(curve)
    if set(curves) != set(AGENTS):
        return None
    found: dict = {"settings": vars(old), "reduced": old.reduced(), "points": points}
    for name, agent_curves in curves.items():
        columns = list(zip(*agent_curves, strict=True))
        means = [_mean(list(c)) for c in columns]
        found[name] = {
            "seeds": len(agent_curves),
            "mean": means,
            "learning": learned("cartpole_balance", means[0], means[-1]),
        }

    def ratio(ours: list[list[float]], theirs: list[list[float]], area) -> dict:
        a, b = [area(c) for c in ours], [area(c) for c in theirs]
        low, high = bootstrap_ratio(a, b)
        return {"ratio": _mean(a) / _mean(b), "ratio_95": [low, high]}

    with_zero = _mean  # the first check's AUC: every point, frame 0 included
    frozen_ours = [[c[0]] * len(c) for c in curves["magi_lp"]]
    found["old_rule"] = ratio(curves["magi_lp"], curves["official"], with_zero)
    found["old_rule_frozen"] = ratio(frozen_ours, curves["official"], with_zero)
    found["new_rule"] = ratio(curves["magi_lp"], curves["official"], auc)
    return found


def write(
    kept: Path,
    settings: Settings,
    tiny: bool,
    out: Path,
    tasks: tuple[str, ...] = ("cartpole_balance",),
) -> dict:
    """Compares the results kept in `kept`; writes the JSON, CSV and PNG (under `out` when
    tiny, else benchmarks/learn_check.json, _curves.csv, _curves.png). Returns the result
    (its `verdict`: held, not held or incomplete, and `line`, a summary)."""
    comparison = compare(load_runs(kept), settings)
    json_path, csv_path, png_path = (
        (Path(out) / "learn_check.json", Path(out) / "curves.csv", Path(out) / "curves.png")
        if tiny
        else (JSON, CSV, PNG)
    )
    _write_csv(csv_path, comparison)
    plot = _plot(png_path, comparison, settings) if comparison["tasks"] else "no PNG (no runs)"
    verdicts = [
        comparison["tasks"].get(task, {}).get("comparison", {"verdict": INCOMPLETE})
        for task in tasks
    ]
    names = [v["verdict"] for v in verdicts]
    overall = NOT_HELD if NOT_HELD in names else INCOMPLETE if INCOMPLETE in names else HELD
    parts = []
    for task, found in zip(tasks, verdicts, strict=True):
        if "auc_ratio" in found:
            low, high = found["auc_ratio_95"]
            parts.append(
                f"{task}: {found['verdict']}: AUC ratio {found['auc_ratio']:.3f} "
                f"[{low:.2f}, {high:.2f}] over {found['seeds'][0]} / {found['seeds'][1]} "
                f"seeds; {found['why']}"
            )
        else:
            parts.append(f"{task}: {found['verdict']} ({found.get('why', 'no runs')})")
    result = {
        "status": "ok",
        "verdict": overall,
        "line": "; ".join(parts),
        "measured_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": common.git_commit(),
        "machine": common.machine(),
        "settings": vars(settings),
        "reduced": settings.reduced(),
        "goal_ratio": GOAL_RATIO,
        "learn_rule": f"final mean >= {LEARN_FACTOR:g} x frame-0 mean and >= "
        + ", ".join(f"{floor:g} ({task})" for task, floor in LEARN_MIN.items()),
        "preregistered": {
            "seeds": list(SEEDS),
            "tasks": list(tasks),
            "settings_commit": _settings_commit(),
        },
        "progress": [] if tiny else progress(Path(out), settings, tasks, kept),
        "superseded": None if tiny else superseded(kept),
        "saturation": None if tiny else _saturation(),
        **comparison,
    }
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = [str(json_path), str(csv_path), plot]
    return result


def _settings_commit() -> str:
    """The preregistration's commit and date (the file has changed since in other parts)."""
    from benchmarks.learn_check.runs import _git

    return _git("log", "-1", "--format=%h %cs", PREREGISTERED_AT) or PREREGISTERED_AT


# -- the figure on BENCHMARKS.md (benchmarks.run reads benchmarks/learn_check.json) --------

TITLE = "Learning check: this DrQ-v2 beside the official one, same settings, one CPU core each"
NOT_MEASURED = "not measured: `make learn-check` has not written benchmarks/learn_check.json"


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    if "verdict" not in result:  # written before the preregistered check (issue 35)
        return (
            "superseded: the first check's entry (32x32, batch 32): neither agent learned",
            "make learn-check writes the current one",
            "",
        )
    seeds = len(result.get("preregistered", {}).get("seeds", []))
    for task, agents in sorted(result["tasks"].items()):
        found = agents.get("comparison", {})
        if "auc_ratio" in found:
            low, high = found["auc_ratio_95"]
            return (
                f"{task}: {found['verdict']}: AUC ratio {found['auc_ratio']:.3f} "
                f"(95% [{low:.2f}, {high:.2f}])",
                f"official DrQ-v2, {found['seeds'][0]} / {found['seeds'][1]} preregistered "
                f"seeds, {result['reduced']}",
                f"goal >= {result['goal_ratio']}, both agents learned",
            )
    done = sum(1 for p in result.get("progress", []) if p["state"] == "done")
    total = len(result.get("progress", []))
    return (
        f"in progress: {done} / {total} runs done (the 32x32 / batch 32 result is superseded: "
        "neither agent learned there)",
        f"official DrQ-v2, {seeds} preregistered seeds each, {result['reduced']}",
        f"goal >= {result['goal_ratio']}, both agents learned",
    )


def _cells(values: list[float]) -> str:
    return " | ".join(f"{v:.0f}" for v in values)


def agent_table(agents: dict, points: list[int]) -> list[str]:
    """Each agent's curve (mean, lowest-highest seed), AUC, learning, frames/s, versions."""
    header = "| agent | seeds | " + " | ".join(f"{p // 1000}k" for p in points)
    lines = [header + " | AUC | learned | train frames/s | CPU s / 1,000 train frames | versions |"]
    lines += ["| --- " * (len(points) + 7) + "|"]
    for name in AGENTS:
        agent = agents.get(name)
        if agent is None:
            continue
        cells = [
            f"{m:.0f} ({lo:.0f}-{hi:.0f})"
            for m, lo, hi in zip(agent["mean"], agent["min"], agent["max"], strict=True)
        ]
        fps = agent["train_frames_per_s"]
        fps_text = f"{fps:.2f}" if fps else "-"
        cpu = agent.get("cpu_seconds_per_1000_frames")
        cpu_text = f"{cpu:.1f}" if cpu else "-"
        versions = ", ".join(f"{k} {v}" for k, v in sorted(agent["versions"].items()))
        learning = "yes" if agent["learning"]["learned"] else "**no**"
        beyond = beyond_reach(agent["learning"])
        if beyond:
            learning += f" ({beyond})"
        lines.append(
            f"| {name} | {len(agent['seeds'])} | " + " | ".join(cells)
            + f" | {_mean(agent['auc']):.0f} | {learning} | {fps_text} | {cpu_text} "
            + f"| {versions} |"
        )  # fmt: skip
    return lines


def provenance_table(agents: dict) -> list[str]:
    """Each counted run's commits, launches, wall time, code, machine and cores."""
    lines = ["| agent | seed | commits | dirty | launches | wall time | code | machine | core |"]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in AGENTS:
        for run in agents.get(name, {}).get("runs", []):
            code = {True: "HEAD's", False: "**not HEAD's agent/replay/runner code**"}.get(
                run["head_code"], "official, pinned" if name == "official" else "not recorded"
            )
            if run.get("differs"):
                code += f" (the code here differs in {_listed(run['differs'])})"
            if run.get("changed_between_launches"):
                code += (
                    "; its launches ran different code: "
                    f"{_listed(run['changed_between_launches'])} changed between them"
                )
            machine = run.get("machine") or {}
            where = f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
            if run.get("cpu_ids"):
                where += f" ({'; '.join(run['cpu_ids'])})"
            if machine.get("device"):
                where = f"{machine['device']}; {where}"
            lines.append(
                f"| {name} | {run['seed']} | {', '.join(run['commits'])} | {run['dirty']} "
                f"| {run['launches']} | {(run['wall_s'] or 0) / 3600:.2f} h | {code} | "
                f"{where} | {', '.join(map(str, run.get('cores') or [])) or '?'} |"
            )
    return lines


def _listed(names: list[str], most: int = 8) -> str:
    """Up to `most` names, then how many more."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


def evaluations_text(evaluations: list) -> str:
    """A run's evaluations so far in words ("0k: 621, 20k: 540"); "" when none."""
    return ", ".join(f"{int(f) // 1000}k: {v:.0f}" for f, v in evaluations)


def progress_table(progress: list[dict]) -> list[str]:
    """The runs not finished yet: state, evaluations so far, launches (none: no lines)."""
    running = [p for p in progress if p["state"] != "done"]
    if not running:
        return []
    lines = ["Runs not finished yet (each resumes from its checkpoint on the next call):", ""]
    lines += ["| agent | seed | state | evaluations so far (frame: return) | launches |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for p in running:
        evals = evaluations_text(p["evaluations"]) or "-"
        failed = f" ({p['failed_launches']} failed)" if p["failed_launches"] else ""
        if p.get("lost_runs"):
            failed += f" ({p['lost_runs']} earlier run(s) of this seed lost with a machine)"
        lines.append(
            f"| {p['agent']} | {p['seed']} | {p['state']} | {evals} | "
            f"{p.get('launches', 0)}{failed} |"
        )
    return [*lines, ""]


def _stamp_text(stamp: str) -> str:
    """A lost record's name stamp (`settings.lost_record`: the start's ISO time, letters and
    digits only, e.g. 20261128T182811...; or a date alone) as 2026-11-28 18:28."""
    if len(stamp) < 8 or not stamp[:8].isdigit():
        return stamp
    text = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}"
    if len(stamp) >= 13 and stamp[8] == "T" and stamp[9:13].isdigit():
        text += f" {stamp[9:11]}:{stamp[11:13]}"
        offset = stamp[15:]  # after HHMMSS: the UTC offset's digits (its sign dropped)
        text += " UTC" if offset in ("", "0000") else f" (UTC offset {offset[:2]}:{offset[2:]})"
    return text


def history_table(progress: list[dict]) -> list[str]:
    """Every earlier run of a preregistered seed that was lost with its machine (the seed ran
    again from frame 0), and every failed launch (the run resumed from its last checkpoint),
    finished runs' included (none: no lines)."""
    rows = []
    for p in progress:
        for lost in p.get("lost", []):
            evals = evaluations_text(lost["evaluations"]) or "-"
            at_stop = f"; at its last stop: {lost['at_stop']}" if lost.get("at_stop") else ""
            started = _stamp_text(lost["started"])
            rows.append(
                f"| {p['agent']} | {p['seed']} | earlier run (started {started}), "
                f"lost with its machine; the seed ran again from frame 0{at_stop} | {evals} |"
            )
        for failed in p.get("failed", []):
            evals = evaluations_text(failed["evaluations"]) or "-"
            last = failed["last_line"].replace("|", "/")
            last = last if len(last) <= 160 else last[:157] + "..."
            rows.append(
                f"| {p['agent']} | {p['seed']} | launch {failed['attempt']} failed (exit "
                f"{failed['exit_code']}; resumed from its last checkpoint): `{last}` | {evals} |"
            )
    if not rows:
        return []
    lines = ["Earlier runs and failed launches of these seeds (kept, not counted):", ""]
    lines += ["| agent | seed | what | evaluations (frame: return) |", "| --- | --- | --- | --- |"]
    return [*lines, *rows, ""]


def report(result: dict) -> str:
    """The figure's section: the preregistered check, its state or verdict, the runs'
    provenance, and the superseded first check."""
    if "verdict" not in result:
        return "**" + "; ".join(summary(result)[:2]) + ".**"
    settings = result["settings"]
    lines = [
        f"Both agents at the same settings ({result['reduced']}; everything else the paper's), "
        "one process pinned to one core each (the official agent's replay worker on the same "
        "core). Evaluation: "
        f"{settings['eval_episodes']} episodes of the mean action at 0 and every "
        f"{settings['eval_every_frames']:,} frames. **Preregistered** before the runs "
        f"(`benchmarks/learn_check/settings.py` at "
        f"{result['preregistered'].get('settings_commit') or '?'}; what was measured before "
        "the choice, and its one amendment before any evaluation after frame 0: "
        "`benchmarks/learn_check/candidates.md`): these settings and seeds "
        f"{', '.join(map(str, result['preregistered']['seeds']))} of each agent (never grown "
        "after a miss; other seeds are not counted). Learned: "
        f"{result['learn_rule']}; both agents must learn. AUC: a run's mean evaluation return "
        "over the points after frame 0. Goal: AUC ratio (this / official) >= "
        f"{result['goal_ratio']}, with its 95% bootstrap interval over seeds ("
        f"{interval_caveat(len(result['preregistered']['seeds']))}). Training "
        "frames/s, one rule for both: the wall time between the rows written when "
        "consecutive training episodes end, over the episodes after the seed frames that "
        "hold no evaluation and no relaunch; over the same windows, the CPU seconds of the "
        "run's processes (the official replay worker's included) per 1,000 training frames, "
        "which other work on the core inflates least. `python -m benchmarks.learn_check` "
        "exits 0 when the goal held, 1 when not, 3 while runs are unfinished.",
        "",
        f"**Verdict: {result['verdict']}**: {result['line']}",
        "",
    ]
    points = result["points"]
    for task, agents in sorted(result["tasks"].items()):
        if not any(name in agents for name in AGENTS):
            continue
        lines += [f"**{task}**", ""]
        lines += ["![learning curves](benchmarks/learn_check_curves.png)", ""]
        lines += agent_table(agents, points)
        lines += ["", "Each run's provenance:", ""]
        lines += provenance_table(agents)
        for left_out in agents.get("not_counted", []):
            lines.append(f"\nNot counted: {left_out['agent']} seed {left_out['seed']} "
                         f"({left_out['why']}).")  # fmt: skip
        lines.append("")
    lines += progress_table(result.get("progress", []))
    lines += history_table(result.get("progress", []))
    if result.get("saturation"):
        lines += saturation_lines(result["saturation"], result.get("progress", []))
    old = result.get("superseded")
    if old:
        ours, theirs = old["magi_lp"], old["official"]
        lo_, hi_ = old["old_rule"]["ratio_95"]
        flo, fhi = old["old_rule_frozen"]["ratio_95"]
        nlo, nhi = old["new_rule"]["ratio_95"]
        lines += [
            f"**Superseded: the first check** ({old['reduced']}; "
            f"`benchmarks/learn_check/results/{SUPERSEDED}/`). It reported AUC ratio "
            f"{old['old_rule']['ratio']:.3f} (95% [{lo_:.2f}, {hi_:.2f}]) with "
            f"{ours['seeds']} / {theirs['seeds']} seeds, but it is not evidence of learning: "
            f"neither agent learned by the rule above (mean at frame 0 then at "
            f"{old['points'][-1] // 1000}k: ours {ours['mean'][0]:.0f} -> "
            f"{ours['mean'][-1]:.0f}, the official {theirs['mean'][0]:.0f} -> "
            f"{theirs['mean'][-1]:.0f}); a learner that never updates (each seed's frame-0 "
            f"return carried to every point) passed its rule with "
            f"{old['old_rule_frozen']['ratio']:.2f} [{flo:.2f}, {fhi:.2f}]; its seeds grew "
            "from 3 to 5 after a miss; its runs recorded no commit or machine. Its ratio "
            f"over the points after frame 0: {old['new_rule']['ratio']:.3f} "
            f"[{nlo:.2f}, {nhi:.2f}]. Its curves: `benchmarks/learn_check/results/"
            f"{SUPERSEDED}/curves.png`.",
            "",
        ]
    return "\n".join(lines)
