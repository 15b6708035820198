"""Figure 4: launch latency, command start -> first learner update, against a bare Launchpad
program with the same nodes that only import the libraries.

  program  `python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py`
           with tiny settings (32x32 pixels, small networks, learning after 40 frames, short
           episodes; the same 9 nodes: replay, counter, learner, 4 actors, evaluator,
           coordinator). "First learner update" = the learner's CSV log gets its first row,
           which the learner writes right after its first update. Then the launcher gets
           SIGINT; the figure records how long it took to exit and whether any process of
           the program was left (found by a marker variable every process inherits).
  bare     a Launchpad program (plain `lp.launch`, LOCAL_MULTI_PROCESSING, output_to_files)
           with the same launch groups, node counts and per-group environments from the
           same placement plan, where every node imports tensorflow, jax, reverb, haiku and
           dm_control.suite, then writes a ready file. Latency = command start -> all ready.

Ratio = program / bare; goal <= 1.2. Both with network isolation off (the bare program has
none); full mode also times the program with isolation=auto.

Breakdown: each program run's node logs (`<workdir>/nodes/<group>/<index>`) are read for the
milestones the nodes log with a time of day, as seconds after the command started: nodes
started (the launcher's line), learner serving (its Courier server binds `get_variables`),
actors' policy compiled, learner built, first parameters at the actors, first replay item,
update compiled, first batch at the learner; then the first update (the CSV row).
"""

from __future__ import annotations

import datetime
import importlib.util
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    REPO,
    cpu_only_env,
    entry_point,
    figure_main,
    fmt,
    kill_marked,
    marked_env,
    median,
    progress,
    ratio,
    stop,
    tail,
)
from magi_lp.runtime.workdir import Workdir
from projects.drq_v2 import tiny

TITLE = "Launch latency: command start -> first learner update"
CONFIG = "configs/reacher_hard_distributed.py"
GOAL = 1.2
TIMEOUT_S = 420.0
POLL_S = 0.05

# The tiny DrQ-v2 settings, without evaluations or checkpoints getting in the way, run until
# SIGINT; with shadows, as the stored figures were measured (before tiny.py turned them off).
TINY = tiny.flags(
    {
        "env.render_shadows": True,
        "env.video.every_evaluations": 0,
        "evaluation.every_actor_steps": 1000000,
        "checkpoint.every_minutes": 1000.0,
        "max_actor_steps": 1000000000,
    }
)


def subprocess_env() -> dict[str, str]:
    return cpu_only_env()


# ---------------------------------------------------------------------------------------
# The bare program (runs as `python -m benchmarks.launch_latency bare <ready_dir>`).


def bare_node(ready_dir: str, name: str) -> None:
    """A node that imports what the program's nodes import, says so, and waits."""
    import haiku  # noqa: F401
    import jax  # noqa: F401
    import reverb  # noqa: F401
    import tensorflow  # noqa: F401
    from dm_control import suite  # noqa: F401

    path = Path(ready_dir) / name
    path.with_suffix(".tmp").write_text(f"{time.time()}\n")
    path.with_suffix(".tmp").rename(path)
    import launchpad as lp

    lp.wait_for_stop()


