"""Figure 7 (GPU machines only): GPU memory of every node of the distributed program under its
placement plan, against the same program with no resource specs; how many CPU-inference actors
plus one GPU learner fit on one GPU either way; learner updates/s on the GPU.

  planned  configs/reacher_hard_distributed.py as `lp_main.py` runs it: the plan gives the
           learner the GPU (JAX's default share, or what the config says), actors, evaluator,
           replay, counter and coordinator CUDA_VISIBLE_DEVICES="" (no CUDA context at all).
  plain    the same program, the same nodes, launched with no per-node settings: every node
           inherits a plain environment (all GPUs visible, JAX preallocating 75% of a GPU in
           every process that initialises it, TensorFlow free to take the rest).

Both run the paper's networks at 84x84 with learning after 400 frames; each node's GPU memory is
sampled with `nvidia-smi --query-compute-apps=pid,used_memory` once a second for a fixed window
after the learner's first update (or until the program dies, which is a result too: the plain
program typically loses a node to an out-of-memory error). Processes are matched to nodes by a
variable each launch group gets in its environment (MAGI_LP_BENCH_GROUP).

Learner updates/s on the GPU: figure 1's measurement (batch 256, 84x84x9) in a process with
the plan's learner environment.

On a machine without a GPU the figure is recorded as "not run: no GPU on this machine".
Set MAGI_LP_BENCH_GPU_DRY_RUN=1 to exercise the launch and sampling plumbing on a CPU machine
(memory columns stay empty).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    REPO,
    figure_main,
    fmt,
    gpus,
    marked_env,
    progress,
    started,
    tail,
)

TITLE = "GPU memory per node under the plan vs plain (GPU only)"
CONFIG = "configs/reacher_hard_distributed.py"
GROUP_VAR = "MAGI_LP_BENCH_GROUP"
DRY_RUN_VAR = "MAGI_LP_BENCH_GPU_DRY_RUN"
STARTUP_TIMEOUT_S = 600.0
OVERRIDES = {
    "agent.min_replay_frames": 400,
    "env.video.every_evaluations": 0,
    "logging.tensorboard": False,
    "logging.terminal": False,
    "checkpoint.every_minutes": 1000.0,
    "max_actor_steps": 1_000_000_000,
    "isolation": "off",
}


def subprocess_env() -> dict[str, str]:
    return {"MUJOCO_GL": "egl"}  # sees the GPUs; each launched program sets its own envs


# ---------------------------------------------------------------------------------------
# The program, launched by `python -m benchmarks.gpu_memory launch <variant> <workdir> ...`.


def _load_config(overrides: dict):
    """The config file's `get_config()` with `overrides` (dotted keys) applied."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_config", REPO / CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


def launch_program(variant: str, workdir: str, num_actors: int) -> int:
    """Builds the DrQ-v2 program and launches it with the plan's envs (planned) or none
    (plain); every launch group's env names the group. Returns the launcher's exit code."""
    from absl import flags

    flags.FLAGS([sys.argv[0]], known_only=True)
    from magi_lp.cli import make_plan
    from magi_lp.launch.local import launch
    from magi_lp.runtime.loggers import LoggerFactory
    from magi_lp.runtime.program import build_program
    from projects.drq_v2.experiment import make_experiment

    config = _load_config({**OVERRIDES, "num_actors": num_actors})
    plan = make_plan(config)
    planned = plan.envs()
    if variant == "planned":
        envs = {group: {**env, GROUP_VAR: group} for group, env in planned.items()}
    else:
        # No settings at all: a plain environment in every node (JAX_PLATFORMS="" is
        # JAX's default; the launching shell must not have narrowed it).
        envs = {group: {GROUP_VAR: group, "JAX_PLATFORMS": ""} for group in planned}
    logger_factory = LoggerFactory.from_config(workdir, config.logging)
    experiment = make_experiment(config, workdir=workdir)
    program = build_program(experiment, plan, workdir=workdir, logger_factory=logger_factory)
    return launch(program, envs, log_dir=Path(workdir) / "nodes")


# ---------------------------------------------------------------------------------------
# Sampling.


