"""Figure 11: the device frame store: what a 256-batch at 84x84 costs the learner's host CPU,
the gather on the device, inserts without a copy, a store over 2^31 bytes, the learner fed by
it against the update alone, and what a 16-core, 1-GPU machine would run (computed).

Parts, each in this process (JAX on the CPU here: the "device" is this CPU):
- drain: a real Reverb queue in a server subprocess, filled by a writer subprocess
  (`QueueFrameAdder`, 84x84x3 frames), drained into the store by `QueueDrainer`; this
  process's CPU per step drained, and the server process's.
- sample: `DeviceFrameStore.sample()` (bookkeeping, dispatch and, on a CPU device, the gather
  itself) against the jitted gather called alone: their difference is the host's share.
- insert: a donated scatter of 64 frames into stores of two sizes (equal times: no copy).
- big: a store of more than 2^31 bytes of frames written and read back at its last rows.
- learner: DrQ-v2's learner fed by `DeviceReplayIterator` against its update on a batch
  already on the device.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import REPO, figure_main, fmt, median, progress, ratio

TITLE = "Device frame store: host CPU per 256-batch at 84x84, gather, inserts, learner fed by it"
FRAME = (84, 84, 3)
BATCH = 256
GOAL_HOST_CPU_MS = 1.0
REVERB_CPU_MS = 46.5  # figure 10 as last measured, when results.json holds none
STEPS_PER_UPDATE = 2  # DrQ-v2's replay ratio: one update per 2 agent steps
FRAMES_PER_STEP = 2  # action repeat


def subprocess_env() -> dict[str, str]:
    return {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def frame_spec(capacity: int, batch: int = BATCH):
    """The frame stores' figures' replay (this one's and benchmarks/host_frame_store.py's):
    reacher's 84x84x3 frames and 6-d actions, DrQ-v2's frame stack, n-step and discount."""
    from magi_lp.replay.spec import FrameReplaySpec

    return FrameReplaySpec(
        frame_shape=FRAME,
        frame_stack=3,
        n_step=3,
        discount=0.99,
        capacity=capacity,
        batch_size=batch,
        action_shape=(6,),
    )


def _fill(store, steps: int, writers: int = 1) -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(64, *FRAME), dtype=np.uint8)
    action = np.zeros(6, np.float32)
    for w in range(writers):
        store.add_first(w, frames[0])
    for t in range(steps):
        w = t % writers
        last = (t // writers) % 500 == 499  # 500-step episodes, as the paper's tasks
        store.add(w, frames[t % 64], action, 1.0, 1.0, last=last)
        if last:
            store.add_first(w, frames[(t + 1) % 64])
    store.flush()


_SERVER = r"""
import sys, time, reverb
from benchmarks.common import no_checkpoints
from magi_lp.replay.frame_queue import make_step_queue_table
server = reverb.Server([make_step_queue_table("steps", int(sys.argv[1]))],
                       checkpointer=no_checkpoints())
print(server.port, flush=True)
time.sleep(3600)
"""

_WRITER = r"""
import sys, numpy as np, dm_env, reverb
from magi_lp.replay.frame_queue import QueueFrameAdder
from magi_lp.replay.spec import FrameReplaySpec
spec = FrameReplaySpec(frame_shape=(84, 84, 3), frame_stack=3, n_step=3, discount=0.99,
                       capacity=10, batch_size=8, action_shape=(6,))
client = reverb.Client(f"localhost:{sys.argv[1]}")
adder = QueueFrameAdder(client, "steps", 0, spec)
rng = np.random.default_rng(1)
frames = rng.integers(0, 256, size=(16, 84, 84, 3), dtype=np.uint8)
stack = [frames[0]] * 3
adder.add_first(dm_env.restart(np.concatenate(stack, axis=-1)))
for t in range(int(sys.argv[2])):
    stack = [*stack[1:], frames[t % 16]]
    last = t % 500 == 499
    ts = (dm_env.truncation if last else dm_env.transition)(1.0, np.concatenate(stack, axis=-1))
    adder.add(np.zeros(6, np.float32), ts)
    if last:
        stack = [frames[(t + 1) % 16]] * 3
        adder.add_first(dm_env.restart(np.concatenate(stack, axis=-1)))
