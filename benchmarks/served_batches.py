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

Then the drain held by the replay ratio (`ratio_held`): an actor sending 256-step batches as
fast as the queue takes them, a `StepDrainer` behind a `RatioGate` at DrQ-v2's ratio (2 steps
an update, an error buffer of 200) and a learner stand-in sampling 100 batches a second, in
new node actors, once with the drain taking what each batch lets in (`min_take` 1, as before)
and once waiting for room for 256 (at most half the buffer): its takes a second and the CPU of
every process per step, less the at-rest CPU measured first.

    .venv312/bin/python -m benchmarks.served_batches [--steps 4096] [--take 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
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
HELD_MIN_TAKES = (1, 256)  # the drain's min_take: before and since it waits for room
HELD_UPDATES_PER_S = 100.0  # the learner stand-in: 200 steps a second let in by the ratio
HELD_S = 10.0


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


class _Counted:
    """A store that only counts: each step completes one transition (the drain's rule, not
    the store's cost, is what the ratio-held rows measure)."""

    def add_first(self, writer: int, frame: Any) -> None:
        pass

    def in_episode(self, writer: int) -> bool:
        return True

    def add(self, writer: int, *args: Any, **kwargs: Any) -> int:
        return 1

    def flush(self) -> None:
        pass


class _HeldDrain:
    """The learner's `StepDrainer` held by its `RatioGate`, and a learner stand-in that samples
    a batch every `1 / updates_per_s` seconds once the ratio allows it."""

    def __init__(self, queue: Any, min_take: int, updates_per_s: float):
        from magi_lp.replay.schedule import RatioGate, ReplaySchedule
        from magi_lp.replay.step_queue import SERVED_TAKE_STEPS, ServedStepSource, StepDrainer

        schedule = ReplaySchedule(min_replay_size=256, actor_steps_per_update=2, batch_size=256)
        self._gate = RatioGate(schedule)  # DrQ-v2's ratio: 2 steps an update, buffer 200
        source = ServedStepSource(queue)
        self._takes = 0
        take = source.take

        def counted_take(max_steps: int) -> list:
            self._takes += 1
            return take(max_steps)

        source.take = counted_take
        self._drainer = StepDrainer(
            source, _Counted(), self._gate, max_take=SERVED_TAKE_STEPS, min_take=min_take
        )
        self._drainer.start()

        def learn() -> None:
            while self._gate.wait_to_sample():
                time.sleep(1.0 / updates_per_s)

        threading.Thread(target=learn, daemon=True).start()

    def counts(self) -> dict[str, int]:
        return {
            "inserted": self._gate.inserted,
            "sampled": self._gate.sampled,
            "takes": self._takes,
        }

    def close(self) -> None:
        self._drainer.close()


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
        held = [_ratio_held(ray, spec, min_take, at_rest) for min_take in HELD_MIN_TAKES]
    inverse = np.asarray([1.0 / row["send_steps"] for row in rows])
    cost = np.asarray([row["with_the_steps_ms_per_step"] for row in rows])
    per_call, per_step = np.polyfit(inverse, cost, 1)
    return {
        "steps_per_batch_size": steps,
        "take_steps": take,
        "at_rest_ms_per_s": 1000 * at_rest,
        "rows": rows,
        "ratio_held": held,
        "fit_ms_per_call": float(per_call),
        "fit_ms_per_step": float(per_step),
        "ray": ray.__version__,
    }


def _ratio_held(ray: Any, spec: Any, min_take: int, at_rest: float) -> dict:
    """An actor sending 256-step batches as fast as the queue takes them, the drain held by
    the replay ratio (a learner at `HELD_UPDATES_PER_S`), for `HELD_S` seconds once the
    minimum size and the error buffer are in: the drain's takes a second, and the CPU of
    every process per step drained, less their CPU at rest."""
    from benchmarks.served_acting import _Served
    from magi_lp.engines.ray_nodes import NodeClient
    from magi_lp.replay.spec import WriteAbandonedError
    from magi_lp.replay.step_queue import StepSender, step_example

    node = ray.remote(_Served).options(max_concurrency=8, num_cpus=0)
    queue_actor = node.remote(functools.partial(_queue, spec, 500))
    queue = NodeClient(queue_actor, ["insert_batch", "wait_for_room", "take_batch", "info"])
    drain_actor = node.remote(functools.partial(_HeldDrain, queue, min_take, HELD_UPDATES_PER_S))
    drain = NodeClient(drain_actor, ["counts", "close"])
    ray.get([queue_actor.pid.remote(), drain_actor.pid.remote()])
    item = step_example(spec)
    frames = np.random.default_rng(0).integers(0, 255, (64, *spec.frame_shape), np.uint8)
    stop = threading.Event()
    sender = StepSender(queue, send_steps=256, send_secs=1e9, should_stop=stop.is_set)

    def act() -> None:
        i = 0
        with contextlib.suppress(WriteAbandonedError):  # the stop, while it waits for room
            while not stop.is_set():
                sender.add(dict(item, frame=frames[i % len(frames)]))
                i += 1

    actor = threading.Thread(target=act, daemon=True)
    actor.start()
    while drain.counts()["inserted"] < 256 + 200:  # the minimum size and the error buffer
        time.sleep(0.1)
    first = drain.counts()
    before, cpu, start = _ray_cpu(), time.process_time(), time.perf_counter()
    time.sleep(HELD_S)
    last = drain.counts()
    wall = time.perf_counter() - start
    used = _used(before) + time.process_time() - cpu
    stop.set()
    drain.close()
    actor.join(timeout=5)
    ray.kill(queue_actor)
    ray.kill(drain_actor)
    steps = last["inserted"] - first["inserted"]
    row = {
        "min_take": min_take,
        "steps_per_s": steps / wall,
        "takes_per_s": (last["takes"] - first["takes"]) / wall,
        "updates_per_s": (last["sampled"] - first["sampled"]) / wall,  # the goal: 100
        "with_the_steps_ms_per_step": 1000 * (used - at_rest * wall) / max(steps, 1),
    }
    common.progress(f"ratio-held, min_take {min_take}: {row}")
    return row


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
