"""The whole system on a GPU: the distributed DrQ-v2 on Ray for a fixed time. `make gpu-system`.

On a GPU machine (issue 36): `projects/drq_v2/lp_main.py --launcher ray` on cartpole_balance at
the paper's settings (84x84, batch 256, the task's replay of 1M transitions: the device store on
the GPU), laid out as `configs/reacher_hard_gpu_layouts.py:1gpu` places nodes on one GPU (the
learner on it, actor processes of 8 environments each stepping on CPU cores and acting on the
GPU, as many as the layout's `num_actors='auto'` gives this machine, as lp_main sizes them, and
the evaluator on the CPU), for `--minutes` after every node is up, then SIGINT to the driver.
Figure 15's first row had 2 actors of 8 (`--actors 2 --envs-per-actor 8` measures it again). In
order:

1. the plan as `lp_main.py` makes it, with `gpu_memory='auto'` reckoned (what `--dry_run`
   prints; the reckoning is handed to the run through the environment, so it compiles once);
2. the update alone on the same GPU: `benchmarks.gpu_check`'s learner worker (the jitted
   DrQ-v2 update at batch 256, 84x84x9, a batch already on the device) in the learner's env;
3. the system, sampled every 2 s: NVML's GPU memory of every process (by pid), and the
   launcher's own `status.csv` (frames, learner steps, replay, and each node's CPU and NVML
   GPU memory every 5 s).

Measured: whole-system training frames/s; the learner's updates/s against the update alone
("fed", goal >= 0.95) and what bounds it (the learner's update, the actors, the relay); each
node's peak GPU memory against its reckoning plus a CUDA context (goal within 15%); the
evaluation returns against the official agent's published curves at the same frames
(`benchmarks/reference/drqv2_official_curves.csv`); and, where the learner is starved, where
its time goes: its wait for a batch (the learner's `batch_wait_fraction`), the rate the replay
ratio allows at the actors' rate (one update per `update_every_steps` actor steps), each node's
CPU. The result (JSON) names the GPU, the driver, JAX and PyTorch beside every number; `python
-m benchmarks.run --only gpu_system` renders it into BENCHMARKS.md from
`benchmarks/gpu_system.json`, and only from a GPU result.

Without a GPU (or with `--tiny`) it says so in one line and runs the same code path at a tiny
size on the CPU (32x32 pixels, batch 16, small networks, one actor of 2 environments, seconds
instead of minutes, the learner on the CPU), writing to the git-ignored
`benchmarks/logs/gpu_system.json`: a check of the command (tests/test_gpu_system.py), never a
figure.

    python -m benchmarks.gpu_system [--minutes 4] [--budget-s 490] [--out FILE] [--tiny]

This file is also the run's config file (`--config benchmarks/gpu_system.py:gpu|tiny`): its
module level imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from magi_lp.launch.files import write_text_atomically
from magi_lp.placement.jax_build import installed_version
from magi_lp.runtime.evaluations import number

REPO = Path(__file__).resolve().parents[1]
TITLE = "The whole system on one GPU: distributed DrQ-v2 on Ray (frames/s, learner fed, memory)"
RESULT = REPO / "benchmarks" / "gpu_system.json"
UNMEASURED = REPO / "benchmarks" / "logs" / "gpu_system.json"  # git-ignored
NOT_MEASURED = (
    "not measured on a GPU yet: `make gpu-system` (benchmarks/gpu_system.py) is ready, with its "
    "device call in benchmarks/README.md; only its tiny CPU run has run (tests/test_gpu_system.py)"
)
TASK = "cartpole_balance"
LAYOUT = ("configs/reacher_hard_gpu_layouts.py", "1gpu")
REFERENCE = REPO / "benchmarks" / "reference" / "drqv2_official_curves.csv"
REFERENCE_SOURCE = "facebookresearch/drqv2 at c0c650b, curves/dmc_cartpole_balance.csv"
FED_GOAL = 0.95
MEMORY_GOAL = 0.15
SAMPLE_EVERY_S = 2.0
LP_MAIN = REPO / "projects" / "drq_v2" / "lp_main.py"
LP_MAIN_WRAPPER = REPO / "benchmarks" / "gpu_system_lp_main.py"
DRIVERS = ("auto", "lp_main", "wrapper")
UP_LINE = "Ray and every node up"
# The update alone: seconds of its worker (three timings of a third each), and how long it may
# take with its compile.
UPDATE_SECONDS = {"gpu": 15.0, "tiny": 3.0}
UPDATE_TIMEOUT_S = {"gpu": 150.0, "tiny": 240.0}
# After every node is up: the window that counts starts once learning began plus this warm-up
# (the first updates compile); the stop may take this long before its process group is killed.
WARM_UP_S = {"gpu": 20.0, "tiny": 0.0}
STOP_TIMEOUT_S = {"gpu": 60.0, "tiny": 90.0}
TINY_SECONDS = 20.0
TINY_LEARNING_S = 10.0  # a tiny run also learns this long before its stop
FIGURE_15_ACTORS = (2, 8)
"""Figure 15's actors x environments each (the 1-GPU layout's counts before they were 'auto'):
`--actors 2 --envs-per-actor 8` measures that row again beside the auto layout's."""
TINY_ACTORS, TINY_ENVS = 1, 2
# What the end of the budget keeps back for the system's stop and the reading.
RESERVE_S = STOP_TIMEOUT_S["gpu"] + 15.0


# --- the run's config (`--config benchmarks/gpu_system.py:gpu|tiny`) ----------------------