def _nvidia_smi(*args: str) -> list[list[str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]


def compute_apps() -> dict[int, float]:
    """pid -> MiB of GPU memory, summed over GPUs (nvidia-smi's compute apps)."""
    usage: dict[int, float] = {}
    for row in _nvidia_smi("--query-compute-apps=pid,used_memory"):
        try:
            usage[int(row[0])] = usage.get(int(row[0]), 0.0) + float(row[1])
        except (ValueError, IndexError):
            continue
    return usage


def gpu_totals() -> list[dict]:
    """Per GPU: index, name, MiB used and total."""
    rows = _nvidia_smi("--query-gpu=index,name,memory.used,memory.total")
    return [
        {"index": int(r[0]), "name": r[1], "used_mib": float(r[2]), "total_mib": float(r[3])}
        for r in rows
        if len(r) >= 4
    ]


def _group_of(pid: int, mark: str) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    if f"MAGI_LP_BENCH_MARK={mark}".encode() not in environ:
        return None
    for entry in environ:
        if entry.startswith(f"{GROUP_VAR}=".encode()):
            return entry.split(b"=", 1)[1].decode()
    return None


def _learner_rows(workdir: Path) -> int:
    try:
        return (workdir / "logs" / "learner" / "logs.csv").read_text().count("\n") - 1
    except OSError:
        return 0


def run_variant(variant: str, num_actors: int, window_s: float, root: Path) -> dict:
    """Launches one variant; samples per-node GPU memory over `window_s` after the learner's
    first update (or until the program ends)."""
    workdir = root / variant
    workdir.mkdir(parents=True)
    env = marked_env({"MUJOCO_GL": "egl"})
    mark = env["MAGI_LP_BENCH_MARK"]
    command = [
        sys.executable, "-m", "benchmarks.gpu_memory", "launch", variant, str(workdir),
        str(num_actors),
    ]  # fmt: skip
    log = root / f"{variant}.log"
    before = gpu_totals()
    peaks: dict[str, dict] = {}  # pid -> {"group", "mib"}
    start = time.monotonic()
    first_update_s = None
    window_end = None
    with started(command, env, log) as process:
        while process.poll() is None:
            now = time.monotonic()
            if first_update_s is None and _learner_rows(workdir) > 0:
                first_update_s = now - start
                window_end = now + window_s
            if window_end is not None and now >= window_end:
                break
            if first_update_s is None and now - start > STARTUP_TIMEOUT_S:
                break
            for pid, mib in compute_apps().items():
                group = _group_of(pid, mark)
                if group is None:
                    continue
                peak = peaks.setdefault(str(pid), {"group": group, "mib": 0.0})
                peak["mib"] = max(peak["mib"], mib)
            time.sleep(1.0)
        during = gpu_totals()
        exited = process.poll()
    node_log = tail(log, 30)
    by_group: dict[str, list[float]] = {}
    for peak in peaks.values():
        by_group.setdefault(peak["group"], []).append(peak["mib"])
    return {
        "variant": variant,
        "num_actors": num_actors,
        "first_learner_update_s": first_update_s,
        "program_exit_code_during_window": exited,
        "learner_updates_logged": _learner_rows(workdir),
        "per_group_mib": by_group,
        "gpu_before": before,
        "gpu_during": during,
        "log_tail": node_log if exited not in (None, 0) or first_update_s is None else "",
    }


def learner_rate_on_gpu(root: Path) -> dict:
    """Figure 1's update timing, batch 256 at 84x84x9, in the plan's learner env."""
    from magi_lp.cli import make_plan

    config = _load_config(OVERRIDES)
    plan = make_plan(config)
    learner_env = plan.envs()[plan.launch_group("learner", 0)]
    out = root / "learner.json"
    code = (
        "import json, sys; from benchmarks.learner_updates import measure_size; "
        "r = measure_size(256, 84, 20, 20.0); "
        "import jax; r['device'] = str(jax.devices()[0]); "
        f"open({str(out)!r}, 'w').write(json.dumps(r))"
    )
    with started([sys.executable, "-c", code], marked_env(learner_env), root / "learner.log") as p:
        p.wait(timeout=900)
    if not out.exists():
        raise RuntimeError(f"learner timing failed:\n{tail(root / 'learner.log')}")
    return {**json.loads(out.read_text()), "env": learner_env}


def _fit(run: dict, total_mib: float) -> dict:
    """How many actors fit next to one learner, from the measured per-node usage."""
    groups = run["per_group_mib"]
    learner = max(groups.get("learner", [0.0]) or [0.0])
    others = sum(sum(v) for g, v in groups.items() if g not in ("learner",) and "actor" not in g)
    actor_values = [m for g, v in groups.items() if g.startswith("actor") for m in v]
    per_actor = max(actor_values) if actor_values else 0.0
    free = total_mib - learner - others
    if per_actor <= 0:
        fits = "no GPU limit (actors take no GPU memory; CPU and RAM bound them)"
    else:
        fits = str(max(int(free // per_actor), 0))
    return {
        "learner_mib": learner,
        "per_actor_mib": per_actor,
        "other_nodes_mib": others,
        "actors_that_fit": fits,
    }


def measure(quick: bool) -> dict:
    dry_run = os.environ.get(DRY_RUN_VAR) == "1"
    found = gpus()
    if not found and not dry_run:
        return {"status": "skipped", "reason": "not run: no GPU on this machine"}
    num_actors = 2 if quick else 4
    window = 15.0 if quick else 45.0
    total_mib = found[0]["memory_gib"] * 1024 if found else 0.0
    result: dict = {"gpus": found, "dry_run": dry_run, "num_actors": num_actors, "window_s": window}
    with tempfile.TemporaryDirectory(prefix="magi_lp_bench_gpu_") as root:
        for variant in ("planned", "plain"):
            progress(f"{variant}: launching with {num_actors} actors")
            run = run_variant(variant, num_actors, window, Path(root))
            if variant == "planned" and run["first_learner_update_s"] is None:
                # The plan must work; the plain program failing is a result, this is not.
                raise RuntimeError(f"the planned program never updated:\n{run['log_tail']}")
            run["fit"] = _fit(run, total_mib)
            if run["program_exit_code_during_window"] not in (None, 0):
                # Typically an out-of-memory error in the plain program: fewer fit than ran.
                run["fit"]["actors_that_fit"] = (
                    f"< {num_actors}: the program lost a node (see the log tail)"
                )
            result[variant] = run
            progress(f"  per-group MiB: {run['per_group_mib']}")
        if found:
            progress("learner updates/s on the GPU (plan's learner env)")
            result["learner_on_gpu"] = learner_rate_on_gpu(Path(root))
    return result


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    planned, plain = result["planned"]["fit"], result["plain"]["fit"]
    used = sum(sum(v) for v in result["planned"]["per_group_mib"].values())
    plain_used = sum(sum(v) for v in result["plain"]["per_group_mib"].values())
    rate = result.get("learner_on_gpu", {}).get("updates_per_second")
    return (
        f"{fmt(used, 0)} MiB on GPU under the plan; actors that fit: "
        f"{planned['actors_that_fit']}; {fmt(rate, 1)} updates/s",
        f"{fmt(plain_used, 0)} MiB plain; actors that fit: {plain['actors_that_fit']}",
        fmt(used / plain_used if plain_used else None, 3),
    )


def report(result: dict) -> str:
    lines = []
    if result.get("dry_run"):
        lines += ["**Dry run on a machine without a GPU**: memory columns are empty.", ""]
    lines += [
        "| variant | group | nodes on the GPU | MiB per node (peak) | first learner update "
        "| program still up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant in ("planned", "plain"):
        run = result[variant]
        groups = run["per_group_mib"] or {"(no node on a GPU)": []}
        for group, values in sorted(groups.items()):
            lines.append(
                f"| {variant} | {group} | {len(values)} "
                f"| {', '.join(fmt(v, 0) for v in values) or '-'} "
                f"| {fmt(run['first_learner_update_s'])} s "
                f"| {'yes' if run['program_exit_code_during_window'] is None else 'no'} |"
            )
    lines += [
        "",
        "| variant | learner MiB | MiB per actor | other nodes MiB | actors that fit "
        "| GPU used before -> during (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant in ("planned", "plain"):
        fit = result[variant]["fit"]
        before = sum(g["used_mib"] for g in result[variant]["gpu_before"])
        during = sum(g["used_mib"] for g in result[variant]["gpu_during"])
        lines.append(
            f"| {variant} | {fmt(fit['learner_mib'], 0)} | {fmt(fit['per_actor_mib'], 0)} "
            f"| {fmt(fit['other_nodes_mib'], 0)} | {fit['actors_that_fit']} "
            f"| {fmt(before, 0)} -> {fmt(during, 0)} |"
        )
    lines += [
        "",
        "If no node shows up while the GPU's used memory grows, nvidia-smi reports pids "
        "this process cannot see (a container's pid namespace): read the totals.",
    ]
    learner = result.get("learner_on_gpu")
    if learner:
        lines += [
            "",
            f"Learner on the GPU ({learner.get('device')}, plan's learner env): "
            f"**{fmt(learner['updates_per_second'], 1)} updates/s** at batch 256, 84x84x9 "
            f"(compile {fmt(learner['compile_s'], 1)} s); the paper's V100: 24 updates/s.",
        ]
    for variant in ("planned", "plain"):
        if result[variant].get("log_tail"):
            lines += [
                "",
                f"{variant} launcher log tail:",
                "```",
                result[variant]["log_tail"],
                "```",
            ]
    lines += [
        "",
        f"How: `{CONFIG}` with {result['num_actors']} actors, "
        + " ".join(f"{k}={v}" for k, v in OVERRIDES.items())
        + f"; GPU memory per process from nvidia-smi every second for {fmt(result['window_s'], 0)}"
        " s after the learner's first update; processes matched to nodes by an env marker. "
        "Actors that fit = (GPU total - learner - other nodes) / per-actor peak.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "launch":
        sys.exit(launch_program(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    figure_main(measure)