adder.close()
"""


def measure_drain(steps: int) -> dict:
    """CPU per step of the learner's drain (this process) and of the Reverb server."""
    import jax
    import psutil
    import reverb

    from magi_lp.replay.frame_queue import QueueDrainer
    from magi_lp.replay.frame_store import DeviceFrameStore
    from magi_lp.replay.schedule import RatioGate, ReplaySchedule

    env = dict(os.environ, PYTHONPATH=str(REPO))
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(steps + 10)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        port = int(server.stdout.readline())
        writer = subprocess.run(
            [sys.executable, "-c", _WRITER, str(port), str(steps)], env=env, cwd=REPO, timeout=900
        )
        assert writer.returncode == 0, "the writer failed"
        store = DeviceFrameStore(frame_spec(100_000), writers=1)
        store.flush()  # the compile ahead is done
        gate = RatioGate(ReplaySchedule(1, 1.0, BATCH), error_buffer=10**9)
        client = reverb.Client(f"localhost:{port}")
        drainer = QueueDrainer(client, "steps", store, gate)
        server_cpu = psutil.Process(server.pid).cpu_times()
        cpu0, wall0 = _cpu(), time.perf_counter()
        drainer.start()
        expected = steps + 1 + steps // 500  # the episode starts are items too
        while drainer.steps < expected and drainer.error is None:
            time.sleep(0.01)
        store.flush()
        jax.block_until_ready(store._state)
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
        after = psutil.Process(server.pid).cpu_times()
        drainer.close()
        server_s = (after.user + after.system) - (server_cpu.user + server_cpu.system)
        return {
            "steps": drainer.steps,
            "learner_cpu_ms_per_step": 1e3 * cpu / drainer.steps,
            "wall_ms_per_step": 1e3 * wall / drainer.steps,
            "server_cpu_ms_per_step": 1e3 * server_s / drainer.steps,
            "transitions": store.size,
        }
    finally:
        server.kill()
        server.wait()


def measure_sample(capacity: int, batches: int) -> dict:
    import jax

    from magi_lp.replay.frame_store import DeviceFrameStore

    store = DeviceFrameStore(frame_spec(capacity), writers=1)
    _fill(store, capacity)
    key = jax.random.PRNGKey(0)
    for i in range(3):
        jax.block_until_ready(store.sample(key, i))
    cpu0, wall0 = _cpu(), time.perf_counter()
    for i in range(batches):
        jax.block_until_ready(store.sample(key, i))
    sample_cpu, sample_wall = _cpu() - cpu0, time.perf_counter() - wall0
    visible = jax.device_put(store._visible, store._replicated)
    cpu0, wall0 = _cpu(), time.perf_counter()
    for i in range(batches):
        jax.block_until_ready(store._sample(store._state, visible, key, np.int32(i)))
    gather_cpu, gather_wall = _cpu() - cpu0, time.perf_counter() - wall0
    return {
        "capacity": capacity,
        "stored": store.size,
        "batches": batches,
        "sample_cpu_ms": 1e3 * sample_cpu / batches,
        "sample_wall_ms": 1e3 * sample_wall / batches,
        "gather_cpu_ms": 1e3 * gather_cpu / batches,
        "gather_wall_ms": 1e3 * gather_wall / batches,
        "host_cpu_ms": max(0.0, 1e3 * (sample_cpu - gather_cpu) / batches),
        "device": str(jax.devices()[0]),
    }


def measure_insert(capacities: tuple[int, ...], repeats: int) -> dict:
    """A donated 64-frame insert's time into stores of different sizes."""
    import jax

    from magi_lp.replay.frame_store import DeviceFrameStore

    out = {}
    frames = np.random.default_rng(2).integers(0, 256, (64, *FRAME), np.uint8)
    for capacity in capacities:
        store = DeviceFrameStore(frame_spec(capacity), writers=1)
        store.flush()
        staged = [({i: frames[i].reshape(-1) for i in range(64)}, {})]
        args = store._padded_arrays(staged)
        jax.block_until_ready(args)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            store._state = store._insert(store._state, *args)
            jax.block_until_ready(store._state)
            times.append(time.perf_counter() - start)
        out[str(capacity)] = {
            "store_gb": store.spec.nbytes() / 1e9,
            "insert_64_frames_ms": 1e3 * median(times[1:]),
        }
        del store
    return out