def _set(config: Any, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    node[leaf] = value


def _layout() -> Any:
    path, argument = LAYOUT
    spec = importlib.util.spec_from_file_location("gpu_system_layout", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(argument)


def get_config(mode: str = "gpu") -> Any:
    """cartpole_balance, distributed, at the paper's settings; 'gpu': with the 1-GPU layout's
    nodes and resources; 'tiny': projects/drq_v2/tiny.py's sizes, one actor of 2 environments,
    the learner where `gpu_if_available` puts it. No TensorBoard (the GPU machine has no
    tensorboardX), no checkpoint (a stop would save the device store of up to 22 GB)."""
    from magi_lp import ConfigError
    from projects.drq_v2.tasks import make_config

    config = make_config(TASK, distributed=True)
    config.logging.tensorboard = False
    config.checkpoint.enabled = False
    if mode == "gpu":
        layout = _layout()
        # The layout's actors, sized to the machine as lp_main sizes them ('auto': `main`
        # resolves them, and says how); --actors / --envs-per-actor give numbers instead.
        config.num_actors, config.envs_per_actor = layout.num_actors, layout.envs_per_actor
        for group in ("learner", "actor", "evaluator"):
            config.resources[group] = layout.resources[group]
        # The evaluator acts on the CPU, as the layout has it, and renders through EGL on the
        # GPU: with no GPU visible, EGL renders only where Mesa's software device is installed.
        config.resources.evaluator.render_gpu = 0
    elif mode == "tiny":
        from projects.drq_v2 import tiny

        for key, value in tiny.OVERRIDES.items():
            _set(config, key, value)
        config.num_actors = TINY_ACTORS
        config.envs_per_actor = TINY_ENVS
    else:
        raise ConfigError(
            f"config argument {mode!r} is not a mode; use benchmarks/gpu_system.py:gpu or :tiny"
        )
    return config


# --- facts and small readers --------------------------------------------------------------


def machine_facts(inventory: Any) -> dict[str, Any]:
    gpus = ", ".join(f"{g.name} ({g.memory_total_bytes / 2**30:.0f} GiB)" for g in inventory.gpus)
    facts = {
        "gpu": gpus or "none",
        "driver": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "python": sys.version.split()[0],
        "jax": installed_version("jax"),
        "jaxlib": installed_version("jaxlib"),
        "torch": installed_version("torch") or "not installed",
        "ray": installed_version("ray"),
        "cores": os.cpu_count(),
    }
    device = inventory.gpus[0].name if inventory.gpus else "CPU (no GPU)"
    facts["stamp"] = (
        f"{device}, driver {facts['driver'] or '-'}, JAX {facts['jax']}, PyTorch {facts['torch']}"
    )
    return facts


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def reference_curve(task: str = TASK) -> dict[int, dict[str, float]]:
    """The official agent's evaluation returns by frame: mean, min, max over seeds, hour."""
    return {
        int(row["frame"]): {k: float(row[k]) for k in ("mean", "min", "max", "mean_hour")}
        for row in read_rows(REFERENCE)
        if row["task"] == task
    }


def _save(path: Path, result: dict) -> None:
    """Writes the result (after every phase: a run cut short keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps(result, indent=2, default=str) + "\n")


def _say(text: str) -> None:
    print(f"gpu_system: {text}", flush=True)


# --- 1. the plan and its reckoning --------------------------------------------------------


def plan_and_reckoning(config: Any) -> tuple[Any, dict]:
    """The plan `lp_main.py --launcher ray` makes for `config`, 'auto' memory reckoned (its
    compile's answer goes to os.environ, which the run inherits: it does not compile again)."""
    from magi_lp.placement.memory import CUDA_CONTEXT_BYTES
    from magi_lp.replay.plan import plan_replay_store
    from magi_lp.runtime.config import (
        make_placement_plan,
        placement_requests,
        validate_experiment_config,
    )
    from magi_lp.runtime.memory_reckoning import size_gpu_memory
    from projects.drq_v2.config import validate_config
    from projects.drq_v2.experiment import make_experiment

    validate_experiment_config(config)
    validate_config(config)
    plan = make_placement_plan(config)
    experiment = make_experiment(config)
    store = plan_replay_store(config, experiment.builder, plan, reverb_available=False)
    started = time.monotonic()
    plan = size_gpu_memory(experiment, plan, store)
    groups = {}
    needs = getattr(plan, "memory", None) or {}
    for group, request in placement_requests(config).items():
        placement = plan.groups[plan.launch_group(group, 0)]
        renders = render_bytes(placement, request.renders)
        need = needs.get(group)
        if need is None and not renders:
            continue  # nothing of it on a GPU, as far as the plan knows
        groups[group] = {
            "reckoned_bytes": need.total if need else 0,
            "render_bytes": renders,
            # A CPU node that only renders on a GPU starts no CUDA context there.
            "with_context_bytes": (need.total + CUDA_CONTEXT_BYTES if need else 0) + renders,
            "fraction": placement.gpu_memory,
            "preallocated": placement.env.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "true",
            "how": need.describe() if need else f"{request.renders} EGL render context(s)",
        }
    return plan, {
        "state": "done",
        "seconds": round(time.monotonic() - started, 1),
        "store": store.line if store is not None else None,
        "table": plan.format_table(),
        "notices": [*plan.notices, *plan.warnings],
        "groups": groups,
    }


def render_bytes(placement: Any, environments: int) -> int:
    """The GL contexts a node's environments hold on a GPU: where the plan has its EGL render
    on one (`GroupPlacement.render_gpu`, `RENDER_CONTEXT_BYTES` each), else 0 (Mesa's
    software EGL, or no render)."""
    from magi_lp.placement.memory import RENDER_CONTEXT_BYTES

    return environments * RENDER_CONTEXT_BYTES if placement.render_gpu is not None else 0


def _learner_env(plan: Any) -> dict[str, str]:
    return dict(plan.groups[plan.launch_group("learner", 0)].env)


# --- 2. the update alone ------------------------------------------------------------------


def update_alone(plan: Any, config: Any, mode: str, root: Path, mark: str) -> dict:
    """`benchmarks.gpu_check`'s learner worker in the learner's env (no preallocation)."""
    from benchmarks.common import marked_env, tail

    env = marked_env(_learner_env(plan), mark=mark)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    status, log = root / "update_alone.json", root / "update_alone.log"
    status.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "benchmarks.gpu_check", "--worker", "learner",
        "--status", str(status), "--seconds", str(UPDATE_SECONDS[mode]),
        "--image", str(config.env.image_size), "--batch", str(config.agent.batch_size),
    ] + (["--tiny-net"] if mode == "tiny" else [])  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=out)
        try:
            process.wait(timeout=UPDATE_TIMEOUT_S[mode])
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the worker reports what it has
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    try:
        state = json.loads(status.read_text())
    except (OSError, ValueError):
        state = {"state": "failed", "error": f"exit {process.returncode}: {tail(log, 5)}"}
    if state.get("state") != "done":
        return {"state": "failed", "error": state.get("error", "?")}
    keys = (
        "device", "backend", "jax", "batch_size", "observation", "first_call_s",
        "median_update_ms", "updates_per_second", "device_batch_per_second",
        "host_batch_per_second",
    )  # fmt: skip
    return {
        "state": "done",
        "network": "tiny (gpu_check --tiny-net)" if mode == "tiny" else "the paper's",
        **{k: state.get(k) for k in keys},
    }


# --- 3. the system ------------------------------------------------------------------------


_EGL_CHECK = (
    "from dm_control import suite\n"
    "from dm_control.suite.wrappers import pixels\n"
    "env = pixels.Wrapper(suite.load('cartpole', 'balance'), "
    "render_kwargs={'height': 84, 'width': 84})\n"
    "print('rendered', env.observation_spec()['pixels'].shape)\n"
)


def egl_without_gpus(mark: str) -> dict:
    """Whether EGL renders with the GPUs hidden, as lp_main's driver renders its throwaway
    environment (`CUDA_VISIBLE_DEVICES=''`, MUJOCO_GL=egl, no MUJOCO_EGL_DEVICE_ID)."""
    from benchmarks.common import marked_env

    hidden = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu", "MUJOCO_GL": "egl"}
    env = marked_env({**hidden, "PYOPENGL_PLATFORM": "egl"}, mark=mark)
    env.pop("MUJOCO_EGL_DEVICE_ID", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _EGL_CHECK], cwd=REPO, env=env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"renders": False, "error": "no answer in 120 s"}
    lines = (done.stderr or done.stdout).strip().splitlines()
    return {"renders": done.returncode == 0, "error": "" if done.returncode == 0 else lines[-1]}


