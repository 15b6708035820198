"""Figure 7, the GPU check: measures on a real GPU what magi_lp promises there.

    make gpu-check                              # the venv's Python
    make gpu-check GPU_CHECK_PYTHON=python3     # a GPU machine's own Python and CUDA JAX
    python -m benchmarks.gpu_check [--quick] [--out FILE] [--max-actors N] [--parts a,b]

It writes benchmarks/gpu_check.json; `python -m benchmarks.run --only gpu_check` renders figure 7
of BENCHMARKS.md from it. Parts (all by default):

  inventory  the NVML inventory (models, memory, driver), the JAX build, and the plan of
             configs/reacher_hard_distributed.py on that machine (the dry run's table).
  learner    DrQ-v2 learner updates/s at batch 256, 84x84x9, in a process with the plan's
             learner env, fed the frame replay's batches (each item's unique frames,
             stacked in the update) through the learner's device prefetcher; the first call
             (compile) timed apart; also the update alone on a batch already on the device,
             and with a host batch copied by each call (no prefetch).
  cpu_node   a process with the plan's env for a CPU node (an actor) running the policy
             forward: whether NVML lists it on any GPU (the promise: no CUDA context).
  memory     GPU MiB per process (NVML, by pid) of one learner plus N actors (N = 1, 2, 4, ...
             up to --max-actors), started as plain subprocesses, each running its real
             workload (the jitted update for the learner, the jitted policy forward for actors),
             in three variants: `planned` (the plan's env), `defaults` (no overrides: JAX's
             defaults) and `gpu_actors` (a plan variant that puts the actors on the learner's
             GPU with gpu_memory=0.05 and no preallocation). Reported: the largest N that ran
             (measured), and the largest N the GPU's memory would hold, computed from the
             measured per-process MiB (labelled as computed).
  render     MuJoCo EGL frames/s at 84x84 (a small inline scene; dm_control is not needed) in
             a process whose plan renders on the GPU (render_gpu=0), with the GL renderer
             string that says where it ran. Skipped, saying why, where MuJoCo is missing.
  shared     the 1-GPU shared layout of configs/reacher_hard_gpu_layouts.py:1gpu (`a0-l0`):
             its learner (0.6 of the GPU) and its GPU actors (at most 0.1 each, each choosing
             the actions of `envs_per_actor` environments in one batched call) run at once
             on the first GPU, each in its own process with the plan's env: GPU MiB per
             process, learner updates/s and actions/s per actor while they share it (the
             layout's 2 actors, or --max-actors if fewer).

Every worker is this module run again as `--worker learner|actor|render` in a fresh process
with os.environ plus its group's env. Nothing here imports Launchpad, Reverb, TensorFlow, Acme,
dm_env or dm_control, so the check runs where only Python, CUDA JAX and the small wheels of
scripts/gpu_check_wheels.sh are installed. Without a GPU it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.common import REPO, fmt, git_commit, kill_marked, marked_env, progress, tail

TITLE = "GPU check: the plan on a real GPU (memory per process, CPU nodes, learner, rendering)"
RESULT = REPO / "benchmarks" / "gpu_check.json"
# Where a run that measured nothing (no GPU) writes by default: git-ignored, so a CPU machine
# leaves the committed GPU measurement and the working tree alone.
UNMEASURED = REPO / "benchmarks" / "logs" / "gpu_check.json"
CONFIG = "configs/reacher_hard_distributed.py"
NOT_MEASURED = "not measured: no GPU machine was available"
PARTS = ("inventory", "learner", "cpu_node", "memory", "render", "shared")
SHARED_CONFIG = "configs/reacher_hard_gpu_layouts.py"
VARIANTS = ("planned", "defaults", "gpu_actors")
# The plan variant with actors on the GPU: a small cap each, no preallocation, so that
# each actor holds only what it uses; the learner keeps half the GPU.
GPU_ACTOR_OVERRIDES = {
    "resources.learner.gpu_memory": 0.5,
    "resources.actor.device": "gpu",
    "resources.actor.gpu_memory": 0.05,
    "resources.actor.preallocate": False,
}
READY_TIMEOUT_S = 600.0  # a first jitted update can compile for minutes on a busy machine
MIB = 1024 * 1024
# The inline MuJoCo scene the render worker draws (dm_control's suites are not needed).
SCENE = """
<mujoco>
  <worldbody>
    <light pos="0 0 3" dir="0 0 -1"/>
    <geom type="plane" size="2 2 0.1" rgba=".8 .8 .8 1"/>
    <body name="arm" pos="0 0 0.5">
      <freejoint/>
      <geom type="capsule" size=".05 .2" rgba="1 0 0 1"/>
      <geom type="box" pos="0 0 .3" size=".1 .1 .1" rgba="0 0 1 1"/>
    </body>
    <camera name="cam" pos="0 -1.5 1" xyaxes="1 0 0 0 0.55 0.83"/>
  </worldbody>