def measure_big(transitions: int) -> dict:
    """A store of more than 2^31 frame bytes, written and read at its last rows."""
    import jax

    from magi_lp.replay.frame_store import DeviceFrameStore

    spec = frame_spec(transitions, batch=8)
    store = DeviceFrameStore(spec, writers=1)
    store.flush()
    rows = store._frame_capacity
    frames = np.random.default_rng(3).integers(0, 256, (8, *FRAME), np.uint8)
    last = list(range(rows - 8, rows))
    positions = list(range(transitions - 8, transitions))
    window = [[last[(i + k) % 8] for k in range(spec.window)] for i in range(8)]
    staged = [
        (
            {slot: frames[i].reshape(-1) for i, slot in enumerate(last)},
            {
                p: (np.asarray(window[i], np.int32), np.zeros(6, np.float32), 1.0, 1.0, ())
                for i, p in enumerate(positions)
            },
        )
    ]
    start = time.perf_counter()
    store._state = store._insert(store._state, *store._padded_arrays(staged))
    jax.block_until_ready(store._state)
    insert_s = time.perf_counter() - start
    back = np.asarray(store._state["frames"][0, rows - 8 :])
    # The live range is the last 8 positions: a gather there reads the last rows.
    store._visible[:, 0] = (transitions - 8, 8)
    key = jax.random.PRNGKey(0)
    jax.block_until_ready(store.sample(key, 0))
    start = time.perf_counter()
    batch = jax.device_get(store.sample(key, 1))
    gather_s = time.perf_counter() - start
    expected = {frames[i].tobytes(): None for i in range(8)}
    read_ok = all(f.tobytes() in expected for f in batch.frames.reshape(-1, *FRAME))
    return {
        "frame_rows": rows,
        "frame_bytes": rows * int(np.prod(FRAME)),
        "over_2_31": rows * int(np.prod(FRAME)) > 2**31,
        "written_equal": bool(np.array_equal(back, frames.reshape(8, -1))),
        "gathered_from_last_rows": bool(read_ok),
        "insert_ms": 1e3 * insert_s,
        "gather_ms": 1e3 * gather_s,
    }


def drq_learner(iterator, spec):
    """DrQ-v2's learner on reacher/hard (the paper's networks, 84x84, `spec`'s batch size)
    fed by `iterator`: the learner figure of this benchmark and of
    benchmarks/host_frame_store.py."""
    import jax

    from magi_lp.acme_api import specs
    from magi_lp.replay.frame_store import transition_shape
    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.learner import DrQLearner
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("reacher", "hard")
    config.batch_size = spec.batch_size
    return DrQLearner(
        make_networks(specs.BoundedArray((6,), np.float32, -1.0, 1.0), config),
        config,
        replay_schedule(config, 2),
        iterator,
        jax.random.PRNGKey(0),
        specs.BoundedArray((84, 84, 9), np.uint8, 0, 255),
        example_batch=transition_shape(spec),
    )


def measure_learner(batch: int, updates: int) -> dict:
    """DrQ-v2's learner fed by the store vs its update on a batch already on the device."""
    import jax

    from magi_lp.replay.frame_store import DeviceFrameStore, DeviceReplayIterator
    from magi_lp.runtime.config import experiment_defaults  # noqa: F401  (the stack loads)

    spec = frame_spec(20_000, batch)
    store = DeviceFrameStore(spec, writers=1)
    _fill(store, 5_000)
    learner = drq_learner(DeviceReplayIterator(store, jax.random.PRNGKey(1)), spec)
    fixed = store.sample(jax.random.PRNGKey(2))
    return {"batch": batch, **fed_against_alone(learner, fixed, 1, updates)}


def fed_against_alone(learner, fixed, blocks: int, per_block: int) -> dict:
    """`learner`'s updates/s fed by its iterator against its update alone on `fixed`, a
    batch already on the device, in `blocks` alternating blocks so both see the same load
    (after two fed steps and one update alone: compiled and warm). The learner figure of
    this benchmark and of benchmarks/host_frame_store.py."""
    import jax

    for _ in range(2):
        learner.step()
    learner._state, _ = learner._call_update(fixed)
    jax.block_until_ready(learner.state)
    fed_s = alone_s = 0.0
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    for block in range(blocks):
        progress(f"learner block {block + 1}/{blocks}")
        start = time.perf_counter()
        for _ in range(per_block):
            learner.step()
        jax.block_until_ready(learner.state)
        fed_s += time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(per_block):
            learner._state, _ = learner._call_update(fixed)
        jax.block_until_ready(learner.state)
        alone_s += time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    updates = blocks * per_block
    return {
        "updates": updates,
        "fed_updates_per_s": updates / fed_s,
        "alone_updates_per_s": updates / alone_s,
        "ratio": alone_s / fed_s,
        "cpu_s": usage.ru_utime + usage.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime,
        "jax": jax.__version__,
    }


