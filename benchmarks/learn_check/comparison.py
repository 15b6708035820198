"""The comparison, stated: curves (mean and each seed), the AUC ratio with a bootstrap
interval over seeds, where our final return lies among the official seeds', frames/s.

AUC is a run's mean evaluation return over the evaluation points (0, 10k, ..., the last
frame): the area under its curve over the frames, up to a constant. The ratio is our mean AUC
over the official mean AUC; its 95% interval resamples each agent's seeds with replacement.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
import json
import random
from pathlib import Path

from benchmarks import common
from benchmarks.learn_check.settings import AGENTS, Settings

JSON = common.REPO / "benchmarks" / "learn_check.json"
CSV = common.REPO / "benchmarks" / "learn_check_curves.csv"
PNG = common.REPO / "benchmarks" / "learn_check_curves.png"
GOAL_RATIO = 0.9
GOAL_SEEDS = 3
BOOTSTRAP_DRAWS = 10_000


def load_runs(kept: Path) -> list[dict]:
    """Every kept result under `kept` (agent/task/seed_N.json)."""
    return [json.loads(path.read_text()) for path in sorted(Path(kept).glob("*/*/seed_*.json"))]


def _points(settings: Settings) -> list[int]:
    return list(range(0, settings.frames + 1, settings.eval_every_frames))


def _curve(run: dict, points: list[int]) -> list[float] | None:
    """The run's return at each evaluation point; None when one is missing."""
    by_frame = {int(frame): float(value) for frame, value in run["evaluations"]}
    if any(point not in by_frame for point in points):
        return None
    return [by_frame[point] for point in points]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def bootstrap_ratio(ours: list[float], theirs: list[float], seed: int = 0) -> tuple[float, float]:
    """95% interval of mean(ours) / mean(theirs), each agent's seeds resampled."""
    rng = random.Random(seed)
    ratios = sorted(
        _mean(rng.choices(ours, k=len(ours))) / _mean(rng.choices(theirs, k=len(theirs)))
        for _ in range(BOOTSTRAP_DRAWS)
    )
    return ratios[int(0.025 * BOOTSTRAP_DRAWS)], ratios[int(0.975 * BOOTSTRAP_DRAWS) - 1]


def same_settings(saved: dict, settings: Settings) -> bool:
    """Whether a run's saved settings are `settings` (a key it predates: at its default)."""
    try:
        return Settings(**saved) == settings
    except TypeError:  # a key this version does not know
        return False


def compare(runs: list[dict], settings: Settings) -> dict:
    """Per task: each agent's curves and frames/s, and the AUC comparison."""
    points = _points(settings)
    tasks: dict[str, dict] = {}
    for run in runs:
        if not same_settings(run.get("settings", {}), settings):
            continue  # a run at other settings is not part of this comparison
        curve = _curve(run, points)
        if curve is None:
            continue
        agent = tasks.setdefault(run["task"], {}).setdefault(
            run["agent"], {"seeds": [], "curves": [], "fps": [], "versions": run["versions"]}
        )
        agent["seeds"].append(run["seed"])
        agent["curves"].append(curve)
        agent["fps"].append(run["train_frames_per_s"])
    for task, agents in tasks.items():
        for agent in agents.values():
            columns = list(zip(*agent["curves"], strict=True))
            agent["mean"] = [_mean(list(c)) for c in columns]
            agent["min"] = [min(c) for c in columns]
            agent["max"] = [max(c) for c in columns]
            agent["auc"] = [_mean(curve) for curve in agent["curves"]]
            fps = [f for f in agent["fps"] if f]
            agent["train_frames_per_s"] = _mean(fps) if fps else None
        if set(AGENTS) <= set(agents):
            ours, theirs = agents["magi_lp"], agents["official"]
            low, high = bootstrap_ratio(ours["auc"], theirs["auc"])
            final = ours["mean"][-1]
            agents["comparison"] = {
                "auc_ratio": _mean(ours["auc"]) / _mean(theirs["auc"]),
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
            }
        tasks[task] = agents
    return {"points": points, "tasks": tasks}


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


