"""The preregistered comparison at the paper's settings on a GPU: `make gpu-learn-check`.

PREREGISTERED on 2026-11-27, in the commit that added this file, before any run it counts
had started. What counts:

- Task cartpole_balance at the paper's settings, as `make gpu-learn` runs them: 84x84
  pixels, batch 256, 4000 seed frames, replay 100k (no run of 40k frames stores more than
  20k transitions), evaluations of 10 episodes at 0, 20k and 40k frames.
- Seeds 4, 5 and 6 of each agent (`SEEDS`), none of which had run at these settings. Seeds
  1-3 of ours and seed 1 of the official agent ran there first (figure 16, H100, 2026-11-27:
  ours 989, 989, 973 at 40k; the official 988); they are not counted, and the seeds are never
  grown after a miss.
- The rules are the CPU learn check's (`benchmarks.learn_check.comparison`): both agents
  must have learned (mean return at 40k >= 2 x the mean at frame 0 and >= 700); the AUC is
  each run's mean return at 20k and 40k; goal: our mean AUC / the official mean AUC >= 0.9,
  with a 95% bootstrap interval over seeds. Held, not held or incomplete; exit 0, 1 or 3.
- A GPU machine is lent for 15 minutes a session, and no official run outlasts its machine
  (its snapshot and replay stay there): the official seeds run in one session, two device
  calls on one warm machine (`--seeds "" --official-seeds 4,5,6 --frames 40000`: at the 76
  train frames/s one official seed made on 4 H100 cores, about 700 s of runs); ours in the
  same or another (`--seeds 4,5,6 --frames 40000`). Learning per frame does not depend on the
  machine; the frames/s of each are stated with its device and are not compared across
  machines.

Reads the `gpu_learn.json` of each session's last call, committed under
`benchmarks/gpu_learn_check/` (any name ending in .json).

AMENDED on 2026-11-27, in the commit that added `CPU_KEPT`, before any run it counts had
started (none had run on either machine): the same six runs may be made on this project's
2-core CPU machine, since a GPU is lent to a few sessions only and one session's 15 minutes do
not hold both agents' runs. `python -m benchmarks.learn_check --paper` (in the background:
`bash benchmarks/learn_check/background.sh --paper`) runs each on one core at exactly these
settings (ours: the same `ours_main` arguments as `make gpu-learn`, with a checkpoint every 10
minutes; the official agent: the same command on `device=cpu`), and keeps each finished run
under `benchmarks/gpu_learn_check/cpu/`. The comparison is made within one kind of machine:
the six GPU runs together, or the six CPU runs together, never a mix. The set whose sixth run
finished first counts (a GPU run's time is its result's `measured_at`, a CPU run's the end of
its last launch); the other set, if it completes, is reported beside it and does not change
the verdict. Frames/s are compared only within the set.

SECOND PREREGISTRATION on 2026-11-28, in the commit that added `SECOND`, before any run of
its seeds had started on either machine (seeds 10-12 had never run at any settings). Written
after the first's three runs of ours had finished on an H200 (2026-11-27, 4b76322): 616, 596
and 297 at frame 0, 991, 979 and 991 at 40k frames. By the first's rule they did not learn:
2 x their frame-0 mean is 1006, above the 1000 an episode can return at most, so no run of
these seeds could have passed. The official agent's seed 4 scored 643 at frame 0 on the CPU,
and the published ten seeds range 309-508 there: the ratio rule fails whenever three seeds'
frame-0 mean is above 500, for either agent, whatever they learn. What the second counts:

- The same task, settings, evaluation points, AUC, goal, machines and amendment as the first.
- Seeds 10, 11 and 12 of each agent (`SECOND.seeds`): fresh, since the first's had been
  seen at frame 0 (and ours' to the end), and seeds 7-9 of the official agent at frame 0 (a
  throughput probe on the H200, 11k frames, 2026-11-27, not kept).
- Learned (`comparison.GAP`): an agent's mean return at 40k has closed at least half the gap
  between its frame-0 mean and 1000, and is >= 700. It is the ratio rule at a frame-0 mean of
  333, stricter below it and looser above; a learner that never updates closes none of it.
- The first stays as it was registered and is reported beside the second (`FIRST`): its
  verdict will be "not held" (ours did not learn by its rule) once its official runs exist.
  The exit code and the figure's headline are the second's (`CURRENT`).

THIRD PREREGISTRATION on 2026-12-06, in the commit that added `THIRD`, before any run of its
seeds had started on either machine (seeds 20-24 had never run at any settings). Written after
the second's six CPU runs had finished (2026-12-02) and it had not held: the official agent did
not learn, 679 < 714 at 40k. One collapse in three seeds did it: the official seed 12 drove its
actor to +1.000, where tanh passes no gradient, and scored 136 at 20k and 40k; its seeds 10 and
11 reached 927 and 973 (ours: 367, 546, 980, learned). Five seeds a side make one such collapse
survivable: four official seeds at those two's mean (950) and one at 136 average about 790,
above the 714 a frame-0 mean of 428 asks for; the published ten seeds have one low seed too
(429 at 40k, against a mean of 835). What the third counts:

- The same task, settings, evaluation points, AUC, goal and learning rule (`comparison.GAP`)
  as the second.
- Seeds 20, 21, 22, 23 and 24 of each agent (`THIRD.seeds`), never grown after a miss: ten
  runs.
- On the GPU only (`THIRD.machines`): the amendment does not apply to it. A run of its seeds
  on the CPU machine (`learn_check --paper`) is never counted; where one exists the verdict
  says so. The CPU machine goes on with the second's seeds (`SEEDS`), whose runs are finished.
- A GPU machine is lent for 15 minutes a session, and an official run cannot outlive its
  machine (its snapshot and replay stay there): each session runs what finishes on one warm
  machine in at most two device calls. Not five official seeds at once: on 16 cores they get 3
  each, and one official seed on 4 H100 cores trained at 76 frames/s and reached 40k only
  within both calls of a session (731 s). The layout measured on the H100 (2026-11-27: four
  runs of 4 cores each, two calls, 771 s of the 900 with the machine's start) is used three
  times: `--seeds 20 --official-seeds 20,21,22`, then `--seeds 21,22 --official-seeds 23,24`,
  each in two calls on one warm machine, then `--seeds 23,24 --official-seeds ""` in one call,
  all with `--frames 40000` (benchmarks/README.md gives the commands). How fast each agent goes
  in these layouts is to be measured on the first call; where a first call's last line asks a
  continuing call for more than the session has left, its official seeds do not finish there
  and run again from frame 0 in a later session, fewer at once.
- The first and the second stay as they were registered and are reported beside the third
  (the second: not held on the CPU; the first: incomplete, its official seeds never run). The
  exit code and the figure's headline are the third's (`CURRENT`).

    python -m benchmarks.gpu_learn_check [RESULT.json ...] [--cpu-results DIR] [--write]

`--write` (what `make gpu-learn-check` passes) also writes the figure's result,
benchmarks/gpu_learn_check.json, and its curves, benchmarks/gpu_learn_check_curves.png, with the
CPU runs' progress from runs/learn_check_paper/; `python -m benchmarks.run --only
gpu_learn_check` renders them into BENCHMARKS.md (figure 17).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import sys
from pathlib import Path

from benchmarks import common, gpu_learn
from benchmarks.learn_check import comparison
from benchmarks.learn_check.settings import AGENTS, Settings

MACHINES = ("gpu", "cpu")


@dataclasses.dataclass(frozen=True)
class Preregistration:
    """One preregistered comparison: the seeds it counts (of each agent, never grown), its
    learning rule (`comparison.RULES`) and the kinds of machine whose runs it counts;
    everything else is this module's, for all."""

    name: str
    seeds: tuple[int, ...]
    rule: str
    registered: str
    """When, and what had been seen then (the docstring says it in full)."""
    machines: tuple[str, ...] = MACHINES
    """The kinds of machine whose runs count (of `MACHINES`): both, by the amendment, or the
    GPU's only. A run of its seeds on another is reported, never counted."""