def choose_driver(choice: str, mark: str) -> dict:
    """Which entry point drives the run: lp_main.py, or its wrapper where EGL needs a GPU."""
    check = egl_without_gpus(mark)
    wrapper = choice == "wrapper" or (choice == "auto" and not check["renders"])
    why = (
        "asked for" if choice != "auto"
        else "EGL renders with the GPUs hidden" if check["renders"]
        else f"EGL does not render with the GPUs hidden ({check['error']}): the driver's "
        "throwaway environment could not render there"
    )  # fmt: skip
    entry = LP_MAIN_WRAPPER if wrapper else LP_MAIN
    _say(f"driver: {entry.relative_to(REPO)} ({why})")
    return {"entry_point": str(entry.relative_to(REPO)), "why": why, "egl_without_gpus": check}


class GpuSampler:
    """Peak GPU MiB per pid (NVML, every process on the GPUs) and per GPU; nothing on a
    machine without NVML. A pid is named by the node whose log its stdout is (the Ray engine
    sends a node's output to `<workdir>/nodes/<group>/<index>`), else by its command line."""

    def __init__(self, workdir: Path) -> None:
        from magi_lp.runtime.workdir import Workdir

        self.nodes = Workdir(workdir).nodes
        self.peak_by_pid: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.peak_used_mib: list[float] = []
        self._nvml = None
        with contextlib.suppress(Exception):
            from benchmarks.gpu_check.harness import NvmlProcesses

            self._nvml = NvmlProcesses()

    def sample(self) -> None:
        if self._nvml is None:
            return
        import psutil

        with contextlib.suppress(Exception):
            for pid, mib in self._nvml.by_pid().items():
                self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0.0), mib)
                if pid not in self.names:
                    self.names[pid] = self._name(pid, psutil)
            used = self._nvml.used_mib()
            self.peak_used_mib = [
                max(a, b)
                for a, b in zip(used, self.peak_used_mib or [0.0] * len(used), strict=True)
            ]

    def _name(self, pid: int, psutil: Any) -> str:
        with contextlib.suppress(OSError):
            log = Path(os.readlink(f"/proc/{pid}/fd/1"))
            if log.parent.parent == self.nodes:
                return f"{log.parent.name}/{log.name}"
        with contextlib.suppress(psutil.Error):
            return " ".join(psutil.Process(pid).cmdline())[:120]
        return ""

    def result(self) -> dict:
        return {
            "available": self._nvml is not None,
            "peak_mib_by_pid": {
                str(pid): {"mib": round(mib, 1), "command": self.names.get(pid, "")}
                for pid, mib in sorted(self.peak_by_pid.items())
            },
            "peak_used_mib_per_gpu": [round(v, 1) for v in self.peak_used_mib],
        }

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def _learner_steps(status_csv: Path) -> float:
    rows = read_rows(status_csv)
    return max((number(r.get("learner_steps")) or 0.0 for r in rows), default=0.0)


