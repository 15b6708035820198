"""The compressed host frame store (`replay.store='host'`): bytes per transition on real
reacher frames, host CPU per 256-batch sampled and decompressed, and DrQ-v2's learner fed by
it against its update alone.

Parts, each in this process (JAX on the CPU here):
- frames: reacher/hard rendered at 84x84 (random actions, the paper's camera and action
  repeat): each frame's zstd size at the store's level.
- bytes: a `CompressedFrameStore` of `transitions` filled through its writer API with
  500-step episodes cycling those real frames (each frame compressed as it is added: the same
  sizes as the same frames in a real run); the process's resident memory before and after,
  over the transitions it holds, against the store's own count and the plan's estimate.
- sample: `sample()` of a 256-batch from that store: this thread's CPU time per batch (the
  draw, copying the batch's compressed frames, decompressing them into one array).
- learner: DrQ-v2's learner (the paper's networks, 84x84) fed by `HostReplayIterator` through
  its prefetch thread, against its update on a batch already on the device, in alternating
  blocks so both see the same load.
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.common import figure_main, fmt, progress
from benchmarks.device_store import BATCH, drq_learner, fed_against_alone, frame_spec

TITLE = "Compressed host frame store: bytes per transition, CPU per 256-batch, learner fed"
GOAL_BYTES = 8192
GOAL_FED = 0.95


def subprocess_env() -> dict[str, str]:
    return {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def real_frames(count: int) -> np.ndarray:
    """`count` reacher/hard frames at 84x84 (the newest of each stacked observation)."""
    from projects.drq_v2.environment import make_environment

    env = make_environment("reacher", "hard", seed=0)
    shape = env.action_spec().shape
    rng = np.random.default_rng(0)
    frames = []
    timestep = env.reset()
    while len(frames) < count:
        frames.append(timestep.observation[..., -3:].copy())
        timestep = env.reset() if timestep.last() else env.step(rng.uniform(-1, 1, shape))
    return np.stack(frames)


def fill(store, frames: np.ndarray, steps: int) -> None:
    """`steps` steps of 500-step episodes cycling `frames`, one writer."""
    action = np.zeros(6, np.float32)
    store.add_first(0, frames[0])
    for t in range(steps):
        last = t % 500 == 499
        store.add(0, frames[(t + 1) % len(frames)], action, 1.0, 1.0, last=last)
        if last:
            store.add_first(0, frames[(t + 2) % len(frames)])


def measure_frames(frames: np.ndarray) -> dict:
    import zstandard

    from magi_lp.replay.compressed_frames import ZSTD_LEVEL

    context = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    sizes = np.array([len(context.compress(f.tobytes())) for f in frames])
    return {
        "frames": len(frames),
        "raw_bytes": int(frames[0].nbytes),
        "mean_bytes": float(sizes.mean()),
        "max_bytes": int(sizes.max()),
        "level": ZSTD_LEVEL,
    }


def measure_bytes(frames: np.ndarray, transitions: int) -> tuple[dict, object]:
    from magi_lp.replay.compressed_frames import CompressedFrameStore, estimated_nbytes

    spec = frame_spec(transitions)
    before = _rss()
    store = CompressedFrameStore(spec, writers=1)
    start = time.perf_counter()
    cpu = time.thread_time()
    fill(store, frames, int(transitions * 1.05))  # past capacity: the ring has wrapped
    cpu = time.thread_time() - cpu
    wall = time.perf_counter() - start
    rss = _rss() - before
    info = store.info()
    return {
        "transitions": store.size,
        "rss_bytes": rss,
        "rss_per_transition": rss / store.size,
        "store_bytes": store.nbytes(),
        "store_per_transition": store.nbytes() / store.size,
        "frame_bytes_per_transition": info["replay_frame_bytes"] / store.size,
        "estimated_per_transition": estimated_nbytes(spec, 4) / spec.capacity,
        "evicted_early": info["replay_evicted_early"],
        "add_cpu_us_per_step": 1e6 * cpu / int(transitions * 1.05),
        "fill_s": wall,
    }, store


def measure_sample(store, batches: int) -> dict:
    store.sample()
    times = []
    for _ in range(batches):
        cpu = time.thread_time()
        store.sample()
        times.append(time.thread_time() - cpu)
    return {
        "batches": batches,
        "cpu_ms_per_batch": 1e3 * float(np.median(times)),
        "cpu_ms_mean": 1e3 * float(np.mean(times)),
    }


def measure_learner(store, batch: int, blocks: int, per_block: int) -> dict:
    """DrQ-v2's learner fed by the store (prefetch thread) vs its update alone, alternating."""
    import jax

    from magi_lp.replay.compressed_frames import HostReplayIterator

    store.spec = frame_spec(store.spec.capacity, batch)  # the same frames, this batch size
    learner = drq_learner(HostReplayIterator(store), store.spec)
    fixed = jax.device_put(store.sample())
    return {"batch": batch, **fed_against_alone(learner, fixed, blocks, per_block)}


