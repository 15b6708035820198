"""The GPU check's measurements: memory per process under the plan and its variants, the
CPU node's GPU footprint, the learner, rendering and the shared 1-GPU layout.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import progress
from benchmarks.gpu_check import reckoning
from benchmarks.gpu_check.harness import EnvHook, NvmlProcesses, Worker, Workers, sample_peaks
from benchmarks.gpu_check.plan import _shown_env, describe_plan, group_env, load_config, make_plan
from benchmarks.gpu_check.settings import (
    GPU_ACTOR_OVERRIDES,
    MIB,
    READY_TIMEOUT_S,
    SHARED_CONFIG,
    VARIANTS,
)


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
        peaks = sample_peaks(nvml, [learner, *actors], samples, workers.sizes["sample_every_s"])
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
                peaks = sample_peaks(nvml, [learner], 2, sizes["sample_every_s"])
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
                peaks = sample_peaks(nvml, [node], 3, sizes["sample_every_s"])
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
            if "reckoning" in parts:
                result["reckoning"] = (
                    reckoning.run_part(nvml, inventory, root or Path(tmp))
                    if env_hook is None
                    else {"state": "skipped", "reason": "needs a real GPU"}
                )
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
    plan = reckoning.sized_if_possible(config, make_plan(config, inventory))
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
    peaks = sample_peaks(nvml, everyone, 3, workers.sizes["sample_every_s"])
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
    peaks = sample_peaks(nvml, [worker], 2, workers.sizes["sample_every_s"])
    done = workers.wait_done(worker, READY_TIMEOUT_S)
    return {**done, "gpu_mib": peaks[worker.process.pid], "env": _shown_env(env)}