def run_system(
    mode: str,
    workdir: Path,
    run_s: float,
    stop_by: float,
    mark: str,
    overrides: list[str],
    entry_point: Path = LP_MAIN,
) -> dict:
    """`entry_point` (lp_main.py) --launcher ray for `run_s` after every node is up (or until
    `stop_by`, a time.monotonic()), then SIGINT to the driver; what the stop took and left
    behind."""
    from benchmarks.common import kill_marked, marked_env
    from magi_lp.runtime.workdir import Workdir

    workdir.parent.mkdir(parents=True, exist_ok=True)
    log_path = workdir.parent / f"{workdir.name}.log"
    home_ray = Path.home() / ".ray"
    ray_home_before = home_ray.exists()
    command = [
        sys.executable, str(entry_point),
        f"--config={Path(__file__).resolve()}:{mode}", "--launcher=ray",
        f"--workdir={workdir}", "--status_every=15", *overrides,
    ]  # fmt: skip
    env = marked_env(mark=mark)
    env.pop("RAY_ADDRESS", None)  # an embedded Ray on this machine, never a cluster's
    sampler = GpuSampler(workdir)
    started = time.monotonic()
    up_at = learning_at = stop_sent = None
    reason = ""
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        while process.poll() is None:
            sampler.sample()
            now = time.monotonic()
            if up_at is None and UP_LINE in log_path.read_text(errors="replace"):
                up_at = now
                _say(f"every node up {now - started:.0f} s after the command")
            if up_at and learning_at is None and _learner_steps(Workdir(workdir).status_csv) >= 1:
                learning_at = now
            due = up_at is not None and now - up_at >= run_s
            if mode == "tiny":  # a tiny run also learns for a while
                due = due and learning_at is not None and now - learning_at >= TINY_LEARNING_S
            if due or now >= stop_by:
                reason = "its time" if due else "the budget's end"
                break
            time.sleep(SAMPLE_EVERY_S)
        ended_by_itself = process.poll() is not None
        stop_sent = time.monotonic()
        if not ended_by_itself:
            _say(f"SIGINT to the driver ({reason}), {stop_sent - started:.0f} s after the command")
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            deadline = stop_sent + STOP_TIMEOUT_S[mode]
            while process.poll() is None and time.monotonic() < deadline:
                sampler.sample()
                time.sleep(0.5)
        killed = False
        if process.poll() is None:
            killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        ended = time.monotonic()
    leftovers = kill_marked(mark)
    sampler.close()
    output = log_path.read_text(errors="replace")
    return {
        "command": " ".join(command[1:]).replace(str(REPO) + "/", ""),
        "exit_code": process.returncode,
        "ended_by_itself": ended_by_itself,
        "stop_reason": reason or "the run ended by itself",
        "up_s": None if up_at is None else round(up_at - started, 1),
        "learning_began_s": None if learning_at is None else round(learning_at - started, 1),
        "ran_s": round(stop_sent - started, 1),
        "stop_s": round(ended - stop_sent, 1),
        "killed_after_notice": killed,
        "leftovers_killed": leftovers,
        "ray_home_created": (not ray_home_before) and home_ray.exists(),
        "nvml": sampler.result(),
        "log": str(log_path),
        "output_tail": output[-3000:],
    }


# --- 4. what the run's files say ----------------------------------------------------------


def _window(rows: list[dict[str, str]], warm_up_s: float) -> tuple[dict, dict] | None:
    """(first, last) status rows of the window that counts: learning began + warm-up, to the
    last sample (the launcher's final one, at the stop)."""
    numbered = [r for r in rows if number(r.get("frames")) is not None]
    learning = [r for r in numbered if (number(r.get("learner_steps")) or 0) >= 1]
    if not learning:
        return None
    start = number(learning[0]["elapsed_s"]) + warm_up_s
    inside = [r for r in learning if number(r["elapsed_s"]) >= start] or learning[-1:]
    first, last = inside[0], numbered[-1]
    if number(last["elapsed_s"]) <= number(first["elapsed_s"]):
        first = learning[0]
    return first, last


def _rate(first: dict, last: dict, key: str) -> float | None:
    dt = number(last["elapsed_s"]) - number(first["elapsed_s"])
    a, b = number(first.get(key)), number(last.get(key))
    if dt <= 0 or a is None or b is None:
        return None
    return (b - a) / dt


