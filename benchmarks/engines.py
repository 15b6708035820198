"""`make run`'s program on both engines, alternating: Launchpad (Python 3.10, .venv) and Ray
(Python 3.12, .venv312), on this CPU (figure 14 of BENCHMARKS.md).

Each run is `projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py` (what
`make run` launches: DrQ-v2 at the paper's settings) with the device store at
`agent.replay_buffer_size` = 100,000 (both engines carry it: Launchpad through a Reverb step
queue, Ray through the served one), `--launcher local` or `--launcher ray`, and network
isolation off on both (the same processes, nothing else in between). Per run:

- launch -> first update: command start to the learner's first CSV row (written after its
  first update);
- the learner's updates/s: from the launcher's `status.csv` (learner steps over time) over a
  fixed window after the first update;
- the whole run's RSS: the sum over nodes, largest sample, from the same CSV (every node's
  process: Ray's own GCS, raylet and driver are not nodes and are counted apart, from the
  marked processes' RSS sampled at the window's end);
- stop: SIGTERM to the command, then the launcher's "nodes ended X s after the stop began"
  and the command's own exit.

The two stacks run different JAX builds (0.4.30 and 0.11.2), so the update alone is timed on
each (benchmarks/learn_check/update_cost.py, CPU seconds per update at 84x84, batch 256):
the engine's share of the ratio is the ratio divided by the update-alone ratio.

    python -m benchmarks.run --only engines
"""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks import common
from benchmarks.common import MARK_VAR, REPO, fmt, median, ratio
from magi_lp.runtime.workdir import Workdir

TITLE = "The same program on Launchpad and on Ray: updates/s, launch, stop, RSS"
CONFIG = "configs/reacher_hard_distributed.py"
CAPACITY = 100_000
GOAL = 0.95
ENGINES = {"launchpad": (".venv", "local"), "ray": (".venv312", "ray")}
FIRST_UPDATE_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 300.0


def _python(venv: str) -> str:
    return str(REPO / venv / "bin" / "python")


def _run(engine: str, window_s: float, workdir: Path, overrides: list[str]) -> dict:
    venv, launcher = ENGINES[engine]
    env = common.marked_env({"PYTHONUNBUFFERED": "1"})
    env.pop("RAY_ADDRESS", None)
    mark = env[MARK_VAR]
    command = [
        _python(venv),
        str(REPO / "projects/drq_v2/lp_main.py"),
        f"--config={REPO / CONFIG}",
        f"--workdir={workdir}",
        f"--launcher={launcher}",
        "--config.isolation=off",
        "--config.replay.store=device",
        f"--config.agent.replay_buffer_size={CAPACITY}",
        "--status_every=5",
        *overrides,
    ]
    log = workdir.parent / f"{workdir.name}.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    learner_csv = Workdir(workdir).log_csv("learner")
    first_update_s = None
    while time.monotonic() - start < FIRST_UPDATE_TIMEOUT_S and process.poll() is None:
        if learner_csv.exists() and len(learner_csv.read_text().splitlines()) > 1:
            first_update_s = time.monotonic() - start
            break
        time.sleep(0.2)
    if first_update_s is not None:
        time.sleep(window_s)
    other_rss = _other_rss_mib(mark)
    stop_at = time.monotonic()
    # SIGTERM, not SIGINT: a command started in the background of a non-interactive shell
    # inherits SIGINT ignored, and the launcher keeps it so (by design); both engines' SIGINT
    # stops went unanswered that way in the first two runs of this figure and were killed.
    exit_s = common.stop(process, signal.SIGTERM, timeout_s=STOP_TIMEOUT_S)
    leftover = common.kill_marked(mark)
    output = log.read_text(errors="replace")
    match = re.search(
        r"nodes ended ([\d.]+) s after the stop began(?: \(stages: [^)]*\))?; exit code (\d+)",
        output,
    )
    rows = _status_rows(Workdir(workdir).status_csv)
    result = {
        "engine": engine,
        "first_update_s": first_update_s,
        "updates_per_s": _updates_per_s(rows, window_s),
        "node_rss_mib": max((_rss(row) for row in rows), default=None),
        "other_rss_mib": other_rss,
        "stop_s": float(match.group(1)) if match else None,
        "exit_code": int(match.group(2)) if match else process.returncode,
        "exit_after_sigint_s": exit_s,
        "sigkilled": "killing them" in output,
        "leftover": leftover,
        "stopped_at_s": round(stop_at - start, 1),
    }
    if first_update_s is None:
        result["error"] = output[-2000:]
    return result


