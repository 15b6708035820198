"""Bytes per stored transition of pixel replay layouts on Reverb, from the server's memory.

Renders N real transitions of dm_control reacher-hard at 84x84 (random actions, action
repeat 2 as in DrQ-v2), stacks 3 frames the way the frame-stacking wrapper does, and
inserts the same transitions (n_step 3) into a fresh, dedicated Reverb server process per
layout:

  frame_replay  magi_lp.agent.frame_replay.FrameStackAdder: each rendered frame stored once.
  acme_nstep    acme's NStepTransitionAdder on stacked observations: the stacked
                observation of every step is stored once and shared by the items of o_t
                and o_{t+n} (auto-tuned chunks, as acme configures them).
  naive_copy    every item holds its own stacked observation and next observation
                (what "store transitions" means in most replay buffers).

All use Reverb 0.7.0's only chunk compression (Snappy). Two measures per layout:
  rss    growth of the server process's resident memory (VmRSS) from just before the
         first insert to after the last item is confirmed, divided by the items stored;
  chunk  size of the compressed chunks (plus item records) in a Reverb checkpoint of the
         table, divided by the items stored: the payload alone, without allocator slack.
It also times learner-side sampling in this process against the server process
(batches of 256, 2 readers): batches per second (wall clock, noisy on a shared machine)
and this process's CPU milliseconds per batch (steadier).

Usage (MUJOCO_GL=egl is set when unset):
    .venv/bin/python scripts/measure_replay_bytes.py --transitions 5000
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

FRAME_STACK = 3
N_STEP = 3
SIZE = 84
GAMMA = 0.99
TABLE = "replay"
LAYOUTS = ("frame_replay", "acme_nstep", "naive_copy")


def _environment_spec():
    from acme import specs

    return specs.EnvironmentSpec(
        observations=specs.Array((SIZE, SIZE, 3 * FRAME_STACK), np.uint8, name="pixels"),
        actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0, name="action"),
        rewards=specs.Array((), np.float32, name="reward"),
        discounts=specs.Array((), np.float32, name="discount"),
    )


def _make_table(layout: str, max_size: int):
    import reverb
    import tensorflow as tf
    from acme import types
    from acme.adders.reverb import NStepTransitionAdder

    from magi_lp.agent.frame_replay import make_frame_replay_table

    spec = _environment_spec()
    if layout == "frame_replay":
        return make_frame_replay_table(
            TABLE,
            max_size,
            frame_shape=(SIZE, SIZE, 3),
            action_spec=spec.actions,
            frame_stack=FRAME_STACK,
            n_step=N_STEP,
        )
    if layout == "acme_nstep":
        signature = NStepTransitionAdder.signature(spec)
    else:
        observation = tf.TensorSpec(spec.observations.shape, tf.uint8)
        signature = types.Transition(
            observation=observation,
            action=tf.TensorSpec(spec.actions.shape, tf.float32),
            reward=tf.TensorSpec((), tf.float32),
            discount=tf.TensorSpec((), tf.float32),
            next_observation=observation,
        )
    return reverb.Table(
        TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=max_size,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def serve(layout: str, max_size: int, checkpoint_dir: str) -> None:
    """Runs one replay server until stdin closes; prints its port first."""
    import reverb

    server = reverb.Server(
        [_make_table(layout, max_size)],
        checkpointer=reverb.checkpointers.DefaultCheckpointer(checkpoint_dir),
    )
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def render_episodes(transitions: int, action_repeat: int, seed: int) -> list[dict]:
    """Rendered reacher-hard episodes holding `transitions` transitions in all."""
    from dm_control import suite

    env = suite.load("reacher", "hard", task_kwargs={"random": seed})
    spec = env.action_spec()
    rng = np.random.default_rng(seed)

    def render():
        return env.physics.render(SIZE, SIZE, camera_id=0)

    episodes, remaining = [], transitions
    while remaining > 0:
        timestep = env.reset()
        episode = dict(frames=[render()], actions=[], rewards=[], discounts=[])
        while not timestep.last() and remaining > 0:
            action = rng.uniform(spec.minimum, spec.maximum).astype(np.float32)
            reward = 0.0
            for _ in range(action_repeat):
                timestep = env.step(action)
                reward += timestep.reward or 0.0
                if timestep.last():
                    break
            episode["frames"].append(render())
            episode["actions"].append(action)
            episode["rewards"].append(np.float32(reward))
            episode["discounts"].append(np.float32(timestep.discount))
            remaining -= 1
        episodes.append(episode)
    return episodes


def timesteps(episode: dict):
    """(action, dm_env.TimeStep) pairs with stacked observations, first one's action None."""
    import dm_env

    stack = collections.deque([episode["frames"][0]] * FRAME_STACK, maxlen=FRAME_STACK)
    yield None, dm_env.restart(np.concatenate(stack, axis=-1))
    last = len(episode["actions"]) - 1
    for t, action in enumerate(episode["actions"]):
        stack.append(episode["frames"][t + 1])
        yield (
            action,
            dm_env.TimeStep(
                step_type=dm_env.StepType.LAST if t == last else dm_env.StepType.MID,
                reward=episode["rewards"][t],
                discount=episode["discounts"][t],
                observation=np.concatenate(stack, axis=-1),
            ),
        )