def measure(quick: bool) -> dict:
    progress("rendering reacher frames")
    frames = real_frames(200 if quick else 2000)
    result = {"frames": measure_frames(frames)}
    progress("filling the store")
    result["bytes"], store = measure_bytes(frames, 20_000 if quick else 1_000_000)
    progress("sampling")
    result["sample"] = measure_sample(store, 5 if quick else 40)
    progress("learner")
    result["learner"] = measure_learner(
        store, 32 if quick else BATCH, 1 if quick else 3, 2 if quick else 4
    )
    return result


def summary(result: dict) -> tuple[str, str, str]:
    b, s, learner = result["bytes"], result["sample"], result["learner"]
    return (
        f"{fmt(b['rss_per_transition'], 0)} bytes/transition at {b['transitions']:,} "
        f"(resident); {fmt(s['cpu_ms_per_batch'], 1)} CPU ms per {BATCH}-batch",
        f"goal <= {GOAL_BYTES} bytes; fed goal >= {GOAL_FED}",
        f"{fmt(learner['ratio'], 3)} fed",
    )


def report(result: dict) -> str:
    f, b, s, learner = result["frames"], result["bytes"], result["sample"], result["learner"]
    machine = result.get("run", {}).get("machine", "this machine")
    return "\n".join(
        [
            f"Machine: {machine}. `replay.store='host'`: each frame once, zstd in a fixed arena "
            "in the learner's host memory, sampled and decompressed on the learner's prefetch "
            "thread. The learner figure alternates blocks fed by the store with blocks of the "
            "update alone on one batch already on the device, so both see the same load.",
            "",
            f"Reacher/hard frames at 84x84x3 ({f['frames']} rendered, zstd level {f['level']}):"
            f" {fmt(f['mean_bytes'], 0)} bytes on average of {f['raw_bytes']}, at most "
            f"{f['max_bytes']}.",
            "",
            "| measure | value |",
            "|---|---|",
            f"| transitions held | {b['transitions']:,} |",
            f"| resident bytes per transition (process RSS growth) | "
            f"{fmt(b['rss_per_transition'], 0)} |",
            f"| store's bytes per transition (arena + rows + index) | "
            f"{fmt(b['store_per_transition'], 0)} |",
            f"| compressed frame bytes per transition | "
            f"{fmt(b['frame_bytes_per_transition'], 0)} |",
            f"| the plan's estimate per transition | {fmt(b['estimated_per_transition'], 0)} |",
            f"| evicted early for arena space | {b['evicted_early']} |",
            f"| writer CPU per step (compress + bookkeeping) | "
            f"{fmt(b['add_cpu_us_per_step'], 0)} us |",
            f"| CPU per {BATCH}-batch sample + decompress (median, mean) | "
            f"{fmt(s['cpu_ms_per_batch'], 1)} ms, {fmt(s['cpu_ms_mean'], 1)} ms |",
            f"| DrQ-v2 learner fed by it (batch {learner['batch']}, jax {learner['jax']}) | "
            f"{fmt(learner['fed_updates_per_s'], 3)} updates/s |",
            f"| the update alone, batch on the device | "
            f"{fmt(learner['alone_updates_per_s'], 3)} updates/s |",
            f"| fed ratio (goal >= {GOAL_FED}) | **{fmt(learner['ratio'], 3)}** |",
        ]
    )


if __name__ == "__main__":
    figure_main(measure)
