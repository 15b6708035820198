"""Figure 1: DrQ-v2 learner updates per second, compile time reported apart.

The jitted update of `projects.drq_v2.learning.make_update_fn` (random-shift augmentation of
observation and next observation, critic + encoder Adam step, actor Adam step, soft target
update) with the paper's networks (4 conv layers of 32 channels, feature 50, hidden 1024),
fed a numpy batch every call as the replay iterator does (so a GPU run pays the host-to-device
copy). Two sizes: the paper's (batch 256, 84x84x9) and a small one (batch 32, 32x32x9, same
network widths). Runs on JAX's default backend: the CPU here, the GPU on a machine with one.

Comparison: the DrQ-v2 paper trains at about 96 frames/s on one V100; at action repeat 2 and
one update every 2 agent steps that is 96 / 2 / 2 = 24 updates/s. Different hardware: the
ratio says how far this machine is from the paper's, not how good the code is.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import figure_main, fmt, process_cpu_seconds, progress, ratio

TITLE = "DrQ-v2 learner updates per second"
PAPER_FRAMES_PER_SECOND = 96.0  # Yarats et al. 2021: ~3.3 h per 1M frames on one V100
PAPER_UPDATES_PER_SECOND = PAPER_FRAMES_PER_SECOND / 2 / 2  # action repeat 2, update every 2


def subprocess_env() -> dict[str, str]:
    # The default backend: the GPU when there is one. MuJoCo is not used.
    return {"TF_CPP_MIN_LOG_LEVEL": "2"}


def _sizes(quick: bool) -> list[dict]:
    return [
        {
            "name": "paper",
            "batch_size": 256,
            "image_size": 84,
            "min_updates": 2 if quick else 5,
            "min_seconds": 3.0 if quick else 20.0,
        },
        {
            "name": "small",
            "batch_size": 32,
            "image_size": 32,
            "min_updates": 10 if quick else 30,
            "min_seconds": 3.0 if quick else 15.0,
        },
    ]


def measure_size(batch_size: int, image_size: int, min_updates: int, min_seconds: float) -> dict:
    """Compile time and steady updates/s of one batch and image size."""
    import jax
    import numpy as np
    from acme import types
    from dm_env import specs

    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.learning import init_training_state, make_update_fn
    from projects.drq_v2.networks import encoder_repr_dim, make_networks

    config = get_agent_config("reacher", "hard")
    config.batch_size = batch_size
    action_spec = specs.BoundedArray((2,), np.float32, -1.0, 1.0)  # reacher: 2 joints
    networks = make_networks(action_spec, config)
    channels = 3 * 3  # RGB x frame stack 3
    obs_example = np.zeros((image_size, image_size, channels), np.uint8)
    state = init_training_state(networks, config, jax.random.PRNGKey(0), obs_example)
    update = make_update_fn(networks, config, replay_schedule(config, action_repeat=2))

    rng = np.random.default_rng(0)
    shape = (batch_size, image_size, image_size, channels)
    batch = types.Transition(
        observation=rng.integers(0, 256, shape, dtype=np.uint8),
        action=rng.uniform(-1, 1, (batch_size, 2)).astype(np.float32),
        reward=rng.uniform(0, 1, (batch_size,)).astype(np.float32),
        discount=np.full((batch_size,), 0.99**3, np.float32),
        next_observation=rng.integers(0, 256, shape, dtype=np.uint8),
    )

    start = time.perf_counter()
    state, metrics = update(state, batch)
    jax.block_until_ready((state, metrics))
    first_call = time.perf_counter() - start

    durations = []
    cpu_start = process_cpu_seconds()
    start = time.perf_counter()
    while len(durations) < min_updates or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        state, metrics = update(state, batch)
        jax.block_until_ready(state)
        durations.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    cpu_seconds = process_cpu_seconds() - cpu_start
    if not np.isfinite(float(metrics["critic_loss"])):
        raise RuntimeError("the update produced a non-finite critic loss")
    per_update = float(np.median(durations))
    params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    return {
        "batch_size": batch_size,
        "observation": f"{image_size}x{image_size}x{channels} uint8",
        "repr_dim": encoder_repr_dim((image_size, image_size), config),
        "parameters": int(params),
        "updates_timed": len(durations),
        "min_updates": min_updates,
        "min_seconds": min_seconds,
        "updates_per_second": len(durations) / elapsed,
        "median_update_ms": per_update * 1e3,
        # Core-seconds per update: what a loaded machine inflates least.
        "cpu_seconds_per_update": cpu_seconds / len(durations),
        "first_call_s": first_call,
        "compile_s": max(first_call - per_update, 0.0),
    }


def measure(quick: bool) -> dict:
    import jax

    device = jax.devices()[0]
    results: dict[str, Any] = {
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "devices": len(jax.devices()),
        "sizes": {},
    }
    for size in _sizes(quick):
        name = size.pop("name")
        progress(f"learner update, {name}: batch {size['batch_size']}, {size['image_size']}px")
        results["sizes"][name] = measure_size(**size)
        progress(f"  {results['sizes'][name]['updates_per_second']:.2f} updates/s")
    return results


def _cores_busy(size: dict) -> str:
    cpu, wall = size.get("cpu_seconds_per_update"), size.get("median_update_ms")
    if not cpu or not wall:
        return ""
    return (
        f"XLA may use every core; CPU-s / wall time per update = {cpu / (wall / 1e3):.1f} "
        "cores kept busy at the paper size."
    )


def _where(result: dict) -> str:
    backend, device = result["backend"].upper(), result["device"]
    return backend if device.upper() == backend else f"{backend} ({device})"


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    rate = result["sizes"]["paper"]["updates_per_second"]
    small = result["sizes"].get("small", {}).get("updates_per_second")
    return (
        f"{fmt(rate, 2)} updates/s (batch 256, 84x84x9, {result['backend']}); "
        f"{fmt(small, 1)} at batch 32, 32x32",
        f"{PAPER_UPDATES_PER_SECOND:.0f} updates/s (paper, one V100; other hardware)",
        fmt(ratio(rate, PAPER_UPDATES_PER_SECOND), 3),
    )


def report(result: dict) -> str:
    paper = result["sizes"].get("paper", {})
    rate = paper.get("updates_per_second")
    lines = [
        f"**{fmt(rate, 2)} updates/s** at batch 256, 84x84x9 on {_where(result)}, against "
        f"the paper's implied **{PAPER_UPDATES_PER_SECOND:.0f} "
        f"updates/s** on one V100: ratio **{fmt(ratio(rate, PAPER_UPDATES_PER_SECOND), 3)}**. "
        "Different hardware: this says how far this machine is from the paper's GPU, not "
        "how efficient the code is.",
        "",
        "| size | batch | observation | updates/s | median update | CPU-s per update "
        "| compile (first call) | vs 24/s (V100) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, size in result["sizes"].items():
        lines.append(
            f"| {name} | {size['batch_size']} | {size['observation']} "
            f"| {fmt(size['updates_per_second'], 2)} | {fmt(size['median_update_ms'], 1)} ms "
            f"| {fmt(size.get('cpu_seconds_per_update'), 2)} "
            f"| {fmt(size['compile_s'], 1)} s ({fmt(size['first_call_s'], 1)} s) "
            f"| {fmt(ratio(size['updates_per_second'], PAPER_UPDATES_PER_SECOND), 3)} |"
        )
    lines += [
        "",
        "How: `make_update_fn` jitted, the paper's network widths (encoder 4x conv 32, "
        "feature 50, hidden 1024; "
        f"{fmt(paper.get('parameters'))} parameters at 84x84), a fresh numpy batch handed to "
        "every call as the replay iterator does; compile time = first call minus one "
        "steady update, excluded from the rate; CPU-s per update = this process's CPU time "
        "over the timed updates / updates (all threads; what a loaded machine inflates "
        "least, and /cores gives the best wall time to expect); the rate is updates / wall "
        "time over at "
        f"least {paper.get('min_updates')} updates and {fmt(paper.get('min_seconds'), 0)} s "
        "(paper size), each update waited for. Replay sampling is not included "
        "(`python -m benchmarks.replay_memory table --sample-batches N` times it). "
        "The paper's rate: ~96 frames/s "
        "(~3.3 h per 1M frames) / action repeat 2 / one update per 2 agent steps = 24 "
        f"updates/s. {_cores_busy(paper)}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