def measure(quick: bool) -> dict:
    import jax

    progress("drain")
    drain = measure_drain(300 if quick else 4_000)
    progress("sample")
    sample = measure_sample(2_000 if quick else 50_000, 10 if quick else 60)
    progress("insert")
    insert = measure_insert((2_000, 20_000) if quick else (10_000, 100_000), 5 if quick else 20)
    progress("big store")
    big = measure_big(2_000 if quick else 110_000)
    progress("learner")
    learner = measure_learner(16 if quick else 64, 3 if quick else 20)
    return {
        "jax": jax.__version__,
        "cores": os.cpu_count(),
        "load": os.getloadavg(),
        "drain": drain,
        "sample": sample,
        "insert": insert,
        "big": big,
        "learner": learner,
        "estimate": estimate(drain),
        "reverb_cpu_ms": _reverb_cpu_ms(),
    }


def _reverb_cpu_ms() -> float:
    """Figure 10's Reverb frame replay (frames stacked on the device): CPU ms per batch, as
    `make bench` last measured it (run both with `--only replay_sampling,device_store` to
    have them side by side from one run)."""
    try:
        results = json.loads((REPO / "benchmarks" / "results.json").read_text())
        rows = results["figures"]["replay_sampling"]["pipelines"]["device_window"].values()
        return median([row["cpu_ms_per_batch"] for row in rows])
    except (OSError, ValueError, KeyError, TypeError):
        return REVERB_CPU_MS


def host_cpu_ms_per_batch(result: dict) -> float:
    """Drain (2 steps per update) + bookkeeping and dispatch, per batch."""
    drain = result["drain"]["learner_cpu_ms_per_step"] * STEPS_PER_UPDATE
    return drain + result["sample"]["host_cpu_ms"]


def estimate(drain: dict) -> dict:
    """Frames/s of a 16-core, 1-GPU machine from measured parts (computed, not measured)."""
    gpu = _gpu_updates()
    actor_frames_per_core = _actor_frames_per_core()
    cores = 16
    # One core each: the learner's dispatch (its drain is counted below), the evaluator.
    per_step_ms = drain["learner_cpu_ms_per_step"] + drain["server_cpu_ms_per_step"]
    learner_frames = gpu["updates_per_s"] * STEPS_PER_UPDATE * FRAMES_PER_STEP
    steps = learner_frames / FRAMES_PER_STEP
    transport_cores = steps * per_step_ms / 1e3
    actor_cores = cores - 2 - transport_cores
    actor_frames = actor_cores * actor_frames_per_core
    return {
        "cores": cores,
        "gpu_updates_per_s": gpu["updates_per_s"],
        "gpu_source": gpu["source"],
        "actor_frames_per_core": actor_frames_per_core,
        "transport_cores": transport_cores,
        "actor_cores": actor_cores,
        "actor_frames_per_s": actor_frames,
        "learner_frames_per_s": learner_frames,
        "frames_per_s": min(actor_frames, learner_frames),
        "paper_frames_per_s": 96,
    }