</mujoco>
"""


# ---------------------------------------------------------------------------------------
# Workers: one process each, reporting through a JSON status file.


class _ActionSpec(NamedTuple):
    """What `make_networks` reads of an action spec (dm_env is not needed for it)."""

    shape: tuple[int, ...]
    dtype: Any
    minimum: float
    maximum: float


_STOP = False


def _on_sigterm(signum: int, frame: Any) -> None:
    del signum, frame
    global _STOP
    _STOP = True


def _write_status(path: str, **fields: Any) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(fields))
    os.replace(tmp, path)  # the parent never reads half a file


def _jax_facts() -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "jax": jax.__version__,
    }


def _drq_networks(image: int, tiny_net: bool):
    import jax
    import numpy as np

    from projects.drq_v2.config import get_agent_config
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("reacher", "hard")
    if tiny_net:  # smoke tests only: compiles in seconds on a CPU; never the figure
        config.encoder_channels, config.encoder_num_layers = 4, 1
        config.feature_dim, config.hidden_dim = 8, 16
    networks = make_networks(_ActionSpec((2,), np.float32, -1.0, 1.0), config)  # reacher: 2 joints
    obs = np.zeros((image, image, 9), np.uint8)  # RGB x frame stack 3
    return jax, np, config, networks, obs


def run_learner(
    status: str, batch_size: int, image: int, seconds: float, tiny_net: bool = False
) -> dict:
    """The jitted DrQ-v2 update fed as the learner node feeds it, then two variants apart.

    The batch is what the frame replay yields: a `FrameTransition` whose `frames` hold each
    item's frame_stack + n_step unique 84x84x3 frames, stacked inside the update. Three
    timings, each over a third of `seconds` (the first runs until told to stop when the
    others would not fit):
      - `updates_per_second`: fresh numpy batches through `DevicePrefetcher` (a background
        thread copies the next batches to the device while the update runs), as
        `JaxLearner` does: the rate a learner reaches when sampling keeps up;
      - `device_batch_per_second`: one batch already on the device: the update alone;
      - `host_batch_per_second`: a numpy batch handed to each call, copy and update one
        after the other (the learner without prefetch).
    """
    import itertools

    jax, np, config, networks, obs = _drq_networks(image, tiny_net)
    from magi_lp.agent.frame_window import FrameTransition
    from magi_lp.agent.prefetch import DevicePrefetcher
    from projects.drq_v2.config import replay_schedule
    from projects.drq_v2.learning import init_training_state, make_update_fn

    config.batch_size = batch_size
    state = init_training_state(networks, config, jax.random.PRNGKey(0), obs)
    update = make_update_fn(networks, config, replay_schedule(config, action_repeat=2))
    rng = np.random.default_rng(0)
    frame_stack = obs.shape[-1] // 3  # RGB frames in the observation
    window = frame_stack + int(config.n_step)

    def host_batch() -> FrameTransition:
        return FrameTransition(
            frames=rng.integers(0, 256, (batch_size, window, image, image, 3), dtype=np.uint8),
            action=rng.uniform(-1, 1, (batch_size, 2)).astype(np.float32),
            reward=rng.uniform(0, 1, (batch_size,)).astype(np.float32),
            discount=np.full((batch_size,), 0.99**3, np.float32),
        )

    pool = [host_batch() for _ in range(4)]  # distinct numpy batches, as replay hands them
    start = time.perf_counter()
    state, metrics = update(state, pool[0])
    jax.block_until_ready((state, metrics))
    first_call = time.perf_counter() - start
    facts = _jax_facts()
    _write_status(status, state="ready", first_call_s=first_call, **facts)

    def timed(batches: Any, window_s: float) -> tuple[list[float], float]:
        nonlocal state, metrics
        durations: list[float] = []
        began = time.perf_counter()
        # At least two timed updates, even when told to stop early: a median needs them.
        while len(durations) < 2 or (not _STOP and time.perf_counter() - began < window_s):
            t = time.perf_counter()
            state, metrics = update(state, next(batches))
            jax.block_until_ready(state)
            durations.append(time.perf_counter() - t)
        return durations, time.perf_counter() - began

    prefetcher = DevicePrefetcher(itertools.cycle(pool), size=2)
    durations, elapsed = timed(prefetcher, seconds / 3)
    prefetcher.close()
    loss = float(metrics["critic_loss"])
    if not math.isfinite(loss):
        raise RuntimeError(f"the update produced a non-finite critic loss ({loss})")
    median = sorted(durations)[len(durations) // 2]
    result = {
        **facts,
        "batch_size": batch_size,
        "observation": f"{image}x{image}x{3 * frame_stack} uint8",
        "batch": f"FrameTransition: {window} frames of {image}x{image}x3 uint8 per item",
        "updates_timed": len(durations),
        "updates_per_second": len(durations) / elapsed,
        "median_update_ms": median * 1e3,
        "first_call_s": first_call,
        "compile_s": max(first_call - median, 0.0),
        "batch_wait_s": prefetcher.wait_seconds,
    }
    on_device = jax.device_put(pool[0])
    variants = {
        "device_batch": itertools.repeat(on_device),
        "host_batch": itertools.cycle(pool),
    }
    for name, batches in variants.items():
        if _STOP:
            break
        durations, elapsed = timed(batches, seconds / 3)
        result[f"{name}_per_second"] = len(durations) / elapsed
    return result


def run_actor(
    status: str, image: int, seconds: float, tiny_net: bool = False, envs: int = 1
) -> dict:
    """The jitted DrQ-v2 behaviour policy, one observation per step (as an actor acts), or
    with `envs` > 1 one call for that many observations, vmapped as `BatchedActor` does (the
    toolkit's class needs Acme, which a bare GPU machine lacks)."""
    jax, np, config, networks, obs = _drq_networks(image, tiny_net)
    from projects.drq_v2.acting import make_actor_core

    params = networks.init(jax.random.PRNGKey(0), obs)
    policy_params = {"encoder": params["encoder"], "actor": params["actor"]}
    core = make_actor_core(networks, config)
    if envs > 1:
        select = jax.jit(jax.vmap(core.select_action, in_axes=(None, 0, 0)))
        actor_state = jax.vmap(core.init)(jax.random.split(jax.random.PRNGKey(1), envs))
        obs = np.zeros((envs, *obs.shape), obs.dtype)
    else:
        select = jax.jit(core.select_action)
        actor_state = core.init(jax.random.PRNGKey(1))
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    action, actor_state = select(policy_params, obs, actor_state)
    jax.block_until_ready(action)
    first_call = time.perf_counter() - start
    facts = _jax_facts()
    _write_status(status, state="ready", first_call_s=first_call, **facts)
    steps = 0
    start = time.perf_counter()
    while steps < 2 or (not _STOP and time.perf_counter() - start < seconds):
        observation = rng.integers(0, 256, obs.shape, dtype=np.uint8)
        action, actor_state = select(policy_params, observation, actor_state)
        jax.block_until_ready(action)
        steps += 1
    elapsed = time.perf_counter() - start
    return {
        **facts,
        "envs": envs,
        "steps_per_second": steps / elapsed,
        "actions_per_second": steps * envs / elapsed,
        "first_call_s": first_call,
    }


def run_render(status: str, size: int, seconds: float) -> dict:
    """MuJoCo's own renderer (MUJOCO_GL from the env: egl) on a small scene."""
    import mujoco
    import numpy as np

    model = mujoco.MjModel.from_xml_string(SCENE)
    data = mujoco.MjData(model)
    renderer = mujoco.Renderer(model, height=size, width=size)
    gl = {}
    with contextlib.suppress(Exception):  # PyOpenGL is optional: it only names the renderer
        from OpenGL import GL

        gl = {
            "gl_vendor": GL.glGetString(GL.GL_VENDOR).decode(),
            "gl_renderer": GL.glGetString(GL.GL_RENDERER).decode(),
        }
    for _ in range(20):  # warm-up
        mujoco.mj_step(model, data)
        renderer.update_scene(data, camera="cam")
        first = renderer.render()
    _write_status(status, state="ready", mujoco=mujoco.__version__, **gl)
    frames = 0
    start = time.perf_counter()
    while frames < 10 or (not _STOP and time.perf_counter() - start < seconds):
        mujoco.mj_step(model, data)
        renderer.update_scene(data, camera="cam")
        pixels = renderer.render()
        frames += 1
    elapsed = time.perf_counter() - start
    renderer.close()
    return {
        "mujoco": mujoco.__version__,
        "mujoco_gl": os.environ.get("MUJOCO_GL", ""),
        **gl,
        "frame": f"{size}x{size}x3",
        "frames": frames,
        "frames_per_second": frames / elapsed,
        "pixels_changed": bool(np.any(pixels != first)),
    }


def worker_main(args: argparse.Namespace) -> int:
    """A worker process: runs one workload, reports through `--status`."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if args.worker == "learner":
            result = run_learner(args.status, args.batch, args.image, args.seconds, args.tiny_net)
        elif args.worker == "actor":
            result = run_actor(args.status, args.image, args.seconds, args.tiny_net, args.envs)
        else:
            result = run_render(args.status, args.image, args.seconds)
    except Exception as error:  # reported to the parent, which records it as a result
        text = " ".join(str(error).split())[-600:]
        _write_status(args.status, state="failed", error=f"{type(error).__name__}: {text}")
        return 1
    _write_status(args.status, state="done", **result)
    return 0


# ---------------------------------------------------------------------------------------
# NVML: GPU memory by process.


class NvmlProcesses:
    """GPU memory per pid (compute and graphics processes, summed over GPUs), from NVML."""

    def __init__(self, nvml: Any = None):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        nvml.nvmlInit()
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]

    def by_pid(self) -> dict[int, float]:
        """pid -> MiB; -1.0 for a process NVML lists without an amount."""
        usage: dict[int, float] = {}
        for handle in self._handles:
            for name in (
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses",
            ):
                try:
                    processes = getattr(self._nvml, name)(handle)
                except Exception:  # not supported on this board / driver
                    continue
                for p in processes:
                    used = getattr(p, "usedGpuMemory", None)
                    mib = -1.0 if used is None else used / MIB
                    if usage.get(p.pid, 0.0) >= 0 and mib >= 0:
                        usage[p.pid] = usage.get(p.pid, 0.0) + mib
                    else:
                        usage.setdefault(p.pid, mib)
        return usage

    def used_mib(self) -> list[float]:
        """Memory in use on each GPU (all processes, ours or not)."""
        return [self._nvml.nvmlDeviceGetMemoryInfo(h).used / MIB for h in self._handles]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


# ---------------------------------------------------------------------------------------
# Starting workers and sampling them.


class Worker:
    """A running worker process and its status file."""

    def __init__(self, role: str, process: subprocess.Popen, status: Path, log: Path):
        self.role, self.process, self.status, self.log = role, process, status, log

    def state(self) -> dict:
        try:
            return json.loads(self.status.read_text())
        except (OSError, ValueError):
            exited = self.process.poll()
            if exited is not None:
                return {"state": "failed", "error": f"exit {exited}: {tail(self.log, 3)}"}
            return {"state": "starting"}


EnvHook = Callable[[dict[str, str], str], dict[str, str]]


class Workers:
    """Starts workers with given envs, waits for them, stops them; leaves nothing behind."""

    def __init__(
        self, root: Path, sizes: Mapping[str, Any], env_hook: EnvHook | None = None
    ) -> None:
        self.root, self.sizes, self.env_hook = root, sizes, env_hook
        self.mark = uuid.uuid4().hex
        self.running: list[Worker] = []
        self.started = 0

    def start(
        self,
        kind: str,
        role: str,
        overrides: Mapping[str, str] | None,
        until_stopped: bool = False,
        envs: int = 1,
    ) -> Worker:
        """Starts `--worker kind` with os.environ plus `overrides`, or, for None, with no
        managed variable at all (JAX's and CUDA's defaults); `until_stopped`: its workload
        runs until `stop`, not for the size's seconds; `envs`: an actor's batch of
        observations per call."""
        from magi_lp.placement.resources import MANAGED_VARIABLES

        env = marked_env(mark=self.mark)
        if overrides is None:
            for name in MANAGED_VARIABLES:
                env.pop(name, None)
        else:
            env.update(overrides)
        if self.env_hook is not None:
            env = self.env_hook(env, role)
        self.started += 1
        slug = f"{self.started:02d}_{role.replace(' ', '_')}"
        status, log = self.root / f"{slug}.json", self.root / f"{slug}.log"
        sizes = self.sizes
        command = [
            sys.executable, "-m", "benchmarks.gpu_check", "--worker", kind,
            "--status", str(status),
            "--seconds", str(3600.0 if until_stopped else sizes[f"{kind}_seconds"]),
            "--image", str(sizes["render_size" if kind == "render" else "image"]),
            "--batch", str(sizes["batch"]), "--envs", str(envs),
        ] + (["--tiny-net"] if sizes.get("tiny_net") else [])  # fmt: skip
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        worker = Worker(role, process, status, log)
        self.running.append(worker)
        return worker

    def wait_ready(self, workers: Sequence[Worker], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [w.state()["state"] for w in workers]
            if all(s != "starting" for s in states):
                return
            time.sleep(0.2)

    def wait_done(self, worker: Worker, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and worker.process.poll() is None:
            time.sleep(0.2)
        return self.stop(worker)

    def stop(self, worker: Worker) -> dict:
        """SIGTERM (the worker reports what it measured so far), SIGKILL after 30 s."""
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        if worker in self.running:
            self.running.remove(worker)
        return worker.state()

    def stop_all(self) -> None:
        for worker in list(self.running):
            self.stop(worker)
        kill_marked(self.mark)


def _sample(
    nvml: NvmlProcesses, workers: Sequence[Worker], samples: int, every_s: float
) -> dict[int, float]:
    """Peak MiB per worker pid over a few samples (0.0: not listed by NVML)."""
    peaks = {w.process.pid: 0.0 for w in workers}
    for i in range(samples):
        usage = nvml.by_pid()
        for pid in peaks:
            if pid in usage:
                peaks[pid] = max(peaks[pid], usage[pid]) if usage[pid] >= 0 else -1.0
        if i + 1 < samples:
            time.sleep(every_s)
    return peaks


# ---------------------------------------------------------------------------------------
# The plan.


def load_config(
    overrides: Mapping[str, Any] | None = None,
    num_actors: int | None = None,
    path: str = CONFIG,
    argument: str | None = None,
):
    """A config file's config (configs/reacher_hard_distributed.py by default, `get_config
    (argument)` when given one), with dotted-key overrides."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_config", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config() if argument is None else module.get_config(argument)
    for key, value in (overrides or {}).items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    if num_actors is not None:
        config.num_actors = num_actors
    return config


def make_plan(config: Any, inventory: Any) -> Any:
    """The plan `lp_main.py` makes for `config` on `inventory`."""
    from magi_lp.runtime.config import make_placement_plan

    return make_placement_plan(config, inventory)


def group_env(plan: Any, group: str, index: int = 0) -> dict[str, str]:
    """The env overrides node `index` of `group` gets under `plan`."""
    return dict(plan.groups[plan.launch_group(group, index)].env)


def _shown_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if v or k == "CUDA_VISIBLE_DEVICES"}


def describe_plan(plan: Any) -> dict:
    return {
        "table": plan.format_table(),
        "notices": list(plan.notices),
        "groups": {
            name: {
                "group": p.group,
                "nodes": len(p.node_indices),
                "device": p.device,
                "jax_backend": p.jax_backend,
                "gpu_ids": list(p.gpu_ids),
                "env": _shown_env(p.env),
            }
            for name, p in plan.groups.items()
        },
    }


# ---------------------------------------------------------------------------------------
# The measurements.


def actor_counts(max_actors: int) -> list[int]:
    """1, 2, 4, ... up to max_actors (always ending at it)."""
    counts, n = [], 1
    while n < max_actors:
        counts.append(n)
        n *= 2
    return [*counts, max_actors] if max_actors >= 1 else []


def largest_fit(free_mib: float, per_process_mib: float) -> int | None:
    """How many processes of `per_process_mib` fit in `free_mib` (None: they take none)."""
    if per_process_mib <= 0:
        return None
    return max(int(free_mib // per_process_mib), 0)


def memory_variant(
    variant: str,
    envs: Mapping[str, Mapping[str, str] | None],
    workers: Workers,
    nvml: NvmlProcesses,
    max_actors: int,
    gpu_index: int,
    total_mib: float,
    samples: int = 3,
) -> dict:
    """One learner, then actors added up to 1, 2, 4, ... max_actors; GPU MiB per process.

    Args:
      envs: "learner" and "actor" -> env overrides, or None for no overrides at all.
      gpu_index, total_mib: the GPU the learner uses and its memory, for the computed fits
        (free = total - in use before the learner started - the learner's peak).
    """
    gpu_before = nvml.used_mib()
    learner = workers.start("learner", "learner", envs["learner"], until_stopped=True)
    workers.wait_ready([learner])
    actors: list[Worker] = []
    steps = []
    failure = None
    for n in [0, *actor_counts(max_actors)]:
        new = [
            workers.start("actor", f"actor {i}", envs["actor"], until_stopped=True)
            for i in range(len(actors), n)
        ]
        actors += new
        workers.wait_ready(new)
        states = {w: w.state() for w in [learner, *actors]}
        failed = [w for w, s in states.items() if s["state"] not in ("ready", "done")]
        peaks = _sample(nvml, [learner, *actors], samples, workers.sizes["sample_every_s"])
        steps.append(
            {
                "actors": n,
                "learner_mib": peaks[learner.process.pid],
                "actor_mib": [peaks[a.process.pid] for a in actors],
                "all_ran": not failed,
                "gpu_used_mib": nvml.used_mib(),
            }
        )
        if failed:
            state = states[failed[0]]
            error = state.get("error") or f"not running its workload ({state['state']})"
            failure = {"process": failed[0].role, "error": error}
            break
    learner_state = workers.stop(learner)
    for actor in actors:
        workers.stop(actor)
    ran = [s["actors"] for s in steps if s["all_ran"]]
    learner_mib = max((s["learner_mib"] for s in steps if s["all_ran"]), default=0.0)
    actor_values = [m for s in steps if s["all_ran"] for m in s["actor_mib"]]
    per_actor = max(actor_values, default=0.0)
    free = total_mib - gpu_before[gpu_index] - learner_mib
    return {
        "variant": variant,
        "env": {role: None if env is None else _shown_env(env) for role, env in envs.items()},
        "gpu_used_before_mib": gpu_before,
        "steps": steps,
        "failure": failure,
        "learner": learner_state,
        "largest_n_ran": max(ran) if ran else None,
        "tried_up_to": steps[-1]["actors"] if steps else 0,
        "learner_mib": learner_mib,
        "per_actor_mib": per_actor,
        "free_after_learner_mib": free,
        "largest_n_computed": largest_fit(free, per_actor),
        "pids_listed": any(m != 0 for s in steps for m in [s["learner_mib"], *s["actor_mib"]]),
    }


def run_check(
    parts: Sequence[str],
    sizes: Mapping[str, Any],
    inventory: Any,
    nvml: NvmlProcesses,
    env_hook: EnvHook | None = None,
    root: Path | None = None,
) -> dict:
    """The measurements of `parts` on `inventory` (see the module docstring).

    Args:
      env_hook: (env, role) -> env for every worker; tests use it to run GPU-planned
        workers on the CPU of a machine without a GPU. None on a real run.
      root: where worker status files and logs go (a temporary folder by default).
    """
    from magi_lp.placement.jax_build import detect_jax_build

    build = detect_jax_build()
    max_actors = sizes["max_actors"]
    config = load_config(num_actors=max_actors)
    plan = make_plan(config, inventory)
    learner_gpus = plan.groups[plan.launch_group("learner", 0)].gpu_ids
    gpu = inventory[learner_gpus[0]] if learner_gpus else inventory.gpus[0]
    total_mib = gpu.memory_total_bytes / MIB
    result: dict[str, Any] = {
        "inventory": {
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "memory_total_mib": round(g.memory_total_bytes / MIB),
                    "memory_used_mib": round(g.memory_used_bytes / MIB),
                }
                for g in inventory.gpus
            ],
            "driver": inventory.driver_version,
            "cuda_driver_version": inventory.cuda_driver_version,
            "jax_build": build.describe(),
        },
        "plan": describe_plan(plan),
        "sizes": dict(sizes),
    }
    with tempfile.TemporaryDirectory(prefix="magi_lp_gpu_check_") as tmp:
        workers = Workers(root or Path(tmp), sizes, env_hook)
        try:
            if "learner" in parts:
                progress("learner: DrQ-v2 update under the plan's learner env")
                learner = workers.start("learner", "learner", group_env(plan, "learner"))
                workers.wait_ready([learner])
                peaks = _sample(nvml, [learner], 2, sizes["sample_every_s"])
                done = workers.wait_done(learner, READY_TIMEOUT_S)
                result["learner"] = {
                    **done,
                    "gpu_mib": peaks[learner.process.pid],
                    "env": _shown_env(group_env(plan, "learner")),
                }
            if "cpu_node" in parts:
                progress("cpu_node: the policy forward under the plan's actor env")
                env = group_env(plan, "actor")
                before = nvml.used_mib()
                node = workers.start("actor", "cpu node", env, until_stopped=True)
                workers.wait_ready([node])
                peaks = _sample(nvml, [node], 3, sizes["sample_every_s"])
                during = nvml.used_mib()
                result["cpu_node"] = {
                    **workers.stop(node),
                    "group": "actor",
                    "device": plan.groups[plan.launch_group("actor", 0)].device,
                    "gpu_mib": peaks[node.process.pid],
                    "listed_by_nvml": peaks[node.process.pid] != 0,
                    "gpu_used_before_mib": before,
                    "gpu_used_during_mib": during,
                    "env": _shown_env(env),
                }
            if "memory" in parts:
                gpu_plan = make_plan(
                    load_config(
                        {
                            **GPU_ACTOR_OVERRIDES,
                            "resources.learner.gpus": (gpu.index,),
                            "resources.actor.gpus": (gpu.index,),
                        },
                        num_actors=max_actors,
                    ),
                    inventory,
                )
                variants = {
                    "planned": {
                        "learner": group_env(plan, "learner"),
                        "actor": group_env(plan, "actor"),
                    },
                    "defaults": {"learner": None, "actor": None},
                    "gpu_actors": {
                        "learner": group_env(gpu_plan, "learner"),
                        "actor": group_env(gpu_plan, "actor"),
                    },
                }
                result["memory"] = {"gpu": gpu.label, "total_mib": round(total_mib)}
                for name in sizes.get("variants", VARIANTS):
                    progress(f"memory, {name}: a learner and up to {max_actors} actors")
                    result["memory"][name] = memory_variant(
                        name, variants[name], workers, nvml, max_actors, gpu.index, total_mib
                    )
                if "gpu_actors" in result["memory"]:
                    result["memory"]["gpu_actors"]["plan_admits"] = _plan_admits(gpu_plan)
            if "render" in parts:
                result["render"] = _render(workers, nvml, inventory)
            if "shared" in parts:
                result["shared"] = _shared(workers, nvml, inventory)
        finally:
            workers.stop_all()
    return result


def _plan_admits(plan: Any) -> int:
    """How many actors the plan's fractions admit next to the learner (sum <= 1)."""
    learner = plan.groups[plan.launch_group("learner", 0)].gpu_memory
    actor = plan.groups[plan.launch_group("actor", 0)].gpu_memory
    return int((1.0 - learner) / actor + 1e-9)


def _shared(workers: Workers, nvml: NvmlProcesses, inventory: Any) -> dict:
    """The 1-GPU shared layout: its learner and its batched GPU actors at once on GPU 0."""
    config = load_config(path=SHARED_CONFIG, argument="1gpu")
    gpu_id = inventory.gpus[0].index
    for group in ("learner", "actor"):
        config.resources[group].gpus = [gpu_id]
    plan = make_plan(config, inventory)
    envs = int(config.envs_per_actor)
    num_actors = min(int(config.num_actors), workers.sizes["max_actors"])
    progress(
        f"shared: learner + {num_actors} GPU actors x {envs} environments on GPU "
        f"{gpu_id} ({plan.device_split()})"
    )
    learner = workers.start("learner", "shared learner", group_env(plan, "learner"), True)
    actors = [
        workers.start("actor", f"shared actor {i}", group_env(plan, "actor", i), True, envs)
        for i in range(num_actors)
    ]
    everyone = [learner, *actors]
    workers.wait_ready(everyone)
    peaks = _sample(nvml, everyone, 3, workers.sizes["sample_every_s"])
    time.sleep(workers.sizes["learner_seconds"])  # all of them working at once
    states = [workers.stop(w) for w in everyone]
    return {
        "config": f"{SHARED_CONFIG}:1gpu",
        "device_split": plan.device_split(),
        "envs_per_actor": envs,
        "fractions": {
            group: plan.groups[plan.launch_group(group, 0)].gpu_memory
            for group in ("learner", "actor")
        },
        "learner": {**states[0], "gpu_mib": peaks[learner.process.pid]},
        "actors": [
            {**state, "gpu_mib": peaks[actor.process.pid]}
            for state, actor in zip(states[1:], actors, strict=True)
        ],
        "gpu_used_mib": nvml.used_mib(),
    }


def _render(workers: Workers, nvml: NvmlProcesses, inventory: Any) -> dict:
    import importlib.util

    if importlib.util.find_spec("mujoco") is None:
        return {
            "state": "skipped",
            "reason": "MuJoCo is not installed in this Python; carry it with "
            "scripts/gpu_check_wheels.sh (mujoco-core + PyOpenGL)",
        }
    gpu_id = inventory.gpus[0].index
    plan = make_plan(load_config({"resources.actor.render_gpu": gpu_id}, num_actors=1), inventory)
    env = group_env(plan, "actor")
    progress(f"render: MuJoCo EGL at 84x84 under the plan's actor env with render_gpu={gpu_id}")
    worker = workers.start("render", "render", env)
    workers.wait_ready([worker])
    peaks = _sample(nvml, [worker], 2, workers.sizes["sample_every_s"])
    done = workers.wait_done(worker, READY_TIMEOUT_S)
    return {**done, "gpu_mib": peaks[worker.process.pid], "env": _shown_env(env)}


# ---------------------------------------------------------------------------------------
# Entry point.


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    return {
        "batch": 256,
        "image": 84,
        "render_size": 84,
        "max_actors": args.max_actors or (2 if quick else 8),
        "learner_seconds": 5.0 if quick else 20.0,
        "render_seconds": 3.0 if quick else 10.0,
        "sample_every_s": 1.0,  # NVML's per-process numbers move slowly; 1 s apart is plenty
    }


def _machine(inventory: Any) -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return ""

    return {
        "gpu": ", ".join(f"{g.name} ({g.memory_total_bytes / 2**30:.0f} GiB)" for g in inventory)
        or "none",
        "driver": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "python": platform.python_version(),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
    }


def _save(out: Path, result: dict) -> str:
    """Writes `result` unless it would replace a GPU measurement with a non-measurement."""
    if result["status"] != "ok" and out.exists():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text()).get("status") == "ok":
                return f"kept the measured result in {out}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return f"wrote {out}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out",
        default="",
        help=f"where the JSON result goes (default {RESULT.relative_to(REPO)}; "
        f"{UNMEASURED.relative_to(REPO)} when nothing was measured)",
    )
    parser.add_argument("--quick", action="store_true", help="short windows, up to 2 actors")
    parser.add_argument("--max-actors", type=int, default=0, help="most actors per variant")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--worker", choices=("learner", "actor", "render"), help=argparse.SUPPRESS)
    parser.add_argument("--status", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument("--image", type=int, default=84, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--tiny-net", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")

    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.jax_build import detect_jax_build

    out = Path(args.out) if args.out else RESULT
    unmeasured_out = Path(args.out) if args.out else UNMEASURED
    started = time.monotonic()
    inventory = query_inventory()
    result: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(),
        "machine": _machine(inventory),
    }
    if not inventory.gpus:
        reason = f"no GPU ({inventory.reason or 'NVML listed none'})"
        saved = _save(unmeasured_out, {"status": "skipped", "reason": reason, **result})
        print(f"gpu_check: {reason}; nothing to measure here ({saved})")
        return 0
    build = detect_jax_build()
    if not build.serves_cuda:
        reason = (
            f"GPU {inventory.describe()} found, but this Python's JAX cannot use it "
            f"({build.describe()}): run `make setup JAX=cuda12`, or `make gpu-check "
            "GPU_CHECK_PYTHON=<a Python with CUDA JAX>`"
        )
        saved = _save(unmeasured_out, {"status": "error", "reason": reason, **result})
        print(f"gpu_check: {reason} ({saved})")
        return 1
    nvml = NvmlProcesses()
    try:
        measured = run_check(parts, _sizes(args), inventory, nvml)
    finally:
        nvml.close()
    result = {"status": "ok", **result, **measured}
    result["seconds"] = round(time.monotonic() - started, 1)
    print(_save(out, result))
    print(text_summary(result))
    return 0