def throughput(workdir: Path, config: Any, mode: str) -> dict:
    from magi_lp.runtime.workdir import Workdir

    rows = read_rows(Workdir(workdir).status_csv)
    if not rows:
        return {"state": "failed", "error": "no status.csv rows"}
    last = rows[-1]
    out: dict[str, Any] = {
        "state": "done",
        "frames": max((number(r.get("frames")) or 0.0 for r in rows), default=0.0),
        "learner_steps": max((number(r.get("learner_steps")) or 0.0 for r in rows), default=0.0),
        "elapsed_s": number(last.get("elapsed_s")),
        "replay_size": number(last.get("replay_size")),
    }
    window = _window(rows, WARM_UP_S[mode])
    if window is None:
        out.update(state="no learning", error="the learner made no update")
        return out
    first, end = window
    repeat = int(config.env.action_repeat)
    frames_per_s = _rate(first, end, "frames")
    updates_per_s = _rate(first, end, "learner_steps")
    actor_steps_per_s = None if frames_per_s is None else frames_per_s / repeat
    every = int(config.agent.update_every_steps)
    out.update(
        window_s=round(number(end["elapsed_s"]) - number(first["elapsed_s"]), 1),
        window_from_s=number(first["elapsed_s"]),
        frames_per_s=frames_per_s,
        updates_per_s=updates_per_s,
        actor_steps_per_s=actor_steps_per_s,
        updates_allowed_per_s=None if actor_steps_per_s is None else actor_steps_per_s / every,
        update_every_steps=every,
    )
    begin, finish = number(first["elapsed_s"]), number(end["elapsed_s"])
    inside = [r for r in rows if begin <= (number(r.get("elapsed_s")) or -1.0) <= finish]
    for key in ("inserts_per_s", "samples_per_s"):  # the launcher's rates, over the window
        values = [v for r in inside if (v := number(r.get(key))) is not None]
        out[key] = statistics.fmean(values) if values else None
    # Each node: mean CPU in the window (% of one core), peak RSS and peak NVML GPU MiB.
    nodes: dict[str, dict] = {}
    for key in rows[0]:
        if not key.endswith(":state"):
            continue
        name = key[: -len(":state")]
        cpu = [v for r in inside if (v := number(r.get(f"{name}:cpu"))) is not None]
        rss = [v for r in rows if (v := number(r.get(f"{name}:rss_mib"))) is not None]
        gpu = [v for r in rows if (v := number(r.get(f"{name}:gpu_mib"))) is not None]
        nodes[name] = {
            "cpu_percent": statistics.fmean(cpu) if cpu else None,
            "rss_peak_mib": max(rss, default=None),
            "gpu_peak_mib": max(gpu, default=None),
            "last_state": last.get(key, ""),
        }
    out["nodes"] = nodes
    return out


def learner_time(workdir: Path, from_step: float) -> dict:
    """The learner's log in the window: how long each step waited for its batch."""
    from magi_lp.runtime.workdir import Workdir

    rows = [
        r
        for r in read_rows(Workdir(workdir).log_csv("learner"))
        if (number(r.get("learner_steps")) or 0) >= from_step
    ]
    fractions = [v for r in rows if (v := number(r.get("batch_wait_fraction"))) is not None]
    waits = [v for r in rows if (v := number(r.get("batch_wait_ms"))) is not None]
    if not fractions:
        return {"state": "no rows", "rows": 0}
    return {
        "state": "done",
        "rows": len(fractions),
        "batch_wait_fraction_median": statistics.median(fractions),
        "batch_wait_fraction_mean": statistics.fmean(fractions),
        "batch_wait_ms_median": statistics.median(waits) if waits else None,
    }


BOUNDS = {
    "fed": "the learner's update",
    "starved by the actors (replay ratio)": "the actors",
    "starved by replay sampling": "the relay (the step queue, the drain and the sampling)",
    "slowed in the learner's own loop": "the learner's loop around its update",
}
"""What bounds the run, by `where_time_goes`'s verdict (a result from before `bound` was
written says it through this)."""


def where_time_goes(system: dict, alone: float | None, learner: dict, config: Any) -> dict:
    """Fed, or starved by what: the replay ratio at the actors' rate, the replay's sampling,
    or the learner's own loop."""
    updates = system.get("updates_per_s")
    allowed = system.get("updates_allowed_per_s")
    wait = learner.get("batch_wait_fraction_median")
    out: dict[str, Any] = {"fed": None if not (updates and alone) else updates / alone}
    if out["fed"] is None:
        out.update(verdict="unknown", bound=None, why="no learner rate or no update-alone rate")
        return out
    every = int(config.agent.update_every_steps)
    repeat = int(config.env.action_repeat)
    need_frames = alone * every * repeat
    out["frames_per_s_to_feed"] = need_frames
    out["ratio_bound"] = None if allowed is None else allowed / alone
    if out["fed"] >= FED_GOAL:
        out.update(
            verdict="fed",
            bound=BOUNDS["fed"],
            why=f"the learner runs at {out['fed']:.2f} of the update alone",
        )
    elif allowed is not None and updates >= 0.9 * allowed:
        out.update(
            verdict="starved by the actors (replay ratio)",
            bound=BOUNDS["starved by the actors (replay ratio)"],
            why=(
                f"the replay ratio (one update per {every} actor steps) allows {allowed:.1f} "
                f"updates/s at the actors' {system['actor_steps_per_s']:.1f} steps/s, and the "
                f"learner runs at that; the update alone does {alone:.1f}/s, which "
                f"{need_frames:.0f} frames/s would feed"
            ),
        )
    elif wait is not None and wait >= 0.5:
        out.update(
            verdict="starved by replay sampling",
            bound=BOUNDS["starved by replay sampling"],
            why=(
                f"the learner waits for its batch {wait:.0%} of each step (median), more than "
                f"the replay ratio explains ({updates:.1f} updates/s of {allowed or 0:.1f} "
                "allowed)"
            ),
        )
    else:
        out.update(
            verdict="slowed in the learner's own loop",
            bound=BOUNDS["slowed in the learner's own loop"],
            why=(
                f"it waits for batches {0 if wait is None else wait:.0%} of each step; the "
                "rest is the update with its dispatch, counting and logging"
            ),
        )
    return out