def write(kept: Path, settings: Settings, tiny: bool, out: Path) -> str:
    """Compares the results kept in `kept`; writes the JSON, CSV and PNG (under `out` when
    tiny, else benchmarks/learn_check.json, _curves.csv, _curves.png). Returns a summary."""
    comparison = compare(load_runs(kept), settings)
    json_path, csv_path, png_path = (
        (Path(out) / "learn_check.json", Path(out) / "curves.csv", Path(out) / "curves.png")
        if tiny
        else (JSON, CSV, PNG)
    )
    _write_csv(csv_path, comparison)
    plot = _plot(png_path, comparison, settings)
    result = {
        "status": "ok" if comparison["tasks"] else "skipped",
        "measured_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": common.git_commit(),
        "machine": common.machine(),
        "settings": vars(settings),
        "reduced": settings.reduced(),
        "goal_ratio": GOAL_RATIO,
        "goal_seeds": GOAL_SEEDS,
        **comparison,
    }
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    parts = []
    for task, agents in sorted(comparison["tasks"].items()):
        found = agents.get("comparison")
        if found:
            low, high = found["auc_ratio_95"]
            parts.append(
                f"{task}: AUC ratio {found['auc_ratio']:.3f} [{low:.2f}, {high:.2f}] over "
                f"{found['seeds'][0]} / {found['seeds'][1]} seeds"
            )
        else:
            parts.append(f"{task}: {', '.join(sorted(agents))} only")
    return f"{'; '.join(parts) or 'no finished runs'}; wrote {json_path}, {csv_path}, {plot}"


# -- the figure on BENCHMARKS.md (benchmarks.run reads benchmarks/learn_check.json) --------

TITLE = "Learning check: this DrQ-v2 beside the official one, same settings, one CPU core each"
NOT_MEASURED = "not measured: `make learn-check` has not written benchmarks/learn_check.json"


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    for task, agents in sorted(result["tasks"].items()):
        found = agents.get("comparison")
        if found:
            low, high = found["auc_ratio_95"]
            seeds = found["seeds"]
            return (
                f"{task}: AUC ratio {found['auc_ratio']:.3f} (95% [{low:.2f}, {high:.2f}])",
                f"official DrQ-v2, {seeds[0]} / {seeds[1]} seeds, {result['reduced']}",
                f"goal >= {result['goal_ratio']} with >= {result['goal_seeds']} seeds",
            )
    return "one agent only so far", "", ""


def report(result: dict) -> str:
    """The figure's section: what ran, the table per evaluation point, the verdict."""
    lines = [
        f"Both agents at the same settings ({result['reduced']}; everything else the paper's), "
        "one process pinned to one core each, this project's and the official run of a seed "
        "side by side. Evaluation: 10 episodes of the mean action at 0 and every "
        f"{result['settings']['eval_every_frames']:,} frames. AUC: a run's mean evaluation "
        "return over those points. Training frames/s: episodes after the seed frames that "
        "hold no evaluation, updates included. Curves: `benchmarks/learn_check_curves.png` "
        "and `.csv` (mean, range and each seed).",
        "",
        "![learning curves](benchmarks/learn_check_curves.png)",
        "",
    ]
    points = result["points"]
    for task, agents in sorted(result["tasks"].items()):
        lines += [f"**{task}**", ""]
        header = "| agent | seeds | " + " | ".join(f"{p // 1000}k" for p in points)
        lines += [header + " | AUC | train frames/s | versions |"]
        lines += ["| --- " * (len(points) + 5) + "|"]
        for name in AGENTS:
            agent = agents.get(name)
            if agent is None:
                continue
            cells = [
                f"{m:.0f} ({lo:.0f}-{hi:.0f})"
                for m, lo, hi in zip(agent["mean"], agent["min"], agent["max"], strict=True)
            ]
            fps = agent["train_frames_per_s"]
            versions = ", ".join(f"{k} {v}" for k, v in sorted(agent["versions"].items()))
            lines.append(
                f"| {name} | {len(agent['seeds'])} | " + " | ".join(cells)
                + f" | {_mean(agent['auc']):.0f} | {fps:.1f} | {versions} |"
            )  # fmt: skip
        found = agents.get("comparison")
        if found:
            low, high = found["auc_ratio_95"]
            lo, hi = found["official_final_range"]
            inside = "inside" if found["final_inside_official_range"] else "outside"
            fps_ratio = found["fps_ratio"]
            fps_text = f" Training frames/s ratio: {fps_ratio:.2f}x." if fps_ratio else ""
            lines += [
                "",
                f"AUC ratio (this / official): **{found['auc_ratio']:.3f}**, 95% bootstrap "
                f"interval [{low:.2f}, {high:.2f}] (goal >= {result['goal_ratio']} with >= "
                f"{result['goal_seeds']} seeds per agent). Final mean {found['final_mean']:.0f}: "
                f"{inside} the official seeds' range {lo:.0f}-{hi:.0f}.{fps_text}",
            ]
        lines.append("")
    return "\n".join(lines)
