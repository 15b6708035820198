"""Figure: learner-side replay sampling cost per 256-item batch at 84x84, frame stack 3.

Renders real reacher_hard transitions once (the project's pixel environment, random
actions), inserts them with the DrQ builder's adder into a dedicated Reverb server process
(the builder's table, not rate limited), then times the learner side of sampling in this
process for two pipelines, each with 1, 2 and 4 sampling threads (`num_parallel_calls`:
Reverb readers and tf.data workers):

  host_stacked   `make_frame_replay_dataset(stack_on_host=True)`: tf.data rebuilds both
                 stacked observations (a channels-last transpose of the batch) on the host;
                 the pipeline of commit 457c3a9, before this figure existed.
  device_window  `stack_on_host=False` (what the DrQ builder uses now): the batch holds each
                 transition's unique frames [B, frame_stack + n_step, H, W, 3]; the learner
                 stacks them inside its jitted update, on its device.

Per pipeline and thread count: CPU ms per batch (all threads of this process: Reverb's
readers and decompression, tf.data, the numpy hand-off), wall ms per batch and batches/s.
From the CPU cost: the batches one sampling core can deliver per second, which at one batch
per update is the updates/s a GPU learner could be fed, and the frames/s that means at the
paper's replay ratio (one update per 2 agent steps of 2 frames). Goal: <= 4 ms CPU per batch
per core, i.e. >= 250 updates/s (1M frames in under 20 minutes) from one core. The device
side of the stacking is timed apart, on this machine's CPU (on a GPU it is one fused copy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import (
    REPO,
    cpu_only_env,
    figure_main,
    fmt,
    marked_env,
    median,
    process_cpu_seconds,
    progress,
    ratio,
)

TITLE = "Replay sampling per 256-item batch (84x84, frame stack 3)"
PIPELINES = ("host_stacked", "device_window")
THREADS = (1, 2, 4)
BATCH_SIZE = 256
GOAL_CPU_MS = 4.0
FRAMES_PER_UPDATE = 4  # paper: one update per 2 agent steps, action repeat 2
GPU_UPDATES_GOAL = 250  # >= 1,000 frames/s: 1M frames in under 20 minutes


def subprocess_env() -> dict[str, str]:
    return cpu_only_env()


def _dataset(config, client, pipeline: str, threads: int):
    """The DrQ builder's dataset (its table and settings) with `threads` sampling threads."""
    from magi_lp.replay.frame_replay import make_frame_replay_dataset
    from magi_lp.replay.stores.reverb_frames import FRAME_TABLE

    return make_frame_replay_dataset(
        client.server_address,
        FRAME_TABLE,
        batch_size=BATCH_SIZE,
        frame_stack=int(config.env.frame_stack),
        n_step=int(config.agent.n_step),
        discount=float(config.agent.discount),
        stack_on_host=pipeline == "host_stacked",
        num_parallel_calls=threads,
    )


def time_pipeline(config, client, pipeline: str, threads: int, batches: int) -> dict:
    """CPU and wall time per batch after 3 warm-up batches."""
    iterator = _dataset(config, client, pipeline, threads)
    for _ in range(3):
        next(iterator)
    start, start_cpu = time.perf_counter(), process_cpu_seconds()
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - start
    cpu_ms = 1000 * (process_cpu_seconds() - start_cpu) / batches
    return {
        "cpu_ms_per_batch": cpu_ms,
        "wall_ms_per_batch": 1000 * wall / batches,
        "batches_per_second": batches / wall,
        "updates_per_second_per_core": 1000 / cpu_ms,
        "batches_timed": batches,
    }


def time_device_stacking(n_step: int, frame_stack: int, repeats: int) -> dict:
    """CPU ms of `window_observations` jitted on this process's JAX device (the CPU here)."""
    import jax
    import numpy as np

    from magi_lp.replay.frame_window import window_observations

    frames = np.zeros((BATCH_SIZE, frame_stack + n_step, 84, 84, 3), np.uint8)
    stack = jax.jit(window_observations, static_argnums=1)
    window = jax.device_put(frames)
    jax.block_until_ready(stack(window, n_step))
    start = process_cpu_seconds()
    for _ in range(repeats):
        jax.block_until_ready(stack(window, n_step))
    return {
        "device": str(jax.devices()[0]),
        "cpu_ms_per_batch": 1000 * (process_cpu_seconds() - start) / repeats,
    }


def measure(quick: bool) -> dict:
    import reverb

    from benchmarks import replay_memory

    transitions = 300 if quick else 2000
    batches = 3 if quick else 40
    progress(f"rendering {transitions} transitions of reacher_hard at 84x84")
    episodes = replay_memory.render_episodes(transitions)
    config = replay_memory._experiment().config
    results: dict = {}
    with tempfile.TemporaryDirectory() as checkpoint_dir:
        serve = ["serve", "frame_replay", str(10 * transitions), checkpoint_dir]
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.replay_memory", *serve],
            cwd=REPO,
            env=marked_env(cpu_only_env()),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            client = reverb.Client(f"localhost:{int(server.stdout.readline())}")
            replay_memory._insert("frame_replay", client, episodes, 1)
            items = int(client.server_info()[replay_memory.TABLE].current_size)
            for pipeline in PIPELINES:
                results[pipeline] = {}
                for threads in THREADS:
                    progress(f"{pipeline}, {threads} sampling thread(s)")
                    row = time_pipeline(config, client, pipeline, threads, batches)
                    results[pipeline][str(threads)] = row
                    progress(
                        f"  {row['cpu_ms_per_batch']:.1f} CPU ms/batch, "
                        f"{row['batches_per_second']:.1f} batches/s"
                    )
        finally:
            replay_memory.stop_server(server)
    n_step, frame_stack = int(config.agent.n_step), int(config.env.frame_stack)
    return {
        "transitions": transitions,
        "items": items,
        "batch_size": BATCH_SIZE,
        "n_step": n_step,
        "frame_stack": frame_stack,
        "cores": os.cpu_count(),
        "pipelines": results,
        "device_stacking": time_device_stacking(n_step, frame_stack, 3 if quick else 10),
        "goal_cpu_ms": GOAL_CPU_MS,
    }


