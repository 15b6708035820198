"""What a served call of n steps costs, per step, on every process it touches (issue 67 item 2:
the batch bounds `replay.send_steps` and the drain's `SERVED_TAKE_STEPS` come from this).

A real embedded Ray, started as the Ray engine starts it. The replay node's `StepQueue` in a
node actor of its own (served as `ray_nodes` serves a node: `call`), a drain actor taking
from it through `ServedStepSource` as the learner's drain does (up to `--take` steps a call),
and this process as the actor: one `StepSender` sending batches of exactly n step items
(84x84x3 frames, DrQ-v2's item), paced to at most about 2,000 steps a second. For each n: the
CPU seconds (user + system, all threads) of this process and of every process Ray started
(the two nodes, the raylet, the GCS, agents and idle workers) over the steps, per step, less
what they take at rest (measured first, nothing sent, per second of the sample). A least
squares fit of cpu(n) = per_call / n + per_step splits a call's fixed cost from the steps'.

    .venv312/bin/python -m benchmarks.served_batches [--steps 4096] [--take 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import common

BATCHES = (8, 32, 64, 128, 256)
REST_S = 5.0
PACE_EVERY, PACE_S = 8, 0.004  # a pause of 4 ms every 8 steps: at most about 2,000 a second


def _queue(spec: Any, max_steps: int) -> Any:
    from magi_lp.replay.served_queue import StepQueue

    return StepQueue(spec, max_steps)


class _Drain:
    """The learner's drain: takes the queue's steps (`ServedStepSource`) on a thread."""

    def __init__(self, queue: Any, take: int):
        from magi_lp.replay.step_queue import ServedStepSource

        self._source = ServedStepSource(queue)
        self.taken = 0

        def drain() -> None:
            while True:
                self.taken += len(self._source.take(take))

        threading.Thread(target=drain, daemon=True).start()

    def count(self) -> int:
        return self.taken


def _ray_cpu() -> dict[int, float]:
    return common.cpu_seconds_of(common.descendants())


def _used(before: dict[int, float]) -> float:
    after = _ray_cpu()
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def measure(steps: int, take: int) -> dict:
    from benchmarks.served_acting import _Served
    from magi_lp.engines.ray_nodes import NodeClient
    from magi_lp.replay.spec import FrameReplaySpec
    from magi_lp.replay.step_queue import StepSender, step_example

    spec = FrameReplaySpec((84, 84, 3), 3, 3, 0.99, 100_000, 256, action_shape=(6,))
    with common.embedded_ray("magi_lp_served_batches_", num_cpus=4) as ray:
        node = ray.remote(_Served).options(max_concurrency=8, num_cpus=0)
        queue_actor = node.remote(functools.partial(_queue, spec, 2 * max(BATCHES)))
        queue = NodeClient(queue_actor, ["insert_batch", "wait_for_room", "take_batch", "info"])
        drain_actor = node.remote(functools.partial(_Drain, queue, take))
        drain = NodeClient(drain_actor, ["count"])
        ray.get([queue_actor.pid.remote(), drain_actor.pid.remote()])

        before, cpu, start = _ray_cpu(), time.process_time(), time.perf_counter()
        time.sleep(REST_S)
        at_rest = (_used(before) + time.process_time() - cpu) / (time.perf_counter() - start)

        item = step_example(spec)
        frames = np.random.default_rng(0).integers(0, 255, (64, *spec.frame_shape), np.uint8)
        rows = []
        for n in BATCHES:
            sender = StepSender(queue, send_steps=n, send_secs=1e9)
            taken = drain.count()
            before, cpu, start = _ray_cpu(), time.process_time(), time.perf_counter()
            for i in range(steps):
                sender.add(dict(item, frame=frames[i % len(frames)]))
                if i % PACE_EVERY == PACE_EVERY - 1:
                    time.sleep(PACE_S)
            sender.take_sent()
            while drain.count() < taken + steps:
                time.sleep(0.01)
            wall = time.perf_counter() - start
            actor = time.process_time() - cpu
            ray_seconds = _used(before)
            rows.append(
                {
                    "send_steps": n,
                    "calls": sender.calls,
                    "wall_s": round(wall, 2),
                    "actor_ms_per_step": 1000 * actor / steps,
                    "ray_ms_per_step": 1000 * ray_seconds / steps,
                    "with_the_steps_ms_per_step": 1000
                    * (actor + ray_seconds - at_rest * wall)
                    / steps,
                }
            )
            common.progress(f"n = {n}: {rows[-1]['with_the_steps_ms_per_step']:.3f} ms a step")
    inverse = np.asarray([1.0 / row["send_steps"] for row in rows])
    cost = np.asarray([row["with_the_steps_ms_per_step"] for row in rows])
    per_call, per_step = np.polyfit(inverse, cost, 1)
    return {
        "steps_per_batch_size": steps,
        "take_steps": take,
        "at_rest_ms_per_s": 1000 * at_rest,
        "rows": rows,
        "fit_ms_per_call": float(per_call),
        "fit_ms_per_step": float(per_step),
        "ray": ray.__version__,
    }


def main() -> None:
    from magi_lp.replay.step_queue import SERVED_TAKE_STEPS

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--take", type=int, default=SERVED_TAKE_STEPS)
    parser.add_argument("--out", default="", help="also write the result (JSON) here")
    args = parser.parse_args()
    load = os.getloadavg()
    result = measure(args.steps, args.take)
    result = {
        "commit": common.git_commit(),
        "machine": common.machine_summary(),
        "load_before": load,
        "load_after": os.getloadavg(),
        **result,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
