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

    python -m benchmarks.gpu_learn_check [RESULT.json ...] [--cpu-results DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

from benchmarks import common, gpu_learn
from benchmarks.learn_check import comparison
from benchmarks.learn_check.settings import AGENTS, Settings

SEEDS = (4, 5, 6)
"""The preregistered seeds of each agent: the comparison counts these and no others."""
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
CPU_KEPT = KEPT / "cpu"
"""The CPU runs' results (`python -m benchmarks.learn_check --paper`), committed:
agent/task/seed_N.json, as the learn check keeps its own."""
MACHINES = ("gpu", "cpu")


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
            "finished": _epoch(result.get("measured_at")),
        }
        for run in result.get("runs", [])
    ]


def cpu_runs(kept: Path) -> list[dict]:
    """The learn check's finished CPU runs kept in `kept`, in the same form: `frames` their
    last evaluation's, `finished` the end of their last launch. A run at other settings is
    left out by the comparison, as a GPU one is."""
    found = []
    for path in sorted(Path(kept).glob("*/*/seed_*.json")):
        run = json.loads(path.read_text())
        ends = [a["ended"] for a in run.get("attempts", []) if a.get("ended")]
        found.append(
            {
                **run,
                "frames": max((int(f) for f, _ in run["evaluations"]), default=0),
                "source": str(path.relative_to(kept)),
                "finished": max(ends, default=None),
            }
        )
    return found


def furthest(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """One run per (agent, seed): the one that reached the most frames; and the rest."""
    best: dict[tuple[str, int], dict] = {}
    for run in runs:
        key = (run["agent"], run["seed"])
        if key not in best or run["frames"] > best[key]["frames"]:
            best[key] = run
    kept = {id(run) for run in best.values()}
    return list(best.values()), [run for run in runs if id(run) not in kept]


def _one_machine(runs: list[dict]) -> dict:
    """The comparison over one kind of machine's runs: the furthest run of each (agent,
    seed); comparison.compare's answer with its verdict; when its last counted run finished
    (None while incomplete)."""
    kept, repeated = furthest(runs)
    found = comparison.compare(kept, SETTINGS, SEEDS)
    agents = found["tasks"].get(gpu_learn.TASK, {})
    if "comparison" not in agents:  # no run of the task at these settings and seeds
        agents["comparison"] = comparison.verdict(agents, SEEDS)
    complete = agents["comparison"]["verdict"] != comparison.INCOMPLETE
    counted = [
        run for run in kept if run["seed"] in SEEDS and comparison.same_settings(
            run.get("settings", {}), SETTINGS)
    ]  # fmt: skip
    times = [run.get("finished") for run in counted]
    return {
        "points": found["points"],
        "agents": agents,
        "finished": max(times) if complete and None not in times else None,
        "left_out": [f"{r['agent']} {r['seed']} ({r['source']})" for r in repeated],
    }


def check(paths: list[Path], cpu_kept: Path | None = None) -> dict:
    """The comparison over the gpu_learn.json files in `paths` and the CPU runs kept in
    `cpu_kept`, within each kind of machine; the verdict is the set that completed first
    (the amendment), "incomplete" while neither has. `agents` is that set's (or, while
    incomplete, the one with more runs finished)."""
    runs: list[dict] = []
    for path in paths:
        runs += runs_of(json.loads(Path(path).read_text()), Path(path).name)
    machines = {
        "gpu": _one_machine(runs),
        "cpu": _one_machine(cpu_runs(cpu_kept) if cpu_kept is not None else []),
    }
    done = [m for m in MACHINES if machines[m]["finished"] is not None]
    if done:
        counted = min(done, key=lambda m: machines[m]["finished"])
    else:  # the set nearer to done is shown; the verdict waits

        def finished_runs(machine: str) -> int:
            agents = machines[machine]["agents"]
            return sum(len(agents[a]["seeds"]) for a in AGENTS if a in agents)

        counted = max(MACHINES, key=finished_runs)  # ties: the GPU's, listed first
    chosen = machines[counted]
    return {
        "points": chosen["points"],
        "seeds": list(SEEDS),
        "machine": counted if done else None,
        "agents": chosen["agents"],
        "machines": machines,
        "read": [str(p) for p in paths] + ([str(cpu_kept)] if cpu_kept is not None else []),
        "left_out": machines["gpu"]["left_out"] + machines["cpu"]["left_out"],
    }


def _agent_lines(agents: dict) -> list[str]:
    out = []
    for name in AGENTS:
        agent = agents.get(name)
        if agent is None:
            out.append(f"  {name}: no run yet")
            continue
        curve = ", ".join(f"{v:.0f}" for v in agent["mean"])
        fps = agent["train_frames_per_s"]
        out.append(
            f"  {name}: seeds {agent['seeds']}, mean return {curve}; "
            f"learned: {agent['learning']['learned']} ({agent['learning']['rule']}); "
            f"train frames/s {'-' if fps is None else f'{fps:.1f}'}"
        )
    return out


def lines(found: dict) -> list[str]:
    """The check in words: each machine's runs (each agent's curve and learning), then the
    verdict of the set counted."""
    points = found["points"]
    out = [
        f"gpu_learn_check: {gpu_learn.TASK} at the paper's settings, seeds "
        f"{', '.join(map(str, SEEDS))} of each agent (preregistered), points "
        f"{', '.join(f'{p // 1000}k' for p in points)}; one kind of machine counts"
    ]
    for machine in MACHINES:
        agents = found["machines"][machine]["agents"]
        if not any(name in agents for name in AGENTS):
            out.append(f"  on {machine}: no run finished")
            continue
        state = "counted" if found["machine"] == machine else "not counted"
        if found["machine"] is None:
            state = "shown" if found["agents"] is agents else "not shown"
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
    out.append(f"gpu_learn_check: {verdict['verdict']}{where}: {verdict['why']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", help=f"gpu_learn.json files (default: {KEPT})")
    parser.add_argument(
        "--cpu-results", default=str(CPU_KEPT), help="the CPU runs' kept results (a folder)"
    )
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.results] or sorted(KEPT.glob("*.json"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"gpu_learn_check: no such file: {', '.join(missing)}")
    found = check(paths, Path(args.cpu_results))
    print("\n".join(lines(found)))
    return comparison.EXIT[found["agents"]["comparison"]["verdict"]]


if __name__ == "__main__":
    sys.exit(main())