# ---------------------------------------------------------------------------------------
# Reporting (also used by benchmarks.run for BENCHMARKS.md).


def _mib(value: Any) -> str:
    if value is None:
        return "-"
    if value < 0:
        return "listed (amount n/a)"
    return f"{value:,.0f}"


def text_summary(result: dict) -> str:
    """A few lines for the terminal."""
    lines = [f"GPU: {result['machine']['gpu']}, driver {result['machine']['driver']}"]
    learner = result.get("learner")
    if learner and learner.get("state") == "done":
        lines.append(
            f"learner: {learner['updates_per_second']:.1f} updates/s at batch "
            f"{learner['batch_size']}, {learner['observation']} "
            f"(first call {learner['first_call_s']:.1f} s) on {learner['device']}"
        )
    node = result.get("cpu_node")
    if node:
        lines.append(f"CPU node under the plan: {_mib(node['gpu_mib'])} MiB on the GPU")
    for name in VARIANTS:
        run = result.get("memory", {}).get(name)
        if run:
            lines.append(
                f"memory, {name}: learner {_mib(run['learner_mib'])} MiB, per actor "
                f"{_mib(run['per_actor_mib'])} MiB; ran with {run['largest_n_ran']} actors "
                f"(tried {run['tried_up_to']})"
            )
    render = result.get("render")
    if render and render.get("state") == "done":
        lines.append(
            f"render: {render['frames_per_second']:.0f} frames/s at 84x84 "
            f"({render.get('gl_renderer', 'renderer unknown')})"
        )
    return "\n".join(lines)


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    memory = result.get("memory", {})
    planned, defaults = memory.get("planned"), memory.get("defaults")
    learner = result.get("learner", {})
    rate = learner.get("updates_per_second") if learner.get("state") == "done" else None
    number = f"{fmt(rate, 1)} learner updates/s on {result['machine']['gpu']}"
    comparison = ratio = ""
    if planned and defaults:
        number += (
            f"; plan: learner {_mib(planned['learner_mib'])} MiB + "
            f"{_mib(planned['per_actor_mib'])} MiB per actor, ran {planned['largest_n_ran']}"
        )
        comparison = (
            f"JAX defaults: learner {_mib(defaults['learner_mib'])} MiB, per actor "
            f"{_mib(defaults['per_actor_mib'])} MiB, ran {defaults['largest_n_ran']} "
            f"actors of {defaults['tried_up_to']}"
        )
    return number, comparison, ratio