def _per_core(result: dict, pipeline: str) -> dict:
    """A pipeline's CPU ms per batch (the median over its thread counts: the work per batch
    does not depend on how many threads share it) and the updates/s one core feeds."""
    cpu_ms = median([row["cpu_ms_per_batch"] for row in result["pipelines"][pipeline].values()])
    return {"cpu_ms_per_batch": cpu_ms, "updates_per_second_per_core": 1000 / cpu_ms}


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    after, before = _per_core(result, "device_window"), _per_core(result, "host_stacked")
    return (
        f"{fmt(after['cpu_ms_per_batch'])} CPU ms/batch (frames stacked on the learner's "
        f"device): {fmt(after['updates_per_second_per_core'], 0)} updates/s per sampling "
        f"core; goal <= {fmt(result['goal_cpu_ms'], 0)} ms",
        f"host-side stacking (before): {fmt(before['cpu_ms_per_batch'])} CPU ms/batch",
        f"{fmt(ratio(after['cpu_ms_per_batch'], before['cpu_ms_per_batch']), 2)} "
        f"(goal: {fmt(ratio(after['cpu_ms_per_batch'], result['goal_cpu_ms']), 1)}x over)",
    )


def _gpu_learner_sentence(per_core: float) -> str:
    """What a GPU learner consumes, from figure 7's measurement (`make gpu-check`), if any."""
    try:
        check = json.loads((REPO / "benchmarks" / "gpu_check.json").read_text())
        learner = check["learner"]
        rate, device, jax_version = (
            learner["updates_per_second"],
            learner["device"],
            learner["jax"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "No GPU learner measured yet (figure 7)."
    return (
        f"A GPU learner uses {fmt(rate, 0)} updates/s: measured on {device} with jax "
        f"{jax_version} (figure 7, fed through the device prefetcher), so it needs about "
        f"{fmt(rate / per_core, 1)} sampling cores."
    )


def report(result: dict) -> str:
    after, before = _per_core(result, "device_window"), _per_core(result, "host_stacked")
    per_core = after["updates_per_second_per_core"]
    lines = [
        f"**{fmt(after['cpu_ms_per_batch'])} CPU ms per {result['batch_size']}-item batch** "
        f"with the frames stacked on the learner's device, against "
        f"**{fmt(before['cpu_ms_per_batch'])} ms** with tf.data stacking them on the host "
        f"(ratio **{fmt(ratio(after['cpu_ms_per_batch'], before['cpu_ms_per_batch']), 2)}**). "
        f"Goal <= {fmt(result['goal_cpu_ms'], 0)} ms: "
        f"{'met' if after['cpu_ms_per_batch'] <= result['goal_cpu_ms'] else 'missed'}.",
        "",
        f"One sampling core feeds a GPU learner **{fmt(per_core, 0)} updates/s** "
        f"({fmt(FRAMES_PER_UPDATE * per_core, 0)} frames/s at the paper's replay ratio); "
        f"{GPU_UPDATES_GOAL} updates/s (1M frames in under 20 minutes) would take about "
        f"{fmt(GPU_UPDATES_GOAL / per_core, 0)} sampling cores. {_gpu_learner_sentence(per_core)}",
        "",
        "| pipeline | sampling threads | CPU ms / batch | wall ms / batch | batches/s "
        "| updates/s per core (1000 / CPU ms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for pipeline in PIPELINES:
        for threads, row in result["pipelines"][pipeline].items():
            lines.append(
                f"| {pipeline} | {threads} | {fmt(row['cpu_ms_per_batch'])} "
                f"| {fmt(row['wall_ms_per_batch'])} | {fmt(row['batches_per_second'])} "
                f"| {fmt(row['updates_per_second_per_core'], 0)} |"
            )
    stacking = result["device_stacking"]
    lines += [
        "",
        f"How: {fmt(result['transitions'])} real transitions ({fmt(result['items'])} items, "
        f"n-step {result['n_step']}, frame stack {result['frame_stack']}) in a dedicated Reverb "
        "server process, written by the DrQ builder's adder; batches of "
        f"{result['batch_size']} read by `make_frame_replay_dataset` in this process; CPU "
        "time of this process (every thread) over the timed batches, after 3 warm-up "
        f"batches; {result['cores']} cores here, so more than 2 threads only adds readers, "
        "and wall times follow the machine's load (CPU ms do much less). host_stacked is "
        "the pipeline of commit 457c3a9 (stacking in tf.data). The headline CPU ms is the "
        "median over the thread counts. What is left in "
        "device_window is Reverb's: each item's chunks arrive and are Snappy-decompressed "
        "per sample (a `perf` profile of this pipeline is mostly Snappy decompression and "
        "memory copies), so the Reverb path cannot reach the goal; a device-resident frame "
        "store would. The device side of the stacking, `window_observations` jitted on "
        f"{stacking['device']}: {fmt(stacking['cpu_ms_per_batch'])} CPU ms per batch "
        "(inside the CPU learner's update; a fused copy on a GPU).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