FIRST = Preregistration(
    "first", (4, 5, 6), comparison.RATIO, "2026-11-27, before any run it counts"
)
SECOND = Preregistration(
    "second",
    (10, 11, 12),
    comparison.GAP,
    "2026-11-28, before any run it counts, after the first's runs of ours",
)
THIRD = Preregistration(
    "third",
    (20, 21, 22, 23, 24),
    comparison.GAP,
    "2026-12-06, before any run it counts (seeds 20-24 had never run at any settings), GPU only",
    machines=("gpu",),
)
CURRENT = THIRD
"""The comparison whose verdict is the exit code and the figure's headline."""
PREREGISTRATIONS = (THIRD, SECOND, FIRST)
CPU_CURRENT = SECOND
"""The last preregistration that counts CPU runs: the CPU machine runs its seeds. Not
`CURRENT`, which counts GPU runs only: its seeds never run there."""
SEEDS = CPU_CURRENT.seeds
"""The seeds the CPU machine runs (`learn_check --paper`): the second's (`CPU_CURRENT`)."""
FRAMES = 40_000
SETTINGS = Settings(
    image_size=84,
    batch_size=256,
    frames=FRAMES,
    eval_every_frames=gpu_learn.EVAL_EVERY_FRAMES,
    eval_episodes=gpu_learn.EVAL_EPISODES,
    seed_frames=gpu_learn.SEED_FRAMES,
    replay_size=100_000,
)
KEPT = common.REPO / "benchmarks" / "gpu_learn_check"
"""Each session's last gpu_learn.json, committed."""
JSON = common.REPO / "benchmarks" / "gpu_learn_check.json"
PNG = common.REPO / "benchmarks" / "gpu_learn_check_curves.png"
CPU_KEPT = KEPT / "cpu"
"""The CPU runs' results (`python -m benchmarks.learn_check --paper`), committed:
agent/task/seed_N.json, as the learn check keeps its own."""
SATURATION = CPU_KEPT / "saturation.json"
"""The CPU runs' actors probed (`python -m benchmarks.learn_check.saturation --out
runs/learn_check_paper --seeds 10 11 12 --image-size 84 --write` this path): why a run did not
learn, shown under the CPU machine's runs."""