def _load_config(path: str):
    """The config, its 'auto' actor counts sized to this machine as lp_main.py sizes them."""
    from magi_lp.runtime.config import resolve_actor_counts

    spec = importlib.util.spec_from_file_location("bench_config", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return resolve_actor_counts(module.get_config())[0]


def run_bare(ready_dir: str) -> None:
    """Builds and launches the bare program with the real program's plan; waits for it."""
    from absl import flags

    flags.FLAGS([sys.argv[0]], known_only=True)
    import launchpad as lp
    from launchpad.nodes.python.local_multi_processing import PythonProcess

    from magi_lp.runtime.config import make_placement_plan, placement_requests

    config = _load_config(CONFIG)
    plan = make_placement_plan(config)
    groups = {group: request.num_nodes for group, request in placement_requests(config).items()}
    program = lp.Program("bare")
    for group, count in groups.items():
        for index in range(count):
            with program.group(plan.launch_group(group, index)):
                program.add_node(lp.PyNode(bare_node, ready_dir, f"{group}_{index}"))
    manager = lp.launch(
        program,
        launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING,
        local_resources={name: PythonProcess(env=env) for name, env in plan.envs().items()},
        terminal="output_to_files",
    )
    manager.wait()


# ---------------------------------------------------------------------------------------
# Timing.


# ---------------------------------------------------------------------------------------
# The breakdown, from the node logs.

# (milestone, node group or None for all, pattern, first or last occurrence across nodes)
MILESTONES = (
    ("learner_serving", "learner", r"Binding: get_variables", "first"),
    ("policies_compiled", None, r"policy compiled in", "last"),
    ("learner_built", "learner", r"learner built in", "first"),
    ("update_compiled", "learner", r"update compiled ahead", "first"),
    ("first_parameters_at_actors", "actor", r"first parameters fetched", "first"),
    ("all_actors_have_parameters", "actor", r"first parameters fetched", "last"),
    ("first_replay_item", "actor", r"first item sent", "first"),
    ("first_batch_at_learner", "learner", r"first batch sampled", "first"),
)
MILESTONE_LABELS = {
    "nodes_started_s": "launcher: nodes started",
    "learner_serving": "learner serving (Courier up)",
    "policies_compiled": "all actors' policies compiled",
    "learner_built": "learner built (parameters exist)",
    "first_parameters_at_actors": "first parameters at an actor",
    "all_actors_have_parameters": "first parameters at every actor",
    "first_replay_item": "first replay item",
    "first_batch_at_learner": "first batch at the learner",
    "update_compiled": "learner update compiled",
    "seconds": "first learner update",
}
# `I1123 01:41:52.798562 ...` (absl) or `[magi_lp.learner 01:41:52.798] ...` (magi_lp.console).
_STAMP = re.compile(r"^(?:I\d{4} |\[magi_lp\.\S* )(\d\d):(\d\d):(\d\d\.\d+)")


def _seconds_after(line: str, start_wall: float) -> float | None:
    """Seconds from `start_wall` (epoch) to the time of day stamped on `line`."""
    match = _STAMP.match(line)
    if not match:
        return None
    hours, minutes, seconds = int(match[1]), int(match[2]), float(match[3])
    start = datetime.datetime.fromtimestamp(start_wall)
    midnight = start.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    offset = midnight + hours * 3600 + minutes * 60 + seconds - start_wall
    return offset + 86400 if offset < -3600 else offset  # the run crossed midnight


def node_milestones(nodes_dir: Path, start_wall: float) -> dict[str, float]:
    """Milestone -> seconds after `start_wall`, from the node logs under `nodes_dir`."""
    found: dict[str, list[float]] = {}
    for log in sorted(nodes_dir.glob("*/*")):
        group = log.parent.name
        for line in _text(log).splitlines():
            for name, wanted_group, pattern, _ in MILESTONES:
                if wanted_group not in (None, group) or not re.search(pattern, line):
                    continue
                seconds = _seconds_after(line, start_wall)
                if seconds is not None:
                    found.setdefault(name, []).append(seconds)
    picks = {name: pick for name, _, _, pick in MILESTONES}
    return {
        name: (min(times) if picks[name] == "first" else max(times))
        for name, times in found.items()
    }


def _wait_for(condition, process, deadline: float) -> float | None:
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        if process.poll() is not None:
            return None
        time.sleep(POLL_S)
    return None


def _launch(
    command: list[str],
    extra_env: dict,
    log: Path,
    ready,
    describe: str,
    milestone=lambda: False,
) -> dict:
    """Runs `command` until `ready()` (noting when `milestone()` first holds); then SIGINT,
    and checks that nothing is left."""
    import subprocess

    env = marked_env({**cpu_only_env(), **extra_env})
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        start = time.monotonic()
        start_wall = time.time()
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    result: dict = {"what": describe}
    try:
        started_at = None
        milestone_at = None
        ready_at = None
        deadline = start + TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            now = time.monotonic()
            if started_at is None and "started " in _text(log):
                started_at = now
            if milestone_at is None and milestone():
                milestone_at = now
            if ready():
                ready_at = now
                break
            time.sleep(POLL_S)
        if ready_at is None:
            state = "exited" if process.poll() is not None else f"not ready in {TIMEOUT_S:.0f} s"
            raise RuntimeError(f"{describe}: {state}; log tail:\n{tail(log)}")
        result["seconds"] = ready_at - start
        if started_at is not None:
            result["nodes_started_s"] = started_at - start
        if milestone_at is not None:
            result["first_actor_episode_s"] = milestone_at - start
        result["start_wall"] = start_wall
    finally:
        exit_s = stop(process, signal.SIGINT, timeout_s=60.0)
        result["exit_after_sigint_s"] = exit_s
        result["returncode"] = process.returncode
        time.sleep(1.0)
        leftovers = kill_marked(env["MAGI_LP_BENCH_MARK"])
        result["leftover_processes"] = len(leftovers)
    return result


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def time_program(workdir: Path, isolation: str) -> dict:
    learner_csv = Workdir(workdir).log_csv("learner")

    def first_update() -> bool:
        return _text(learner_csv).count("\n") >= 2  # header + first row

    def first_actor_episode() -> bool:
        return _text(Workdir(workdir).log_csv("actor_0")).count("\n") >= 2

    command = entry_point(
        "projects/drq_v2/lp_main.py", CONFIG, workdir, *TINY, f"--config.isolation={isolation}"
    )
    result = _launch(
        command,
        {},
        workdir / "launcher.log",
        first_update,
        f"program ({isolation})",
        milestone=first_actor_episode,
    )
    result["milestones"] = node_milestones(Workdir(workdir).nodes, result.pop("start_wall"))
    return result


def time_bare(folder: Path, nodes: int) -> dict:
    ready_dir = folder / "ready"
    ready_dir.mkdir(parents=True)

    def all_ready() -> bool:
        return sum(1 for p in ready_dir.iterdir() if p.suffix != ".tmp") >= nodes

    command = [sys.executable, "-m", "benchmarks.launch_latency", "bare", str(ready_dir)]
    env = {"LAUNCHPAD_LOGGING_DIR": str(folder / "nodes")}
    result = _launch(command, env, folder / "launcher.log", all_ready, "bare program")
    result.pop("start_wall")
    return result


def measure(quick: bool) -> dict:
    from magi_lp.launch import isolation
    from magi_lp.placement.host_memory import node_counts

    config = _load_config(CONFIG)
    groups = node_counts(config)
    nodes = sum(groups.values())
    rounds = 1 if quick else 2
    runs: dict[str, list[dict]] = {"bare": [], "program_off": [], "program_auto": []}
    with tempfile.TemporaryDirectory(prefix="magi_lp_bench_launch_") as root:
        for index in range(rounds):
            progress(f"round {index + 1}: bare program ({nodes} nodes)")
            runs["bare"].append(time_bare(Path(root) / f"bare{index}", nodes))
            progress(f"  all ready after {runs['bare'][-1]['seconds']:.1f} s")
            progress(f"round {index + 1}: program, isolation off")
            runs["program_off"].append(time_program(Path(root) / f"off{index}", "off"))
            progress(f"  first learner update after {runs['program_off'][-1]['seconds']:.1f} s")
        if not quick:
            progress("program, isolation auto")
            runs["program_auto"].append(time_program(Path(root) / "auto", "auto"))
            progress(f"  first learner update after {runs['program_auto'][-1]['seconds']:.1f} s")
    bare = median([r["seconds"] for r in runs["bare"]])
    program = median([r["seconds"] for r in runs["program_off"]])
    auto = median([r["seconds"] for r in runs["program_auto"]]) if runs["program_auto"] else None
    return {
        "groups": groups,
        "nodes": nodes,
        "rounds": rounds,
        "isolation_auto": isolation.describe("auto"),
        "bare_s": bare,
        "program_s": program,
        "program_auto_s": auto,
        "ratio": ratio(program, bare),
        "ratio_auto": ratio(auto, bare),
        "goal_ratio": GOAL,
        "runs": runs,
    }


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    return (
        f"{fmt(result['program_s'])} s to the first learner update (tiny settings)",
        f"{fmt(result['bare_s'])} s bare Launchpad program, same nodes; goal <= {GOAL}x",
        fmt(result["ratio"], 2),
    )


def breakdown(run: dict) -> dict[str, float]:
    """A program run's milestones in time order (seconds after the command started)."""
    times = {**run.get("milestones", {}), "seconds": run["seconds"]}
    if run.get("nodes_started_s") is not None:
        times["nodes_started_s"] = run["nodes_started_s"]
    return dict(sorted(times.items(), key=lambda item: item[1]))


def breakdown_table(runs: list[dict]) -> list[str]:
    """Markdown rows: each milestone's time in each program run (isolation off)."""
    if not runs or not any(run.get("milestones") for run in runs):
        return []
    order = list(breakdown(runs[0]))
    names = order + [n for run in runs[1:] for n in breakdown(run) if n not in order]
    lines = [
        "Where the time goes (seconds after the command started, from the node logs):",
        "",
        "| milestone | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |",
        "| --- |" + " --- |" * len(runs),
    ]
    for name in names:
        cells = [fmt(breakdown(run).get(name)) for run in runs]
        lines.append(f"| {MILESTONE_LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    return lines


def report(result: dict) -> str:
    runs = result["runs"]
    lines = [
        f"**{fmt(result['program_s'])} s** from command to the first learner update (tiny "
        f"settings, isolation off) against **{fmt(result['bare_s'])} s** for a bare "
        f"Launchpad program whose {result['nodes']} nodes only import the libraries: ratio "
        f"**{fmt(result['ratio'], 2)}** (goal <= {result['goal_ratio']}).",
        "",
        '| run | seconds to ready | launcher printed "started" | actor_0\'s first episode '
        "| exit after SIGINT | exit code | processes left |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("bare", "program_off", "program_auto"):
        for run in runs.get(name, []):
            lines.append(
                f"| {run['what']} | {fmt(run['seconds'])} | {fmt(run.get('nodes_started_s'))} "
                f"| {fmt(run.get('first_actor_episode_s'))} "
                f"| {fmt(run['exit_after_sigint_s'])} s | {run['returncode']} "
                f"| {run['leftover_processes']} |"
            )
    lines += ["", *breakdown_table(runs.get("program_off", []))]
    if result.get("program_auto_s") is not None:
        lines += [
            "",
            f"With isolation=auto ({result['isolation_auto']}; one run): "
            f"{fmt(result['program_auto_s'])} s, ratio {fmt(result['ratio_auto'], 2)}.",
        ]
    groups = ", ".join(f"{g} x{n}" for g, n in result["groups"].items())
    lines += [
        "",
        f"How: nodes {groups}. Program: `projects/drq_v2/lp_main.py --config {CONFIG}` with "
        "`" + " ".join(a.replace("--config.", "") for a in TINY) + "`; ready = first row in "
        "`logs/learner/logs.csv` (written after the first update, which needs the actors "
        "to fill 20 agent steps of replay and the learner to compile its update). Bare: "
        "plain `lp.launch` with the same launch groups and per-group env (the plan's), "
        "every node importing tensorflow, jax, reverb, haiku, dm_control.suite, then "
        "writing a file; ready = all files. Actor_0's first episode = first row of its CSV log "
        "(an episode is 50 agent steps here). Polled every 50 ms; "
        f"{result['rounds']} round(s) alternating, medians. Stopped with SIGINT; "
        "leftovers are found by a marker variable in every process's environment.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "bare":
        run_bare(sys.argv[2])
    else:
        figure_main(measure)