def insert(layout: str, client, episodes: list[dict], chunk_length: int | None) -> None:
    """Feeds the episodes to `layout`'s writer; chunk_length None: the layout's default."""
    if layout == "frame_replay":
        from magi_lp.agent.frame_replay import FrameStackAdder

        adder = FrameStackAdder(
            client, TABLE, frame_stack=FRAME_STACK, n_step=N_STEP, chunk_length=chunk_length
        )
    elif layout == "acme_nstep":
        from acme.adders.reverb import NStepTransitionAdder

        adder = NStepTransitionAdder(
            client, n_step=N_STEP, discount=GAMMA, priority_fns={TABLE: None}
        )
    else:
        _insert_naive_copies(client, episodes, chunk_length or 1)
        return
    for episode in episodes:
        for action, timestep in timesteps(episode):
            if action is None:
                adder.add_first(timestep)
            else:
                adder.add(action, timestep)
        adder.reset()
    if layout == "frame_replay":
        adder.close()
    del adder


def _insert_naive_copies(client, episodes: list[dict], chunk_length: int) -> None:
    """One self-contained item per n-step transition (obs and next obs copied in).

    One stacked observation (63.5 KB at 84x84x9) nearly fills a Snappy block, so longer
    chunks would not compress these any better.
    """
    import tree
    from acme import types

    with client.trajectory_writer(num_keep_alive_refs=chunk_length) as writer:
        configured = False
        for episode in episodes:
            steps = list(timesteps(episode))
            for t in range(len(steps) - N_STEP):
                reward, discount = 0.0, 1.0
                for k in range(1, N_STEP + 1):
                    reward += discount * steps[t + k][1].reward
                    discount *= steps[t + k][1].discount * GAMMA
                step = types.Transition(
                    observation=steps[t][1].observation,
                    action=steps[t + 1][0],
                    reward=np.float32(reward),
                    discount=np.float32(discount),
                    next_observation=steps[t + N_STEP][1].observation,
                )
                if not configured:
                    for path, _ in tree.flatten_with_path(step):
                        writer.configure(
                            path, num_keep_alive_refs=chunk_length, max_chunk_length=chunk_length
                        )
                    configured = True
                writer.append(step)
                item = tree.map_structure(lambda column: column[-1], writer.history)
                writer.create_item(TABLE, 1.0, item)
                writer.flush(5)
            writer.end_episode()


def sample_rate(
    layout: str, server_address: str, batches: int, batch_size: int = 256
) -> tuple[float, float]:
    """Learner-side batches per second and CPU ms per batch (after two warm-up batches).

    CPU time counts every thread of this process (Reverb readers, tf.data), so it stays
    meaningful when other work shares the machine; the wall-clock rate does not.
    """
    if layout == "frame_replay":
        from magi_lp.agent.frame_replay import make_frame_replay_dataset

        iterator = make_frame_replay_dataset(
            server_address,
            TABLE,
            batch_size=batch_size,
            frame_stack=FRAME_STACK,
            n_step=N_STEP,
            discount=GAMMA,
        )
    else:
        from acme.datasets.reverb import make_reverb_dataset

        dataset = make_reverb_dataset(
            server_address,
            batch_size=batch_size,
            table=TABLE,
            num_parallel_calls=2,
            prefetch_size=4,
        )
        iterator = dataset.as_numpy_iterator()
    for _ in range(2):
        next(iterator)
    start, start_cpu = time.time(), time.process_time()
    for _ in range(batches):
        next(iterator)
    cpu_ms = 1000 * (time.process_time() - start_cpu) / batches
    return batches / (time.time() - start), cpu_ms


def _chunk_key(record: bytes) -> int:
    """The chunk_key (field 1, a varint) a serialized Reverb ChunkData starts with."""
    if record[0] != 0x08:
        raise ValueError("not a ChunkData record starting with its chunk_key")
    key, shift = 0, 0
    for byte in record[1:11]:
        key |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return key
    raise ValueError("malformed chunk_key varint")