def _other_rss_mib(mark: str) -> float:
    """RSS of the run's processes that are not nodes (Ray's GCS, raylet, dashboard, driver;
    Launchpad's launcher), at the end of the window: every marked process whose stdout is not
    a node log."""
    from magi_lp.launch import processes

    total = 0
    for proc in processes.processes_marked(MARK_VAR, mark):
        try:
            if "/nodes/" in psutil.os.readlink(f"/proc/{proc.pid}/fd/1"):
                continue
            total += proc.memory_info().rss
        except (OSError, psutil.Error):
            continue
    return total / 2**20


def _status_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _updates_per_s(rows: list[dict], window_s: float) -> float | None:
    """Learner steps over the last `window_s` of samples (the window after the first update)."""
    points = [
        (float(r["elapsed_s"]), float(r["learner_steps"])) for r in rows if r.get("learner_steps")
    ]
    if len(points) < 2:
        return None
    end_t, end_steps = points[-1]
    inside = [p for p in points if p[0] >= end_t - window_s]
    start_t, start_steps = inside[0]
    if end_t <= start_t:
        return None
    return (end_steps - start_steps) / (end_t - start_t)


def _rss(row: dict) -> float:
    return sum(float(v) for k, v in row.items() if k.endswith(":rss_mib") and v)


def _update_cost(engine: str, updates: int) -> dict:
    venv, _ = ENGINES[engine]
    command = [
        _python(venv),
        "-m",
        "benchmarks.learn_check.update_cost",
        "--agent",
        "magi_lp",
        "--image-size",
        "84",
        "--batch-size",
        "256",
        "--updates",
        str(updates),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stdout + done.stderr)[-1500:]}


def _versions(engine: str) -> dict:
    venv, _ = ENGINES[engine]
    code = (
        "import importlib.metadata as m, json, sys; "
        "names = ['jax', 'jaxlib', 'dm-launchpad', 'dm-reverb', 'ray']; "
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except Exception: pass\n"
        "out['python'] = sys.version.split()[0]; print(json.dumps(out))"
    )
    done = subprocess.run([_python(venv), "-c", code], capture_output=True, text=True)
    return json.loads(done.stdout.strip() or "{}")


def measure(quick: bool) -> dict:
    rounds = 1 if quick else 2
    window_s = 60.0 if quick else 240.0
    overrides = ["--config.env.image_size=32", "--config.agent.batch_size=32"] if quick else []
    runs: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
    with tempfile.TemporaryDirectory(prefix="magi_lp_engines_") as folder:
        for round_index in range(rounds):
            order = list(ENGINES) if round_index % 2 == 0 else list(reversed(ENGINES))
            for engine in order:
                common.progress(f"round {round_index + 1}: {engine}")
                workdir = Path(folder) / f"{engine}_{round_index}"
                runs[engine].append(_run(engine, window_s, workdir, overrides))
                common.progress(f"{engine}: {runs[engine][-1]}")
    costs = {engine: _update_cost(engine, 3 if quick else 10) for engine in ENGINES}

    def med(engine: str, key: str) -> float | None:
        values = [r[key] for r in runs[engine] if r.get(key) is not None]
        return median(values) if values else None

    raw = ratio(med("ray", "updates_per_s"), med("launchpad", "updates_per_s"))
    alone = ratio(
        costs["launchpad"].get("cpu_seconds_per_update"), costs["ray"].get("cpu_seconds_per_update")
    )
    return {
        "runs": runs,
        "update_alone": costs,
        "versions": {engine: _versions(engine) for engine in ENGINES},
        "window_s": window_s,
        "rounds": rounds,
        "settings": "reduced (32x32, batch 32)" if quick else "make run's (84x84, batch 256)",
        "updates_per_s": {e: med(e, "updates_per_s") for e in ENGINES},
        "first_update_s": {e: med(e, "first_update_s") for e in ENGINES},
        "stop_s": {e: med(e, "stop_s") for e in ENGINES},
        "node_rss_mib": {e: med(e, "node_rss_mib") for e in ENGINES},
        "ratio": raw,
        "update_alone_ratio": alone,
        "engine_ratio": ratio(raw, alone) if raw is not None and alone else None,
        "goal_ratio": GOAL,
    }


