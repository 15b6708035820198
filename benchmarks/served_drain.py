"""What the learner's process pays per batch to take DrQ-v2's steps from the served step queue
on Ray (issue 34 part 3), against the device store's own 0.64 host CPU ms per batch (figure 11).

On `--launcher ray` the frames travel once: an actor writes each step (its newest 84x84x3
frame, action, reward, flags) into the replay node's `StepQueue`, and the learner's drain
thread takes them with `take_steps` calls (`ServedStepSource`) and writes them into its
device store. This times the learner's side of that transport: a real embedded Ray, the queue
in its own actor (a node), a feeder actor writing steps as an actor does, and this process
(the learner) taking them in chunks of up to 64, as the drain does, twice: with the queue full
(each take a full chunk) and beside the feeder (each take what arrived since the last). CPU
seconds of this process (user + system, Ray's own threads in it included) per step taken,
times the steps per batch of make run's schedule (one update every 2 agent steps): what the
Ray transport adds to the learner's host CPU per batch; the store's own write of a step is
the same on both engines and counted in figure 11.

    .venv312/bin/python -m benchmarks.served_drain [--steps 4000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

STEPS_PER_BATCH = 2  # DrQ-v2: an update every 2 agent steps (reacher_hard_distributed.py)
CHUNK = 64  # the drain's take (magi_lp.replay.frame_queue.DRAIN_FLUSH_STEPS)
DEVICE_STORE_MS = 0.64  # figure 11: the device store's host CPU per batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--out", default="", help="also write the result (JSON) here")
    args = parser.parse_args()
    from benchmarks.common import embedded_ray
    from magi_lp.replay.served_queue import StepQueue
    from magi_lp.replay.spec import FrameReplaySpec
    from magi_lp.replay.step_queue import step_example

    spec = FrameReplaySpec((84, 84, 3), 3, 3, 0.99, 100_000, 256, action_shape=(6,))
    with embedded_ray("magi_lp_drain_", num_cpus=2) as ray:
        queue = ray.remote(StepQueue).options(max_concurrency=4).remote(spec, args.steps)

        @ray.remote
        def feed(queue, spec, steps: int) -> int:
            item = step_example(spec)
            rng = np.random.default_rng(0)
            sent = 0
            while sent < steps:
                item = dict(item, frame=rng.integers(0, 255, spec.frame_shape, np.uint8))
                sent += ray.get(queue.insert_steps.remote([item], 1.0))
            return sent

        result = {"device_store_ms_per_batch": DEVICE_STORE_MS, "load": os.getloadavg()}
        # Full chunks (the queue filled first: the learner behind, as when it is busy), then
        # chunks as they come (a feeder writing one step per call beside the taking: a drain
        # that keeps up, each take holding what arrived since the last).
        for how in ("full chunks", "as they come"):
            feeder = feed.remote(queue, spec, args.steps)
            if how == "full chunks":
                ray.get(feeder)
            taken = 0
            cpu0, wall0 = time.process_time(), time.monotonic()
            while taken < args.steps:
                items = ray.get(queue.take_steps.remote(CHUNK, 0.25))
                for item in items:
                    np.asarray(item["frame"]).sum(dtype=np.int64)  # touched, as the store does
                taken += len(items)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            ray.get(feeder)
            per_step_ms = 1000 * cpu / taken
            result[how] = {
                "steps": taken,
                "learner_cpu_ms_per_step": round(per_step_ms, 4),
                "learner_cpu_ms_per_batch": round(per_step_ms * STEPS_PER_BATCH, 4),
                "steps_per_s": round(taken / wall, 1),
            }
    from benchmarks.common import git_commit, machine_summary

    result = {
        "commit": git_commit(),
        "machine": machine_summary(),
        "ray": ray.__version__,
        **result,
    }
    print(json.dumps(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