def at_these_settings(result: dict) -> bool:
    """Whether a gpu_learn.json was made at the preregistered settings (not tiny, the
    paper's arguments, the evaluation points, a goal of 40k frames or more)."""
    settings = result.get("settings", {})
    return (
        not result.get("tiny", True)
        and result.get("task") == gpu_learn.TASK
        and settings.get("args") == list(gpu_learn.PAPER)
        and settings.get("eval_every_frames") == SETTINGS.eval_every_frames
        and settings.get("eval_episodes") == SETTINGS.eval_episodes
        and settings.get("frames_goal", 0) >= FRAMES
    )


def _epoch(iso: str | None) -> float | None:
    try:
        return datetime.datetime.strptime(iso or "", "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def runs_of(result: dict, source: str) -> list[dict]:
    """A gpu_learn.json's runs in the comparison's form: each with its task, settings (the
    preregistered ones, or none where the result was made at others), versions, machine,
    and when the result was written (`finished`)."""
    settings = dataclasses.asdict(SETTINGS) if at_these_settings(result) else {}
    return [
        {
            **run,
            "task": result.get("task"),
            "settings": settings,
            "versions": result.get("versions", {}),
            "machine": {**result.get("machine", {}), "device": result.get("device")},
            "source": source,
            "commit": result.get("commit"),
            "calls": len(result.get("calls") or []),
            "finished": _epoch(result.get("measured_at")),
        }
        for run in result.get("runs", [])
    ]


def cpu_runs(kept: Path) -> list[dict]:
    """The learn check's finished CPU runs kept in `kept`, in the same form: `frames` their
    last evaluation's, `finished` the end of their last launch. A run at other settings is
    left out by the comparison, as a GPU one is."""
    found = []
    for run in comparison.load_runs(kept):
        ends = [a["ended"] for a in run.get("attempts", []) if a.get("ended")]
        found.append(
            {
                **run,
                "frames": max((int(f) for f, _ in run["evaluations"]), default=0),
                "source": f"{run['agent']}/{run['task']}/seed_{run['seed']}.json",
                "finished": max(ends, default=None),
            }
        )
    return found


def gpu_results() -> list[Path]:
    """The gpu_learn.json files committed under `KEPT`."""
    return sorted(KEPT.glob("*.json"))


def runs_finished(agents: dict) -> int:
    """How many runs of one machine's set have every evaluation point (both agents)."""
    return sum(len(agents[a]["seeds"]) for a in AGENTS if a in agents)


def furthest(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """One run per (agent, seed): the one that reached the most frames; and the rest."""
    best: dict[tuple[str, int], dict] = {}
    for run in runs:
        key = (run["agent"], run["seed"])
        if key not in best or run["frames"] > best[key]["frames"]:
            best[key] = run
    kept = {id(run) for run in best.values()}
    return list(best.values()), [run for run in runs if id(run) not in kept]


def _one_machine(runs: list[dict], prereg: Preregistration) -> dict:
    """The comparison over one kind of machine's runs: the furthest run of each (agent,
    seed); comparison.compare's answer with its verdict; when its last counted run finished
    (None while incomplete)."""
    # Runs at other settings first: a longer one of the same seed must not displace the run
    # that counts.
    kept, repeated = furthest(
        [run for run in runs if comparison.same_settings(run.get("settings", {}), SETTINGS)]
    )
    found = comparison.compare(kept, SETTINGS, prereg.seeds, prereg.rule)
    agents = found["tasks"].get(gpu_learn.TASK, {})
    if "comparison" not in agents:  # no run of the task at these settings and seeds
        agents["comparison"] = comparison.verdict(agents, prereg.seeds)
    complete = agents["comparison"]["verdict"] != comparison.INCOMPLETE
    counted = [run for run in kept if run["seed"] in prereg.seeds]
    times = [run.get("finished") for run in counted]
    return {
        "points": found["points"],
        "agents": agents,
        "finished": max(times) if complete and None not in times else None,
        "runs": len(counted),
        "left_out": [
            f"{r['agent']} {r['seed']} ({r['source']})"
            for r in repeated
            if r["seed"] in prereg.seeds
        ],
    }


def check(
    paths: list[Path], cpu_kept: Path | None = None, prereg: Preregistration = CURRENT
) -> dict:
    """The comparison `prereg` over the gpu_learn.json files in `paths` and the CPU runs kept
    in `cpu_kept`, within each kind of machine; the verdict is the set that completed first
    of the machines `prereg` counts (the amendment: both; the third: the GPU's), "incomplete"
    while none has. `agents` is that set's (or, while incomplete, the one of them with more
    runs finished). A machine it does not count is reported (`excluded`: its runs of the
    seeds), never counted."""
    runs: list[dict] = []
    for path in paths:
        runs += runs_of(json.loads(Path(path).read_text()), Path(path).name)
    machines = {
        "gpu": _one_machine(runs, prereg),
        "cpu": _one_machine(cpu_runs(cpu_kept) if cpu_kept is not None else [], prereg),
    }
    eligible = [m for m in MACHINES if m in prereg.machines]
    done = [m for m in eligible if machines[m]["finished"] is not None]
    if done:
        counted = min(done, key=lambda m: machines[m]["finished"])
    else:  # the set nearer to done is shown; the verdict waits; ties: the GPU's, listed first
        counted = max(eligible, key=lambda m: runs_finished(machines[m]["agents"]))
    chosen = machines[counted]
    return {
        "points": chosen["points"],
        "preregistration": prereg.name,
        "seeds": list(prereg.seeds),
        "rule": prereg.rule,
        "registered": prereg.registered,
        "counts": eligible,
        "machine": counted if done else None,
        "shown": counted,
        "agents": chosen["agents"],
        "runs_finished": runs_finished(chosen["agents"]),
        "runs_needed": len(AGENTS) * len(prereg.seeds),
        "excluded": {
            m: machines[m]["runs"] for m in MACHINES if m not in eligible and machines[m]["runs"]
        },
        "machines": machines,
        "read": [str(p) for p in paths] + ([str(cpu_kept)] if cpu_kept is not None else []),
        "left_out": machines["gpu"]["left_out"] + machines["cpu"]["left_out"],
    }


def check_all(paths: list[Path], cpu_kept: Path | None = None) -> list[dict]:
    """`check` for every preregistration, the current one first."""
    return [check(paths, cpu_kept, prereg) for prereg in PREREGISTRATIONS]


def only_text(found: dict) -> str:
    """ "" where a preregistration counts both kinds of machine; else which it counts."""
    counts = found.get("counts", list(MACHINES))
    if set(counts) == set(MACHINES):
        return ""
    return f"{' and '.join(m.upper() for m in counts)} runs only"


def why(found: dict) -> str:
    """The verdict's reason in words: the comparison's, with how many of the runs exist
    while incomplete, and the runs of its seeds on a machine it does not count."""
    verdict = found["agents"]["comparison"]
    text = verdict["why"]
    if verdict["verdict"] == comparison.INCOMPLETE:
        on = f" on {found['shown']}" if found["runs_finished"] else ""
        only = only_text(found)
        text += (
            f" ({found['runs_finished']} of its {found['runs_needed']} runs{on}"
            f"{'; ' + only if only else ''})"
        )
    for machine, runs in found.get("excluded", {}).items():
        text += (
            f"; {runs} run(s) of its seeds on {machine} not counted (it counts {only_text(found)})"
        )
    return text


def _agent_lines(agents: dict) -> list[str]:
    out = []
    for name in AGENTS:
        agent = agents.get(name)
        if agent is None:
            out.append(f"  {name}: no run yet")
            continue
        curve = ", ".join(f"{v:.0f}" for v in agent["mean"])
        fps = agent["train_frames_per_s"]
        learning = agent["learning"]
        rule = "; ".join(filter(None, (learning["rule"], comparison.beyond_reach(learning))))
        out.append(
            f"  {name}: seeds {agent['seeds']}, mean return {curve}; "
            f"learned: {learning['learned']} ({rule}); "
            f"train frames/s {'-' if fps is None else f'{fps:.1f}'}"
        )
    return out


def lines(found: dict) -> list[str]:
    """The check in words: each machine's runs (each agent's curve and learning), then the
    verdict of the set counted."""
    points = found["points"]
    name = found["preregistration"]
    out = [
        f"gpu_learn_check ({name}): {gpu_learn.TASK} at the paper's settings, seeds "
        f"{', '.join(map(str, found['seeds']))} of each agent (preregistered "
        f"{found['registered']}), points {', '.join(f'{p // 1000}k' for p in points)}; "
        + (only_text(found) or "one kind of machine counts")
    ]
    for machine in MACHINES:
        agents = found["machines"][machine]["agents"]
        never = machine not in found.get("counts", MACHINES)
        if not any(name in agents for name in AGENTS):
            out.append(
                f"  on {machine}: never counted ({only_text(found)})"
                if never
                else f"  on {machine}: no run finished"
            )
            continue
        state = "counted" if found["machine"] == machine else "not counted"
        if found["machine"] is None:
            state = "shown" if found["agents"] is agents else "not shown"
        if never:
            state = f"never counted: {only_text(found)}"
        out.append(f"  on {machine} ({state}):")
        out += ["  " + line for line in _agent_lines(agents)]
    verdict = found["agents"]["comparison"]
    ratio = verdict.get("auc_ratio")
    interval = verdict.get("auc_ratio_95")
    if ratio is not None:
        out.append(
            f"  AUC ratio (ours / official) {ratio:.3f}, 95% [{interval[0]:.3f}, "
            f"{interval[1]:.3f}]; goal >= {comparison.GOAL_RATIO}"
        )
    if verdict.get("missing_seeds"):
        out.append(f"  missing: {verdict['missing_seeds']}")
    where = f" (on {found['machine']})" if found["machine"] else ""
    out.append(f"gpu_learn_check ({name}): {verdict['verdict']}{where}: {why(found)}")
    return out


# -- the figure (benchmarks.run reads benchmarks/gpu_learn_check.json) ---------------------

TITLE = "The preregistered comparisons at the paper's settings, both agents on one machine"
NOT_MEASURED = (
    "not measured: `make gpu-learn-check` has not written benchmarks/gpu_learn_check.json"
)


def write(
    founds: list[dict],
    json_path: Path = JSON,
    png_path: Path = PNG,
    cpu_kept: Path = CPU_KEPT,
    cpu_runs_out: Path | None = None,
) -> dict:
    """The figure's result: the first of `founds` (each a `check`, the current
    preregistration's first) with the others under "earlier", each with its verdict, each
    machine's curves and runs' provenance, the published curve at the points and the
    progress of the CPU runs kept in `cpu_kept` and run under `cpu_runs_out` (by default
    learn_check --paper's), as JSON; each one's curves as a PNG (the current's `png_path`,
    an earlier one's named after it)."""
    results = []
    for index, found in enumerate(founds):
        png = png_path if index == 0 else png_path.with_name(
            f"{png_path.stem}_{found['preregistration']}{png_path.suffix}"
        )  # fmt: skip
        results.append(_result(found, png, cpu_kept, cpu_runs_out, current=index == 0))
    result = {**results[0], "earlier": results[1:]}
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


PAUSED = "paused (this machine runs the current preregistration's seeds)"
"""An earlier preregistration's unfinished CPU run: `learn_check --paper` goes on with the
current one's seeds, and with these only when asked (`--seeds`)."""


def _result(
    found: dict, png_path: Path, cpu_kept: Path, cpu_runs_out: Path | None, current: bool = True
) -> dict:
    from benchmarks.learn_check import settings as learn_check_settings

    cpu_runs_out = cpu_runs_out or learn_check_settings.PAPER_OUT
    seeds = tuple(found["seeds"])
    verdict = found["agents"]["comparison"]
    reference = gpu_learn.reference_curve(gpu_learn.TASK)
    result = {
        "status": "ok",
        "preregistration": found["preregistration"],
        "registered": found["registered"],
        "verdict": verdict["verdict"],
        "line": why(found) + (f" (on {found['machine']})" if found["machine"] else ""),
        "counts": found["counts"],
        "runs_finished": found["runs_finished"],
        "runs_needed": found["runs_needed"],
        "excluded": found["excluded"],
        "missing_seeds": verdict.get("missing_seeds"),
        "measured_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": common.git_commit(),
        "task": gpu_learn.TASK,
        "settings": dataclasses.asdict(SETTINGS),
        "goal_ratio": comparison.GOAL_RATIO,
        "rule": found["rule"],
        "learn_rule": comparison.learned(gpu_learn.TASK, 0.0, 0.0, rule=found["rule"])["rule"],
        "seeds": list(seeds),
        "points": found["points"],
        "reference": {str(p): reference[p] for p in found["points"] if p in reference},
        "machine_counted": found["machine"],
        "machines": {
            m: {
                "agents": found["machines"][m]["agents"],
                "finished": found["machines"][m]["finished"],
            }
            for m in MACHINES
        },
        # The CPU machine's runs of these seeds, where it counts them (the third's never run
        # there: no row of "not started" for them).
        "progress": [
            {**state, "state": PAUSED} if not current and state["state"] == "in progress" else state
            for state in comparison.progress(
                cpu_runs_out, SETTINGS, (gpu_learn.TASK,), cpu_kept, seeds
            )
        ]
        if "cpu" in found["counts"]
        else [],
        "read": found["read"],
        "left_out": found["left_out"],
        "saturation": _saturation(cpu_kept, seeds),
    }
    result["png"] = _plot(result, png_path)
    return result


def _saturation(cpu_kept: Path, seeds: tuple[int, ...]) -> dict | None:
    """The saturation probe of the CPU runs of `seeds` at these settings, if it was made."""
    path = Path(cpu_kept) / SATURATION.name
    if not path.is_file():
        return None
    probe = json.loads(path.read_text())
    if probe.get("image_size") != SETTINGS.image_size:
        return None
    runs = [run for run in probe.get("runs", []) if run.get("seed") in seeds]
    return {**probe, "runs": runs} if runs else None


def _plot(result: dict, path: Path) -> str:
    """Each machine's runs (mean bold, seeds thin) beside the published curve; a note where
    matplotlib is missing or no run has finished."""
    shown = [m for m in MACHINES if any(a in result["machines"][m]["agents"] for a in AGENTS)]
    if not shown:
        path.unlink(missing_ok=True)  # an older figure's curves are not these
        return "no PNG (no run finished)"
    if importlib.util.find_spec("matplotlib") is None:
        return "no PNG (matplotlib is not installed here)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(shown), figsize=(6.5 * len(shown), 4.5), squeeze=False)
    x = result["points"]
    reference = {int(f): v for f, v in result["reference"].items()}
    frames = sorted(reference)
    for axis, machine in zip(axes[0], shown, strict=True):
        axis.fill_between(frames, [reference[f]["min"] for f in frames],
                          [reference[f]["max"] for f in frames], alpha=0.2, color="gray",
                          label="official, published: lowest to highest of 10 seeds")  # fmt: skip
        axis.plot(frames, [reference[f]["mean"] for f in frames], color="gray",
                  label="official, published: mean")  # fmt: skip
        agents = result["machines"][machine]["agents"]
        for name, color in zip(AGENTS, ("C0", "k"), strict=True):
            agent = agents.get(name)
            if agent is None:
                continue
            for curve in agent["curves"]:
                axis.plot(x, curve, color=color, alpha=0.3, linewidth=1)
            axis.plot(x, agent["mean"], "o-", color=color, linewidth=2,
                      label=f"{name}: mean of seeds {agent['seeds']}")  # fmt: skip
        state = "counted" if result["machine_counted"] == machine else "not counted"
        axis.set_title(f"{gpu_learn.TASK} on {machine} ({state})", fontsize=9)
        axis.set_xlabel("frames")
        axis.set_ylabel("evaluation return (10 episodes)")
        axis.legend(fontsize=7)
    figure.suptitle(f"DrQ-v2 at the paper's settings (84x84, batch 256), the "
                    f"{result['preregistration']} preregistration: seeds {result['seeds']}",
                    fontsize=9)  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path.relative_to(common.REPO)) if path.is_relative_to(common.REPO) else str(path)


def _counts(result: dict) -> list[str]:
    """The machines a figure's preregistration counts (a result written before the third
    counted both)."""
    return result.get("counts", list(MACHINES))


def _finished_text(result: dict) -> str:
    """Each counted machine's runs finished out of the preregistration's, e.g. "gpu 0 / 10"."""
    total = len(AGENTS) * len(result["seeds"])
    done = ", ".join(
        f"{m} {runs_finished(result['machines'][m]['agents'])} / {total}" for m in _counts(result)
    )
    only = only_text(result)
    return done + (f"; {only}" if only else "")


def _state(result: dict) -> str:
    """One preregistration's state in a few words: its verdict and ratio, or its progress."""
    counted = result["machine_counted"]
    if counted is None:
        return f"in progress: runs finished: {_finished_text(result)}"
    found = result["machines"][counted]["agents"]["comparison"]
    low, high = found["auc_ratio_95"]
    return (
        f"{result['verdict']} on {counted}: AUC ratio {found['auc_ratio']:.3f} "
        f"(95% [{low:.2f}, {high:.2f}])"
    )


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for BENCHMARKS.md's table: the current preregistration's,
    each earlier one's state after it."""
    against = f"official DrQ-v2, seeds {result['seeds']} of each, 84x84, batch 256, 40k frames"
    rule = f"goal >= {result['goal_ratio']}, both agents learned"
    state = _state(result)
    if result["machine_counted"] is None:  # the headline: incomplete, and how far
        finished = max(runs_finished(result["machines"][m]["agents"]) for m in _counts(result))
        state = (
            f"{result['verdict']}, {finished} of {len(AGENTS) * len(result['seeds'])} runs "
            f"finished ({_finished_text(result)})"
        )
    number = f"{result.get('preregistration', 'first')}: {state}"
    for earlier in result.get("earlier", []):
        number += f"; {earlier['preregistration']} (seeds {earlier['seeds']}): {_state(earlier)}"
    return number, against, rule


def report(result: dict) -> str:
    """The figure's section: the current preregistration (its verdict, each machine's
    runs), then each earlier one the same way."""
    sections = [_report_one(result)]
    for earlier in result.get("earlier", []):
        sections.append(
            f"**The {earlier['preregistration']} preregistration** (seeds "
            f"{', '.join(map(str, earlier['seeds']))}; registered {earlier['registered']}; "
            "superseded by the one above, reported as it was registered):\n\n"
            + _report_one(earlier)
        )
    return "\n\n".join(sections)


def _report_one(result: dict) -> str:
    """One preregistration: what it counts, its verdict, each machine's runs."""
    points = result["points"]
    reference = result["reference"]
    lines = [
        "The comparison that can fail, at the paper's settings (84x84 pixels, batch 256, 4000 "
        "seed frames, replay 100k, evaluations of 10 episodes at "
        f"{', '.join(f'{p // 1000}k' for p in points)} frames) on {result['task']}. "
        f"**Preregistered** (the {result.get('preregistration', 'first')} in "
        "`benchmarks/gpu_learn_check.py`'s docstring, "
        f"{result.get('registered', '2026-11-27, before any run it counts')}): seeds "
        f"{', '.join(map(str, result['seeds']))} of each agent, never "
        f"grown; learned: {result['learn_rule']}, both agents; AUC: a run's mean return over "
        f"the points after frame 0; goal: AUC ratio (this / official) >= {result['goal_ratio']}"
        ", with its 95% bootstrap interval over seeds ("
        f"{comparison.interval_caveat(len(result['seeds']))}). {_machines_text(result)} "
        "Frames/s by the learn check's one rule, compared only "
        "within one machine. `python -m benchmarks.gpu_learn_check` exits 0 held, 1 not held, 3 "
        "incomplete (`make gpu-learn-check` runs it and renders this figure).",
        "",
        f"**Verdict: {result['verdict']}**: {result['line']}",
        "",
    ]
    missing = {a: s for a, s in (result.get("missing_seeds") or {}).items() if s}
    if missing and "cpu" not in _counts(result):
        lines += [
            "Runs still to make on a GPU: "
            + "; ".join(f"{a} seeds {', '.join(map(str, s))}" for a, s in missing.items())
            + ' (the device calls: benchmarks/README.md, "The preregistered GPU comparison").',
            "",
        ]
    published = " | ".join(
        f"{reference[str(p)]['mean']:.0f} ({reference[str(p)]['min']:.0f}-"
        f"{reference[str(p)]['max']:.0f})"
        if str(p) in reference
        else ""
        for p in points
    )
    for machine in MACHINES:
        agents = result["machines"][machine]["agents"]
        never = machine not in _counts(result)
        if not any(name in agents for name in AGENTS):
            lines += [
                f"On {machine}: never counted ({only_text(result)})."
                if never
                else f"On {machine}: no run finished.",
                "",
            ]
            continue
        state = "counted" if result["machine_counted"] == machine else "not counted"
        if never:
            state = f"never counted: {only_text(result)}"
        lines += [f"**On {machine}** ({state}):", ""]
        lines += comparison.agent_table(agents, points)
        lines.append(f"| official, published (10 seeds) | 10 | {published} | | | | | |")
        lines += _other_rule(result, agents)
        lines += ["", "Each run's provenance:", ""]
        lines += comparison.provenance_table(agents)
        lines.append("")
        if machine == "cpu" and result.get("saturation"):
            lines += comparison.saturation_lines(result["saturation"], result.get("progress", []))
    lines += comparison.progress_table(result.get("progress", []))
    lines += comparison.history_table(result.get("progress", []))
    if result.get("png", "").endswith(".png"):
        lines += [f"![curves]({result['png']})", ""]
    return "\n".join(lines)


def _machines_text(result: dict) -> str:
    """Which kinds of machine the preregistration counts, in words."""
    runs = len(AGENTS) * len(result["seeds"])
    if "cpu" not in _counts(result):
        return (
            f"It counts GPU runs only (`make gpu-learn`): its {runs} runs are made on lent GPU "
            "machines, and a run of its seeds on the CPU machine is never counted."
        )
    return (
        f"Its amendment (before any counted run started) lets the {_words(runs)} runs be made "
        "on a GPU (`make gpu-learn`) or on the 2-core CPU machine (`python -m "
        "benchmarks.learn_check --paper`), never mixed: the machine whose "
        f"{_words(runs)} runs finished first counts."
    )


def _words(number: int) -> str:
    return {6: "six", 10: "ten"}.get(number, str(number))


def _other_rule(result: dict, agents: dict) -> list[str]:
    """Where the preregistered rule is not the ratio rule (issue 35's rule 1), what the ratio
    rule says of the same means, beside it: reported, not counted."""
    if result.get("rule", comparison.RATIO) == comparison.RATIO:
        return []
    said = []
    for name in AGENTS:
        agent = agents.get(name)
        if agent is None:
            continue
        judged = comparison.learned(
            result["task"], agent["mean"][0], agent["mean"][-1], rule=comparison.RATIO
        )
        verdict = "yes" if judged["learned"] else "no"
        reach = "" if judged["reachable"] else ", more than any return"
        said.append(
            f"{name} {verdict} ({judged['final_mean']:.0f} against {judged['needed']:.0f}{reach})"
        )
    rule = comparison.learned(result["task"], 0.0, 0.0, rule=comparison.RATIO)["rule"]
    return ["", f"By the ratio rule instead ({rule}; not this preregistration's): "
            + "; ".join(said) + "."]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", help=f"gpu_learn.json files (default: {KEPT})")
    parser.add_argument(
        "--cpu-results", default=str(CPU_KEPT), help="the CPU runs' kept results (a folder)"
    )
    parser.add_argument(
        "--write", action="store_true", help=f"also write {JSON.name} and {PNG.name}"
    )
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.results] or gpu_results()
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"gpu_learn_check: no such file: {', '.join(missing)}")
    founds = check_all(paths, Path(args.cpu_results))
    for found in founds:
        print("\n".join(lines(found)))
    if args.write:
        written = write(founds, cpu_kept=Path(args.cpu_results))
        pngs = [written["png"]] + [e["png"] for e in written["earlier"]]
        print(f"gpu_learn_check: wrote {JSON.relative_to(common.REPO)}, {', '.join(pngs)}")
    return comparison.EXIT[founds[0]["agents"]["comparison"]["verdict"]]


if __name__ == "__main__":
    sys.exit(main())
