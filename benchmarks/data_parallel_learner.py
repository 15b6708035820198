"""Figure 9: DrQ-v2 learner updates/s on 1 and 2 devices (the data-parallel learner).

A learner node that sees n > 1 devices runs the agent's update data-parallel over them
(`magi_lp.agent.data_parallel`: batch split, gradients averaged, state replicated). This
figure runs `DrQLearner.step()` (the toolkit's learner: update, count, metrics to the host)
on a fixed numpy batch, in one fresh process per device count, as the plan starts a learner:

  cpu  `resources.learner.cpu_devices: n`, i.e. XLA_FLAGS=--xla_force_host_platform_device_count
       =n with JAX_PLATFORMS=cpu. n host devices share the machine's cores, so this shows what
       the data-parallel program costs on top of the same arithmetic (CPU-s per update), not
       a speed-up; it is how the multi-device learner is tested without GPUs.
  gpu  on a machine with two or more GPUs of one model: CUDA_VISIBLE_DEVICES=0 and =0,1.
       Not run on a machine without them (this one).

Sizes: the paper's (batch 256, 84x84x9) and a small one (batch 32, 32x32x9), the paper's
network widths. Compile time (the first update) is reported apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    figure_main,
    fmt,
    marked_env,
    process_cpu_seconds,
    progress,
    ratio,
    tail,
)

TITLE = "Data-parallel learner: DrQ-v2 updates/s on 1 and 2 devices"
DEVICE_COUNTS = (1, 2)


def subprocess_env() -> dict[str, str]:
    return {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _sizes(quick: bool) -> list[dict]:
    sizes = [{"name": "small", "batch_size": 32, "image_size": 32, "updates": 6 if quick else 30}]
    if not quick:
        sizes.insert(0, {"name": "paper", "batch_size": 256, "image_size": 84, "updates": 8})
    return sizes


def worker(batch_size: int, image_size: int, updates: int) -> dict:
    """In a process whose devices are set: DrQLearner steps on one fixed batch."""
    import itertools

    import jax
    import numpy as np
    from acme import types
    from dm_env import specs

    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.learner import DrQLearner
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("reacher", "hard")
    config.batch_size = batch_size
    networks = make_networks(specs.BoundedArray((2,), np.float32, -1.0, 1.0), config)
    rng = np.random.default_rng(0)
    shape = (batch_size, image_size, image_size, 9)  # RGB x frame stack 3
    batch = types.Transition(
        observation=rng.integers(0, 256, shape, dtype=np.uint8),
        action=rng.uniform(-1, 1, (batch_size, 2)).astype(np.float32),
        reward=rng.uniform(0, 1, (batch_size,)).astype(np.float32),
        discount=np.full((batch_size,), 0.99**3, np.float32),
        next_observation=rng.integers(0, 256, shape, dtype=np.uint8),
    )
    learner = DrQLearner(
        networks,
        config,
        replay_schedule(config, action_repeat=2),
        itertools.repeat(batch),
        jax.random.PRNGKey(0),
        np.zeros(shape[1:], np.uint8),
    )
    start = time.perf_counter()
    learner.step()
    first = time.perf_counter() - start
    durations = []
    cpu = process_cpu_seconds()
    start = time.perf_counter()
    for _ in range(updates):
        t = time.perf_counter()
        learner.step()  # ends with the metrics on the host: each update waited for
        durations.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    cpu = process_cpu_seconds() - cpu
    parallel = learner.data_parallel
    return {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "devices": parallel.num_devices if parallel else 1,
        "batch_size": batch_size,
        "observation": f"{image_size}x{image_size}x9 uint8",
        "updates_timed": updates,
        "updates_per_second": updates / wall,
        "median_update_ms": float(np.median(durations)) * 1e3,
        "cpu_seconds_per_update": cpu / updates,
        "first_call_s": first,
    }


def _run_worker(backend: str, devices: int, size: dict, logs: Path) -> dict:
    if backend == "cpu":
        env = {
            "JAX_PLATFORMS": "cpu",
            "CUDA_VISIBLE_DEVICES": "",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        }
    else:
        env = {
            "JAX_PLATFORMS": "cuda,cpu",
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(devices)),
            "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.8",
            "XLA_CLIENT_MEM_FRACTION": "",  # jaxlib 0.11 raises with both set
        }
    log = logs / f"data_parallel_{backend}{devices}_{size['name']}.log"
    arguments = [str(size[key]) for key in ("batch_size", "image_size", "updates")]
    with open(log, "wb") as out:
        process = subprocess.run(
            [sys.executable, "-m", "benchmarks.data_parallel_learner", "--worker", *arguments],
            cwd=REPO,
            env=marked_env(env),
            stdout=subprocess.PIPE,
            stderr=out,
            timeout=1200,
        )
    if process.returncode != 0:
        raise RuntimeError(f"{backend} x{devices} worker failed: {tail(log, 20)}")
    return json.loads(process.stdout.decode().strip().splitlines()[-1])


def _identical_gpus() -> int:
    """How many GPUs of the first GPU's model this machine has (0 without NVML)."""
    from magi_lp.placement.gpu_inventory import query_inventory

    inventory = query_inventory()
    if not len(inventory):
        return 0
    first = inventory.gpus[0].name
    return sum(1 for gpu in inventory.gpus if gpu.name == first)