def checkpoint_bytes(path: pathlib.Path) -> tuple[int, int]:
    """Bytes of the unique chunks and of the table records in a Reverb checkpoint.

    Reverb 0.7.0's checkpoint writes a chunk once per item batch that references it, so
    chunks are counted once each by key.
    """
    import tensorflow as tf

    chunks = {}
    for record in tf.data.TFRecordDataset(str(path / "chunks.tfrecord")):
        data = record.numpy()
        chunks[_chunk_key(data)] = len(data)
    table_bytes = sum(f.stat().st_size for f in path.glob("tables*"))
    return sum(chunks.values()), table_bytes


def _rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def measure(
    layout: str, episodes: list[dict], chunk_length: int | None, sample_batches: int
) -> dict:
    import reverb

    with tempfile.TemporaryDirectory() as checkpoint_dir:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", layout, "--checkpoint_dir", checkpoint_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            port = int(server.stdout.readline())
            client = reverb.Client(f"localhost:{port}")
            client.server_info()  # the table exists and the server answers
            time.sleep(1.0)
            rss_before = _rss_bytes(server.pid)
            start = time.time()
            insert(layout, client, episodes, chunk_length)
            seconds = time.time() - start
            items = client.server_info()[TABLE].current_size
            time.sleep(1.0)
            rss_after = _rss_bytes(server.pid)
            chunk_bytes, table_bytes = checkpoint_bytes(pathlib.Path(client.checkpoint()))
            rate, cpu_ms = (
                sample_rate(layout, client.server_address, sample_batches)
                if sample_batches
                else (None, None)
            )
        finally:
            server.stdin.close()
            server.wait(timeout=60)
    return dict(
        items=items,
        rss_bytes_per_transition=round((rss_after - rss_before) / items, 1),
        chunk_bytes_per_transition=round((chunk_bytes + table_bytes) / items, 1),
        rss_growth_mb=round((rss_after - rss_before) / 2**20, 1),
        insert_seconds=round(seconds, 1),
        batches_per_second=rate and round(rate, 1),
        sample_cpu_ms_per_batch=cpu_ms and round(cpu_ms, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transitions", type=int, default=5000, help="rendered env steps")
    parser.add_argument("--action_repeat", type=int, default=2)
    parser.add_argument(
        "--chunk_length", type=int, default=0, help="steps per chunk; 0: each layout's default"
    )
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument(
        "--sample_batches", type=int, default=20, help="batches of 256 to time; 0 skips"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve", choices=LAYOUTS, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, 10 * args.transitions + 1000, args.checkpoint_dir)
        return

    start = time.time()
    episodes = render_episodes(args.transitions, args.action_repeat, args.seed)
    render_seconds = time.time() - start
    frames = sum(len(e["frames"]) for e in episodes)
    print(f"rendered {frames} frames in {len(episodes)} episodes in {render_seconds:.0f} s")

    results = {}
    for layout in args.layouts.split(","):
        results[layout] = measure(layout, episodes, args.chunk_length or None, args.sample_batches)

    def show(value, digits=0):
        return "-" if value is None else f"{value:.{digits}f}"

    header = ("layout", "items", "RSS B/tr", "chunk B/tr", "RSS MB", "batch/s", "cpu ms/b")
    print("\n" + "".join(f"{h:>12}" for h in header))
    for layout, r in results.items():
        row = (
            layout,
            r["items"],
            show(r["rss_bytes_per_transition"]),
            show(r["chunk_bytes_per_transition"]),
            show(r["rss_growth_mb"], 1),
            show(r["batches_per_second"], 1),
            show(r["sample_cpu_ms_per_batch"]),
        )
        print("".join(f"{c:>12}" for c in row))
    raw_frame = SIZE * SIZE * 3
    print(
        f"uncompressed: one 84x84x3 frame {raw_frame} B; one stacked observation "
        f"{FRAME_STACK * raw_frame} B (DrQ-v2's own replay); obs + next obs "
        f"{2 * FRAME_STACK * raw_frame} B"
    )
    print(
        json.dumps(
            dict(
                benchmark="replay_bytes_per_transition",
                task="reacher_hard",
                size=SIZE,
                frame_stack=FRAME_STACK,
                n_step=N_STEP,
                transitions=args.transitions,
                episodes=len(episodes),
                action_repeat=args.action_repeat,
                chunk_length=args.chunk_length or "default",
                compression="snappy (reverb 0.7.0 chunks)",
                results=results,
            )
        )
    )


if __name__ == "__main__":
    main()