def memory_against_reckoning(reckoning: dict, system: dict) -> dict:
    """Each node's peak NVML MiB (status.csv) against its group's reckoning + a CUDA context."""
    rows = {}
    for name, node in (system.get("nodes") or {}).items():
        group = name.split("/")[0]
        row: dict[str, Any] = {"group": group, "nvml_peak_mib": node.get("gpu_peak_mib")}
        reckoned = (reckoning.get("groups") or {}).get(group)
        if reckoned is not None:
            mib = reckoned["with_context_bytes"] / 2**20
            row.update(
                reckoned_mib=mib,
                preallocated=reckoned["preallocated"],
                fraction=reckoned["fraction"],
            )
            measured = node.get("gpu_peak_mib")
            if measured:
                row["reckoned_over_measured"] = mib / measured - 1
                row["within_goal"] = abs(mib / measured - 1) <= MEMORY_GOAL
        rows[name] = row
    return rows


def evaluations(workdir: Path, config: Any) -> list[dict]:
    """The evaluator's episodes grouped into evaluations, beside the official curve at the
    nearest published frame count (frames: `Evaluation.actor_steps`, when the evaluation's
    first episode ended)."""
    from magi_lp.runtime.evaluations import group_evaluations
    from magi_lp.runtime.workdir import Workdir

    rows = read_rows(Workdir(workdir).log_csv("evaluator_0"))
    repeat = int(config.env.action_repeat)
    reference = reference_curve()
    out = []
    # By each row's evaluation point: a stop that cut one, and the relaunch's whole one at
    # that point, no longer shift every later evaluation's episodes.
    for evaluation in group_evaluations(rows, int(config.evaluation.episodes)):
        chunk = evaluation.rows
        returns = [float(r["episode_return"]) for r in chunk]
        frames = repeat * evaluation.actor_steps
        entry: dict[str, Any] = {
            "frames": frames,
            "episodes": len(returns),
            "complete": evaluation.complete,
            "return_mean": statistics.fmean(returns),
        }
        if reference:
            nearest = min(reference, key=lambda f: abs(f - frames))
            ref = reference[nearest]
            entry.update(
                official_frame=nearest,
                official_mean=ref["mean"],
                official_min=ref["min"],
                official_max=ref["max"],
                in_official_range=ref["min"] <= entry["return_mean"] <= ref["max"],
            )
        out.append(entry)
    return out


def official_frames_per_s(frames: float) -> float | None:
    """The official agent's published frames/s up to `frames` (its curves' mean wall clock)."""
    reference = {f: r for f, r in reference_curve().items() if f > 0 and r["mean_hour"] > 0}
    if not reference:
        return None
    nearest = min(reference, key=lambda f: abs(f - max(frames, 1)))
    return nearest / (3600 * reference[nearest]["mean_hour"])


# --- the command --------------------------------------------------------------------------