def summary(result: dict) -> tuple[str, str, str]:
    ups = result["updates_per_s"]
    return (
        f"{fmt(ups['ray'], 2)} learner updates/s on Ray",
        f"{fmt(ups['launchpad'], 2)} on Launchpad, same program and CPU; goal >= {GOAL}x",
        fmt(result["ratio"], 2),
    )


def report(result: dict) -> str:
    versions = result["versions"]
    lines = [
        f"Learner updates/s, Ray / Launchpad: **{fmt(result['ratio'], 2)}** (goal >= "
        f"{result['goal_ratio']}); the update alone is {fmt(result['update_alone_ratio'], 2)}x "
        "as fast on the Ray stack's JAX, so the engine's own share is "
        f"**{fmt(result['engine_ratio'], 2)}**. Settings: {result['settings']}, device store of "
        f"{CAPACITY:,} transitions, isolation off, {result['rounds']} round(s) alternating, "
        f"updates/s over {fmt(result['window_s'], 0)} s after the first update; medians.",
        "",
        "| engine | stack | launch -> first update | learner updates/s | nodes' RSS (max) | "
        "the run's other processes' RSS | stop (nodes ended) | exit after the signal | a node "
        "killed at its notice | left |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for engine, runs in result["runs"].items():
        stack = ", ".join(f"{k} {v}" for k, v in versions.get(engine, {}).items())
        for run in runs:
            lines.append(
                f"| {engine} | {stack} | {fmt(run.get('first_update_s'))} s "
                f"| {fmt(run.get('updates_per_s'), 2)} | {fmt(run.get('node_rss_mib'), 0)} MiB "
                f"| {fmt(run.get('other_rss_mib'), 0)} MiB | {fmt(run.get('stop_s'))} s "
                f"| {fmt(run.get('exit_after_sigint_s'))} s | {run.get('sigkilled')} "
                f"| {len(run.get('leftover') or [])} |"
            )
    stop_runs = result.get("stop_runs") or []
    if stop_runs:
        lines += [
            "",
            "The rows above were stopped with SIGINT, which the command had inherited ignored "
            "(started in the background of a non-interactive shell): each was killed after "
            f"{fmt(STOP_TIMEOUT_S, 0)} s. The stop, measured again with SIGTERM 20 s after the "
            f"first update (commit {result.get('stop_runs_commit', '?')}):",
            "",
            "| engine | stop (nodes ended) | exit after SIGTERM | exit code | left |",
            "| --- | --- | --- | --- | --- |",
        ]
        for run in stop_runs:
            lines.append(
                f"| {run['engine']} | {fmt(run.get('stop_s'))} s "
                f"| {fmt(run.get('exit_after_sigint_s'))} s | {run.get('exit_code')} "
                f"| {len(run.get('leftover') or [])} |"
            )
    cost = {e: c.get("cpu_seconds_per_update") for e, c in result["update_alone"].items()}
    lines += [
        "",
        "The update alone (benchmarks/learn_check/update_cost.py, CPU seconds per update at "
        f"84x84, batch 256): Launchpad stack {fmt(cost['launchpad'], 2)} s, Ray stack "
        f"{fmt(cost['ray'], 2)} s.",
    ]
    return "\n".join(lines)


def measure_stops(window_s: float = 20.0) -> list[dict]:
    """One more run per engine, stopped with SIGTERM 20 s after its first update: the stop
    times the figure's first runs lost to an inherited-ignored SIGINT."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="magi_lp_engines_") as folder:
        for engine in ENGINES:
            common.progress(f"stop run: {engine}")
            runs.append(_run(engine, window_s, Path(folder) / f"{engine}_stop", []))
            common.progress(f"{engine}: {runs[-1]}")
    return runs


def _stops_into(results_path: Path) -> None:
    """`python -m benchmarks.engines stops`: the stop runs, added to the stored figure."""
    results = json.loads(results_path.read_text())
    figures = results.get("figures", results)
    entry = figures["engines"]
    target = entry.get("result", entry)
    target["stop_runs"] = measure_stops()
    target["stop_runs_commit"] = common.git_commit()
    results_path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["stops"]:
        _stops_into(REPO / "benchmarks" / "results.json")
    else:
        common.figure_main(measure)