def _gpu_updates() -> dict:
    try:
        check = json.loads((REPO / "benchmarks" / "gpu_check.json").read_text())
        learner = check["learner"]
        return {
            "updates_per_s": float(learner["updates_per_second"]),
            "source": f"figure 7: {learner['device']}, jax {learner['jax']}",
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {"updates_per_s": 230.1, "source": "figure 7 (H100, jax 0.11.2)"}


def _actor_frames_per_core() -> float:
    try:
        results = json.loads((REPO / "benchmarks" / "results.json").read_text())
        actor = results["figures"]["actor_throughput"]
        return float(actor["variants"]["drq_replay"]["frames_per_cpu_second"])
    except (OSError, ValueError, KeyError, TypeError):
        return 84.2  # figure 2: actor loop with the DrQ-v2 policy and replay writes


def summary(result: dict) -> tuple[str, str, str]:
    host = host_cpu_ms_per_batch(result)
    return (
        f"{fmt(host, 2)} host CPU ms per 256-batch outside the jitted program (goal <= "
        f"{fmt(GOAL_HOST_CPU_MS, 0)}); gather {fmt(result['sample']['gather_wall_ms'])} ms on "
        f"this CPU device; learner fed by it at {fmt(result['learner']['ratio'], 3)} of the "
        "update alone",
        f"Reverb frame replay: {fmt(result['reverb_cpu_ms'])} CPU ms per batch (figure 10)",
        f"{fmt(ratio(host, result['reverb_cpu_ms']), 3)}",
    )


def report(result: dict) -> str:
    drain, sample, big = result["drain"], result["sample"], result["big"]
    learner, est = result["learner"], result["estimate"]
    host = host_cpu_ms_per_batch(result)
    lines = [
        f"**{fmt(host, 2)} host CPU ms per {BATCH}-batch** outside the learner's jitted "
        f"program (goal <= {fmt(GOAL_HOST_CPU_MS, 0)} ms: "
        f"{'met' if host <= GOAL_HOST_CPU_MS else 'missed'}), against "
        f"**{fmt(result['reverb_cpu_ms'])} ms** for the Reverb frame replay (figure 10): ratio "
        f"**{fmt(ratio(host, result['reverb_cpu_ms']), 3)}**. jax {result['jax']} on this "
        f"{result['cores']}-core CPU (load average {result['load']} at the end).",
        "",
        "| part | CPU ms | wall ms | per |",
        "| --- | --- | --- | --- |",
        f"| drain: Reverb queue -> store (learner process) | "
        f"{fmt(drain['learner_cpu_ms_per_step'], 3)} | {fmt(drain['wall_ms_per_step'], 3)} "
        f"| step ({drain['steps']} steps) |",
        f"| drain at DrQ-v2's ratio ({STEPS_PER_UPDATE} steps per update) | "
        f"{fmt(STEPS_PER_UPDATE * drain['learner_cpu_ms_per_step'], 3)} | | batch |",
        f"| Reverb server (its own process) | {fmt(drain['server_cpu_ms_per_step'], 3)} | | step |",
        f"| sample(): bookkeeping + dispatch + gather | {fmt(sample['sample_cpu_ms'], 2)} | "
        f"{fmt(sample['sample_wall_ms'], 2)} | batch |",
        f"| the jitted gather alone (device work on {sample['device']}) | "
        f"{fmt(sample['gather_cpu_ms'], 2)} | {fmt(sample['gather_wall_ms'], 2)} | batch |",
        f"| host share of sample() (difference) | {fmt(sample['host_cpu_ms'], 3)} | | batch |",
        "",
        "Donated insert of 64 frames (a scatter into the store, no copy of it):",
        "",
        "| store | GB | insert ms |",
        "| --- | --- | --- |",
    ]
    for capacity, row in result["insert"].items():
        lines.append(
            f"| {int(capacity):,} transitions | {fmt(row['store_gb'], 2)} | "
            f"{fmt(row['insert_64_frames_ms'], 2)} |"
        )
    lines += [
        "",
        f"A store of {big['frame_rows']:,} frame rows ({fmt(big['frame_bytes'] / 1e9, 2)} GB of "
        f"frames, over 2^31 bytes: {big['over_2_31']}): 8 frames written at its last rows read "
        f"back equal: {big['written_equal']}; a batch gathered through transitions pointing "
        f"there holds exactly them: {big['gathered_from_last_rows']}; insert "
        f"{fmt(big['insert_ms'], 1)} ms, gather {fmt(big['gather_ms'], 1)} ms. A 1M-transition "
        "store (21.9 GB) was not run here: it does not fit this machine beside other work.",
        "",
        f"DrQ-v2's learner (the paper's networks, batch {learner['batch']}, 84x84, jax "
        f"{learner['jax']} on this CPU) fed by `DeviceReplayIterator`: "
        f"**{fmt(learner['fed_updates_per_s'], 2)} updates/s**, against "
        f"{fmt(learner['alone_updates_per_s'], 2)} for the update alone on a batch already "
        f"on the device: **{fmt(learner['ratio'], 3)}** of the update-bound rate (goal >= "
        "0.98). Not measured on a GPU: none was lent to this task.",
        "",
        f"**Computed, not measured**: a {est['cores']}-core, 1-GPU machine. The learner "
        f"({fmt(est['gpu_updates_per_s'], 1)} updates/s, {est['gpu_source']}) consumes "
        f"{fmt(est['learner_frames_per_s'], 0)} frames/s at the paper's ratio; the transport "
        f"(drain + Reverb server, measured above) takes {fmt(est['transport_cores'], 2)} "
        f"cores at that rate; with one core for the learner's dispatch and one for the "
        f"evaluator, {fmt(est['actor_cores'], 1)} cores of actors at "
        f"{fmt(est['actor_frames_per_core'], 1)} frames/s each (figure 2) give "
        f"{fmt(est['actor_frames_per_s'], 0)} frames/s. Predicted: **"
        f"{fmt(est['frames_per_s'], 0)} frames/s** whole-system, against the paper's "
        f"{est['paper_frames_per_s']} frames/s (ratio "
        f"{fmt(ratio(est['frames_per_s'], est['paper_frames_per_s']), 1)}). With the Reverb "
        "store the same learner would need about "
        f"{fmt(est['gpu_updates_per_s'] * result['reverb_cpu_ms'] / 1e3, 1)} cores for "
        "sampling alone.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    figure_main(measure)