def _has_gpu(inventory: Any) -> tuple[bool, str]:
    from magi_lp.placement.jax_build import detect_jax_build

    if not inventory.gpus:
        return False, f"no GPU ({inventory.reason or 'NVML listed none'})"
    build = detect_jax_build()
    if not build.serves_cuda:
        return False, f"a GPU, but this Python's JAX cannot use it ({build.describe()})"
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_system", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=4.0, help="training after nodes are up")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=490.0,
        help="the whole command's seconds, at most: the system stops earlier to fit",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU, even on a GPU")
    parser.add_argument("--out", default="", help="the JSON result (default: see the docstring)")
    parser.add_argument("--workdir", default=str(REPO / "runs" / "gpu_system"))
    parser.add_argument("--actors", type=int, default=0, help="num_actors (default: the layout's)")
    parser.add_argument("--envs-per-actor", type=int, default=0, help="default: the layout's")
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        default="auto",
        help="lp_main: projects/drq_v2/lp_main.py; wrapper: benchmarks/gpu_system_lp_main.py "
        "(the spec made before the driver hides the GPUs); auto: lp_main where EGL renders "
        "with no GPU visible, else the wrapper",
    )
    args = parser.parse_args(argv)

    from benchmarks.common import git_commit
    from magi_lp.placement.gpu_inventory import query_inventory

    started = time.monotonic()
    stop_by = started + args.budget_s - RESERVE_S
    inventory = query_inventory()
    gpu, why = _has_gpu(inventory)
    mode = "gpu" if gpu and not args.tiny else "tiny"
    if not gpu:
        _say(f"{why}: running at a tiny size on the CPU (a check of the command, not a result)")
    out = Path(args.out) if args.out else (RESULT if mode == "gpu" else UNMEASURED)
    workdir = Path(args.workdir).absolute()
    root = workdir.parent / f"{workdir.name}_parts"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, never a resumed one
    mark = uuid.uuid4().hex
    config = get_config(mode)
    overrides = []
    if args.actors:
        config.num_actors = args.actors
        overrides.append(f"--config.num_actors={args.actors}")
    if args.envs_per_actor:
        config.envs_per_actor = args.envs_per_actor
        overrides.append(f"--config.envs_per_actor={args.envs_per_actor}")
    sized = None
    if mode == "gpu":
        # The counts lp_main's launch decision gives this machine ('auto'), pinned for the run
        # so that the plan measured here is the one that runs.
        from magi_lp.runtime.config import resolve_actor_counts

        config, sized = resolve_actor_counts(config, inventory)
        overrides += [
            f"--config.num_actors={int(config.num_actors)}",
            f"--config.envs_per_actor={int(config.envs_per_actor)}",
        ]
        _say(sized or f"actors: {config.num_actors} x {config.envs_per_actor} env (given)")
    machine = machine_facts(inventory)
    result: dict[str, Any] = {
        "status": "ok" if mode == "gpu" else "tiny",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(),
        "machine": machine,
        "on": machine["stamp"],
        "settings": {
            "task": TASK,
            "mode": mode,
            "layout": f"{LAYOUT[0]}:{LAYOUT[1]}" if mode == "gpu" else "tiny (CPU)",
            "image_size": int(config.env.image_size),
            "batch_size": int(config.agent.batch_size),
            "replay_buffer_size": int(config.agent.replay_buffer_size),
            "num_actors": int(config.num_actors),
            "envs_per_actor": int(config.envs_per_actor),
            "actors_sized": sized,
            "update_every_steps": int(config.agent.update_every_steps),
            "action_repeat": int(config.env.action_repeat),
            "evaluation_every_frames": int(config.evaluation.every_actor_steps)
            * int(config.env.action_repeat),
            "evaluation_episodes": int(config.evaluation.episodes),
            "minutes": args.minutes if mode == "gpu" else TINY_SECONDS / 60,
        },
    }
    _save(out, result)

    _say(f"1/3 the plan and its memory reckoning ({mode})")
    try:
        plan, result["reckoning"] = plan_and_reckoning(config)
    except Exception as error:  # the plan refused: that is the result
        result["reckoning"] = {"state": "failed", "error": f"{type(error).__name__}: {error}"}
        result["seconds"] = round(time.monotonic() - started, 1)
        _save(out, result)
        _say(f"the plan failed: {error}")
        return 1
    print(result["reckoning"]["table"], flush=True)
    _save(out, result)

    _say("2/3 the update alone, in the learner's env")
    result["update_alone"] = {
        **update_alone(plan, config, mode, root, mark),
        "on": machine["stamp"],
    }
    _save(out, result)
    alone = result["update_alone"].get("device_batch_per_second")
    _say(
        f"update alone: {_fmt(alone)} updates/s on {result['update_alone'].get('device')} "
        f"({result['update_alone'].get('error') or 'done'})"
    )

    run_s = 60 * args.minutes if mode == "gpu" else TINY_SECONDS
    result["driver"] = choose_driver(args.driver, mark)
    _save(out, result)
    entry_point = REPO / result["driver"]["entry_point"]
    _say(f"3/3 the system on Ray for {run_s:.0f} s after every node is up ({entry_point.name})")
    run = run_system(mode, workdir, run_s, stop_by, mark, overrides, entry_point)
    result["run"] = run
    _save(out, result)
    system = {**throughput(workdir, config, mode), "on": machine["stamp"]}
    if system.get("frames") and run["ran_s"]:  # from the command to its stop, all included
        system["frames_per_s_whole_run"] = system["frames"] / run["ran_s"]
    result["system"] = system
    learner = learner_time(workdir, _window_start_step(workdir, mode))
    result["learner"] = learner
    result["where_time_goes"] = where_time_goes(system, alone, learner, config)
    result["memory"] = memory_against_reckoning(result["reckoning"], system)
    result["evaluations"] = evaluations(workdir, config)
    result["official_frames_per_s"] = official_frames_per_s(system.get("frames") or 0)
    result["seconds"] = round(time.monotonic() - started, 1)
    _save(out, result)
    print(text_summary(result), flush=True)
    _say(f"wrote {out}")
    ok = run["exit_code"] == 0 and not run["leftovers_killed"] and system.get("state") == "done"
    return 0 if ok else 1


def _window_start_step(workdir: Path, mode: str) -> float:
    from magi_lp.runtime.workdir import Workdir

    window = _window(read_rows(Workdir(workdir).status_csv), WARM_UP_S[mode])
    return 0.0 if window is None else number(window[0].get("learner_steps")) or 0.0


# --- in words -----------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def text_summary(result: dict) -> str:
    system = result.get("system", {})
    where = result.get("where_time_goes", {})
    run = result.get("run", {})
    lines = [
        f"on: {result['on']} ({result['status']})",
        f"frames/s (window {_fmt(system.get('window_s'))} s): {_fmt(system.get('frames_per_s'))}; "
        f"whole run {_fmt(system.get('frames_per_s_whole_run'))}; frames "
        f"{_fmt(system.get('frames'), 0)}",
        f"learner: {_fmt(system.get('updates_per_s'))} updates/s; update alone "
        f"{_fmt(result.get('update_alone', {}).get('device_batch_per_second'))}/s; fed "
        f"{_fmt(where.get('fed'), 2)} (goal >= {FED_GOAL}); {where.get('verdict')}: "
        f"{where.get('why')}",
        f"driver: {result.get('driver', {}).get('entry_point')} "
        f"({result.get('driver', {}).get('why')})",
        f"stop: exit {run.get('exit_code')} {_fmt(run.get('stop_s'))} s after SIGINT; "
        f"leftovers killed {len(run.get('leftovers_killed') or [])}; ~/.ray created: "
        f"{run.get('ray_home_created')}",
    ]
    for name, row in result.get("memory", {}).items():
        if row.get("nvml_peak_mib") is not None or row.get("reckoned_mib") is not None:
            lines.append(
                f"memory {name}: NVML peak {_fmt(row.get('nvml_peak_mib'), 0)} MiB, reckoned "
                f"{_fmt(row.get('reckoned_mib'), 0)} MiB"
            )
    for entry in result.get("evaluations", []):
        lines.append(
            f"evaluation at {entry['frames']} frames: {entry['return_mean']:.1f} "
            f"({entry['episodes']} episodes); official at {entry.get('official_frame')}: "
            f"{entry.get('official_mean')}"
        )
    return "\n".join(lines)


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for BENCHMARKS.md's table (a GPU result only)."""
    system, where = result.get("system", {}), result.get("where_time_goes", {})
    alone = result.get("update_alone", {}).get("device_batch_per_second")
    headline = (
        f"{_fmt(system.get('frames_per_s'), 0)} frames/s, {_fmt(system.get('updates_per_s'))} "
        f"learner updates/s ({result['on']})"
    )
    comparison = f"the update alone on that GPU: {_fmt(alone)} updates/s"
    ratio = f"{_fmt(where.get('fed'), 2)} fed (goal >= {FED_GOAL}); {where.get('verdict')}"
    return headline, comparison, ratio