def report(result: dict) -> str:
    """Markdown for BENCHMARKS.md."""
    if result.get("status") != "ok":
        return ""
    m = result["machine"]
    lines = [
        f"Measured with `make gpu-check` on **{m['gpu']}**, NVIDIA driver {m['driver']} "
        f"(CUDA {m['cuda_driver_version'] // 1000}.{m['cuda_driver_version'] % 1000 // 10}), "
        f"Python {m['python']}, jax {m['jax']} / jaxlib {m['jaxlib']} "
        f"({result['inventory']['jax_build']}), {result['measured_at']}, commit "
        f"{result['commit']}, {result.get('seconds', '?')} s. Raw numbers: "
        "`benchmarks/gpu_check.json`.",
        "",
    ]
    if "plan" in result:
        lines += [
            f"The plan of `{CONFIG}` on that machine:",
            "",
            "```",
            *[f"notice: {n}" for n in result["plan"]["notices"]],
            result["plan"]["table"],
            "```",
            "",
        ]
    learner = result.get("learner")
    if learner:
        if learner.get("state") == "done":
            lines.append(
                f"**Learner**: {learner['updates_per_second']:.1f} updates/s at batch "
                f"{learner['batch_size']}, {learner['observation']} on {learner['device']} "
                f"({learner['backend']}), first call "
                f"(compile) {learner['first_call_s']:.1f} s apart; the process held "
                f"{_mib(learner['gpu_mib'])} MiB. The paper's V100: 24 updates/s."
            )
            if "batch" in learner:  # the frame replay's batch through the prefetcher
                variants = [
                    f"{learner[key]:.1f} updates/s {label}"
                    for key, label in (
                        (
                            "device_batch_per_second",
                            "on a batch already on the device (the update alone)",
                        ),
                        (
                            "host_batch_per_second",
                            "with each call copying its numpy batch (no prefetch)",
                        ),
                    )
                    if learner.get(key) is not None
                ]
                lines[-1] += (
                    f" Batches: {learner['batch']}, through the learner's device prefetcher"
                    + (f"; {'; '.join(variants)}." if variants else ".")
                )
        else:
            lines.append(f"**Learner** failed: `{learner.get('error', learner.get('state'))}`")
        lines.append("")
    node = result.get("cpu_node")
    if node:
        listed = "listed by NVML" if node["listed_by_nvml"] else "not listed by NVML"
        lines.append(
            f"**CPU node** (the plan's actor env, device {node['device']}, running the "
            f"policy forward on {node.get('backend', '?')}): {_mib(node['gpu_mib'])} MiB, "
            f"{listed}; GPU memory in use before / during: "
            f"{', '.join(_mib(v) for v in node['gpu_used_before_mib'])} / "
            f"{', '.join(_mib(v) for v in node['gpu_used_during_mib'])} MiB."
        )
        lines.append("")
    memory = result.get("memory")
    if memory:
        lines += [
            f"**GPU memory per process** on {memory['gpu']} ({memory['total_mib']:,} MiB), "
            "NVML by pid, peak of 3 samples once every process was running its workload:",
            "",
            "| variant | actors | learner MiB | MiB per actor | all ran |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name in VARIANTS:
            run = memory.get(name)
            for step in run["steps"] if run else []:
                lines.append(
                    f"| {name} | {step['actors']} | {_mib(step['learner_mib'])} "
                    f"| {', '.join(_mib(v) for v in step['actor_mib']) or '-'} "
                    f"| {'yes' if step['all_ran'] else 'no'} |"
                )
        lines += [
            "",
            "| variant | largest N that ran (measured) | largest N the GPU holds (computed: "
            "free after the learner / MiB per actor) |",
            "| --- | --- | --- |",
        ]
        for name in VARIANTS:
            run = memory.get(name)
            if not run:
                continue
            computed = run["largest_n_computed"]
            computed_text = (
                "not limited by GPU memory (actors hold none)" if computed is None else computed
            )
            if name == "gpu_actors" and "plan_admits" in run:
                computed_text = f"{computed_text}; the plan's fractions admit {run['plan_admits']}"
            failure = (
                f" (stopped: {run['failure']['process']}: {run['failure']['error'][:160]})"
                if run["failure"]
                else f" (tried up to {run['tried_up_to']})"
            )
            lines.append(f"| {name} | {run['largest_n_ran']}{failure} | {computed_text} |")
        if not any(memory[n]["pids_listed"] for n in VARIANTS if n in memory):
            lines += [
                "",
                "NVML listed none of these processes (a container's pid namespace?): "
                "compare the GPU totals in the JSON instead.",
            ]
        lines.append("")
    render = result.get("render")
    if render:
        if render.get("state") == "done":
            lines.append(
                f"**Rendering**: {render['frames_per_second']:.0f} frames/s "
                f"(mj_step + update_scene + render) at {render['frame']} with MuJoCo "
                f"{render['mujoco']}, MUJOCO_GL={render['mujoco_gl']}, GL renderer "
                f"`{render.get('gl_renderer', 'unknown')}`; the process held "
                f"{_mib(render['gpu_mib'])} MiB."
            )
        else:
            lines.append(
                f"**Rendering**: {render.get('state')}: "
                f"{render.get('reason') or render.get('error')}"
            )
        lines.append("")
    lines += _shared_report(result.get("shared"))
    return "\n".join(lines)


def _shared_report(shared: dict | None) -> list[str]:
    if not shared:
        return []
    learner, actors = shared["learner"], shared["actors"]
    done = learner.get("state") == "done" and all(a.get("state") == "done" for a in actors)
    if not done:
        failed = next(p for p in [learner, *actors] if p.get("state") != "done")
        return [f"**1-GPU shared layout** failed: `{failed.get('error', failed.get('state'))}`"]
    fractions = shared["fractions"]
    lines = [
        f"**1-GPU shared layout** (`{shared['config']}`, `{shared['device_split']}`): the "
        f"learner (gpu_memory {fractions['learner']}) and {len(actors)} GPU actors (at most "
        f"{fractions['actor']} each, {shared['envs_per_actor']} environments per batched "
        "policy call) at once on one GPU, each its own process:",
        "",
        "| process | GPU MiB | rate while sharing |",
        "| --- | --- | --- |",
        f"| learner | {_mib(learner['gpu_mib'])} | {learner['updates_per_second']:.1f} updates/s "
        f"(batch {learner['batch_size']}, {learner['observation']}) |",
    ]
    for index, actor in enumerate(actors):
        lines.append(
            f"| actor {index} | {_mib(actor['gpu_mib'])} | "
            f"{actor['actions_per_second']:.0f} actions/s ({actor['steps_per_second']:.0f} "
            f"batched calls/s) |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