def measure(quick: bool) -> dict:
    logs = REPO / "benchmarks" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    backends = ["cpu"]
    if _identical_gpus() >= 2:
        backends.append("gpu")
    results: dict[str, Any] = {"backends": {}}
    for backend in backends:
        per_size: dict[str, Any] = {}
        for size in _sizes(quick):
            runs = {}
            for devices in DEVICE_COUNTS:
                progress(
                    f"{backend} x{devices}: batch {size['batch_size']}, {size['image_size']}px"
                )
                runs[str(devices)] = _run_worker(backend, devices, size, logs)
                progress(f"  {runs[str(devices)]['updates_per_second']:.2f} updates/s")
            one, two = runs["1"], runs["2"]
            per_size[size["name"]] = {
                "runs": runs,
                "speedup": ratio(two["updates_per_second"], one["updates_per_second"]),
                "cpu_ratio": ratio(two["cpu_seconds_per_update"], one["cpu_seconds_per_update"]),
            }
        results["backends"][backend] = per_size
    return results


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    cpu = result["backends"]["cpu"]
    name = "paper" if "paper" in cpu else next(iter(cpu))
    size = cpu[name]
    one, two = size["runs"]["1"], size["runs"]["2"]
    gpu = result["backends"].get("gpu", {}).get(name)
    gpu_text = f"; 2 GPUs: x{fmt(gpu['speedup'], 2)}" if gpu else "; GPUs: not measured (none here)"
    return (
        f"{fmt(two['updates_per_second'], 2)} updates/s on 2 host devices, "
        f"{fmt(one['updates_per_second'], 2)} on 1 (CPU, batch {one['batch_size']}, "
        f"{one['observation'].split()[0]})",
        f"CPU-s per update: {fmt(two['cpu_seconds_per_update'], 2)} vs "
        f"{fmt(one['cpu_seconds_per_update'], 2)}{gpu_text}",
        f"{fmt(size['speedup'], 3)} (CPU-s ratio {fmt(size['cpu_ratio'], 3)})",
    )


def report(result: dict) -> str:
    lines = [
        "| backend | size | devices | updates/s | median update | CPU-s per update "
        "| first call | 2-device / 1-device |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, sizes in result["backends"].items():
        for name, size in sizes.items():
            for devices, run in size["runs"].items():
                versus = (
                    f"x{fmt(size['speedup'], 3)} updates/s, x{fmt(size['cpu_ratio'], 3)} CPU-s"
                    if devices == "2"
                    else ""
                )
                lines.append(
                    f"| {backend} ({run['device']}) | {name}: batch {run['batch_size']}, "
                    f"{run['observation']} | {run['devices']} "
                    f"| {fmt(run['updates_per_second'], 2)} | {fmt(run['median_update_ms'], 1)} ms "
                    f"| {fmt(run['cpu_seconds_per_update'], 2)} | {fmt(run['first_call_s'], 1)} s "
                    f"| {versus} |"
                )
    gpu = "gpu" in result["backends"]
    lines += [
        "",
        "How: `DrQLearner.step()` (jitted update, counter, metrics fetched to the host, so each "
        "update is waited for) on one fixed numpy batch, in a fresh process per device count "
        "with the env the plan gives such a learner; the learner goes data-parallel by itself "
        "when it sees 2 devices. CPU: 2 host devices share this machine's cores, so the ratio "
        "of CPU-s per update is the cost of the data-parallel program (split batch, gradient "
        "all-reduce), and updates/s cannot double. "
        + (
            "GPU: CUDA_VISIBLE_DEVICES=0 vs 0,1."
            if gpu
            else "GPU: not measured, no machine with two identical GPUs was available."
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        batch, image, count = (int(v) for v in sys.argv[2:5])
        print(json.dumps(worker(batch, image, count)))
        sys.stdout.flush()
        import os

        os._exit(0)  # TF/Reverb threads need not be waited for
    figure_main(measure)