def report(result: dict) -> str:
    """Figure 14 of BENCHMARKS.md, from a GPU result."""
    on = result["on"]
    settings = result["settings"]
    system = result.get("system", {})
    where = result.get("where_time_goes", {})
    alone = result.get("update_alone", {})
    run = result.get("run", {})
    lines = [
        f"`make gpu-system` (benchmarks/gpu_system.py): `{run.get('command', '?')}` on "
        f"{result['machine']['gpu']}, {result['machine']['cores']} cores; driver "
        f"{result['machine']['driver']}, JAX {result['machine']['jax']}, PyTorch "
        f"{result['machine']['torch']}, Ray {result['machine']['ray']}, Python "
        f"{result['machine']['python']}; {settings['task']}, {settings['layout']}: "
        f"{settings['num_actors']} actors x {settings['envs_per_actor']} environments, "
        f"{settings['image_size']}x{settings['image_size']}, batch {settings['batch_size']}, "
        f"replay {settings['replay_buffer_size']:,}; stopped by SIGINT after "
        f"{_fmt(run.get('ran_s'), 0)} s. Every number was measured there ({result['measured_at']},"
        f" commit {result['commit']}).",
        "",
        "| measure | value | against | measured on |",
        "| --- | --- | --- | --- |",
        f"| training frames/s (window of {_fmt(system.get('window_s'), 0)} s after learning "
        f"began) | {_fmt(system.get('frames_per_s'))} | official agent's published wall clock: "
        f"{_fmt(result.get('official_frames_per_s'))} frames/s (its machine) | {on} |",
        f"| frames/s over the whole run (Ray start and compiles included) | "
        f"{_fmt(system.get('frames_per_s_whole_run'))} | | {on} |",
        f"| learner updates/s | {_fmt(system.get('updates_per_s'))} | the update alone: "
        f"{_fmt(alone.get('device_batch_per_second'))}/s | {on} |",
        f"| fed (learner / update alone) | {_fmt(where.get('fed'), 2)} | goal >= {FED_GOAL} | "
        f"{on} |",
        f"| updates/s the replay ratio allows at the actors' rate | "
        f"{_fmt(system.get('updates_allowed_per_s'))} | {_fmt(system.get('actor_steps_per_s'))} "
        f"actor steps/s / {settings['update_every_steps']} | {on} |",
        f"| learner's wait for its batch (median share of a step) | "
        f"{_fmt(result.get('learner', {}).get('batch_wait_fraction_median'), 2)} | | {on} |",
        f"| stop: SIGINT to exit | {_fmt(run.get('stop_s'))} s, exit code "
        f"{run.get('exit_code')} | leftovers killed: {len(run.get('leftovers_killed') or [])}"
        f" | {on} |",
        "",
        f"**Where the time goes**: {where.get('verdict')}: {where.get('why')}; what bounds "
        f"it: {where.get('bound') or BOUNDS.get(where.get('verdict'), 'unknown')}.",
        "",
        f"**Driver**: `{result.get('driver', {}).get('entry_point')}` "
        f"({result.get('driver', {}).get('why')}).",
        "",
        f"**GPU memory per process** (NVML by pid, peak; `gpu_memory='auto'` reckoning plus a "
        f"CUDA context; goal within {MEMORY_GOAL:.0%}):",
        "",
        "| node | NVML peak MiB | reckoned MiB | reckoned vs peak | measured on |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, row in result.get("memory", {}).items():
        over = row.get("reckoned_over_measured")
        note = (
            " (preallocated: NVML shows the pool the plan gave it)"
            if row.get("preallocated")
            else ""
        )
        lines.append(
            f"| {name} | {_fmt(row.get('nvml_peak_mib'), 0)} | {_fmt(row.get('reckoned_mib'), 0)}"
            f"{note} | {'-' if over is None else f'{over:+.0%}'} | {on} |"
        )
    lines += [
        "",
        f"**Evaluation returns** ({settings['evaluation_episodes']} episodes every "
        f"{settings['evaluation_every_frames']:,} frames) against the official agent's "
        f"published curve ({REFERENCE_SOURCE}; mean and range over its seeds):",
        "",
        "| frames | return | official frame | official mean [min, max] | measured on |",
        "| --- | --- | --- | --- | --- |",
    ]
    for entry in result.get("evaluations", []):
        partial = "" if entry["complete"] else f" ({entry['episodes']} episodes, cut by the stop)"
        lines.append(
            f"| {entry['frames']:,} | {entry['return_mean']:.1f}{partial} | "
            f"{entry.get('official_frame', '-')} | {entry.get('official_mean', '-')} "
            f"[{entry.get('official_min', '-')}, {entry.get('official_max', '-')}] | {on} |"
        )
    for note in result.get("notes", []):  # what was learned or corrected after the run
        lines += ["", note]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
