"""Figure 3: replay RAM per stored transition at 84x84 with frame stack 3, from the memory of
a dedicated Reverb server process.

Renders real reacher_hard transitions once (the project's pixel environment: action repeat 2,
84x84, frames stacked 3 deep, random actions), then, for each layout, starts a fresh Reverb
server process, waits for it to settle, inserts the same transitions (n-step 3) and reads the
growth of the server's resident memory (VmRSS) per item stored:

  frame_replay  magi_lp.replay.frame_replay: the DrQ builder's adder and table; every rendered
                frame is stored once and stacks are rebuilt at sample time.
  acme_nstep    Acme's NStepTransitionAdder on stacked observations: each step's stacked
                observation is stored once and shared by the items that use it as o_t and
                o_{t+n} (the layout of the official DrQ-v2 replay, which keeps every step's
                9x84x84 stack).
  naive_copy    every item holds its own stacked observation and next observation (what
                "store transitions" means in most replay buffers).

All layouts go through Reverb 0.7.0, which compresses every chunk (Snappy, no switch). A
second measure, the bytes of the compressed chunks in a Reverb checkpoint of the table per
item, is the payload without allocator slack.

The same measure at a size of your choosing, as a plain table, optionally also timing
learner-side sampling from each server (not part of the figure):

    python -m benchmarks.replay_memory table --transitions 5000 --sample-batches 20

Anchor: the official DrQ-v2 replay keeps ~63.5 KB per transition (one uncompressed
9x84x84 uint8 stack per step). Goal: <= 10 KB per transition.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks import common
from benchmarks.common import cpu_only_env, fmt, process_cpu_seconds, progress, ratio

TITLE = "Replay RAM per stored transition (84x84, frame stack 3)"
LAYOUTS = ("frame_replay", "acme_nstep", "naive_copy")
TABLE = "frames"
N_STEP = 3
FRAME_STACK = 3
GAMMA = 0.99
SAMPLE_BATCH_SIZE = 256  # the DrQ-v2 config's batch size, for the other layouts' datasets
OFFICIAL_BYTES = 9 * 84 * 84  # 63,504 B: one uint8 9x84x84 stack per step, uncompressed
GOAL_BYTES = 10_000


def subprocess_env() -> dict[str, str]:
    return cpu_only_env()


def _experiment():
    # Steady state: with the paper's min_replay_size (2,000) the adder's unchunked first
    # items would be half of the 4,000 transitions measured here, and ~0.2% of a 1M replay.
    return common.steady_state_experiment()


def environment_spec():
    """reacher_hard's spec as the project's environment gives it (checked in `measure`),
    written out so that server processes never build an environment (nor a GL context)."""
    import numpy as np
    from acme import specs

    return specs.EnvironmentSpec(
        observations=specs.BoundedArray((84, 84, 3 * FRAME_STACK), np.uint8, 0, 255, "pixels"),
        actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0, "action"),
        rewards=specs.Array((), np.float32, "reward"),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"),
    )


def _table(layout: str, max_size: int):
    import reverb
    import tensorflow as tf
    from acme import types
    from acme.adders.reverb import NStepTransitionAdder

    spec = environment_spec()
    if layout == "frame_replay":
        # The builder's own table (FIFO, max_size = replay_buffer_size, not rate limited
        # as in one process; the limiter does not change what an item costs).
        from magi_lp.replay.reverb_seam import without_rate_limit

        (table,) = _store_of(_experiment()).make_tables(spec)
        return without_rate_limit(table)
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
    """The dedicated server process: prints its port, serves until stdin closes."""
    import reverb

    server = reverb.Server(
        [_table(layout, max_size)],
        checkpointer=reverb.checkpointers.DefaultCheckpointer(checkpoint_dir),
    )
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def render_episodes(transitions: int, seed: int = 0) -> list[list]:
    """Episodes of (action, timestep) from the project's environment, random actions;
    `transitions` agent steps in all (the last episode may be cut short)."""
    import numpy as np

    environment = _experiment().environment_factory(seed, False)
    spec = environment.action_spec()
    rng = np.random.default_rng(seed)
    episodes, remaining = [], transitions
    while remaining > 0:
        timestep = environment.reset()
        episode = [(None, timestep)]
        while not timestep.last() and remaining > 0:
            action = rng.uniform(spec.minimum, spec.maximum).astype(np.float32)
            timestep = environment.step(action)
            episode.append((action, timestep))
            remaining -= 1
        episodes.append(episode)
    return episodes


def _insert(layout: str, client, episodes: list[list], chunk_length: int) -> None:

    if layout == "naive_copy":
        _insert_copies(client, episodes, chunk_length)
        return
    if layout == "frame_replay":
        # The builder's adder, as actors make it (chunks of DEFAULT_CHUNK_LENGTH frames).
        adder = _store_of(_experiment()).make_adder(environment_spec(), client, 0)
    else:
        from acme.adders.reverb import NStepTransitionAdder

        adder = NStepTransitionAdder(
            client, n_step=N_STEP, discount=GAMMA, priority_fns={TABLE: None}
        )
    for episode in episodes:
        for action, timestep in episode:
            if action is None:
                adder.add_first(timestep)
            else:
                adder.add(action, timestep)
        adder.reset()
    if hasattr(adder, "close"):
        adder.close()


def _insert_copies(client, episodes: list[list], chunk_length: int) -> None:
    """One self-contained item per n-step transition, obs and next obs copied in."""
    import numpy as np
    import tree
    from acme import types

    with client.trajectory_writer(num_keep_alive_refs=chunk_length) as writer:
        configured = False
        for episode in episodes:
            for t in range(len(episode) - N_STEP):
                reward, discount = 0.0, 1.0
                for k in range(1, N_STEP + 1):
                    step = episode[t + k][1]
                    reward += discount * float(step.reward)
                    discount *= float(step.discount) * GAMMA
                item = types.Transition(
                    observation=episode[t][1].observation,
                    action=episode[t + 1][0],
                    reward=np.float32(reward),
                    discount=np.float32(discount),
                    next_observation=episode[t + N_STEP][1].observation,
                )
                if not configured:
                    for path, _ in tree.flatten_with_path(item):
                        writer.configure(
                            path, num_keep_alive_refs=chunk_length, max_chunk_length=chunk_length
                        )
                    configured = True
                writer.append(item)
                writer.create_item(
                    TABLE, 1.0, tree.map_structure(lambda column: column[-1], writer.history)
                )
                writer.flush(5)
            writer.end_episode()


def stop_server(server: subprocess.Popen) -> None:
    """Ends a `serve` process: its stdin closing is its stop; killed after 60 s."""
    server.stdin.close()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _settled_rss(pid: int, seconds: float = 1.0) -> int:
    time.sleep(seconds)
    return common.rss_bytes(pid)


def sample_rate(layout: str, client, batches: int) -> tuple[float, float]:
    """Learner-side batches per second and CPU ms per batch, after two warm-up batches.

    The frame replay is read through the DrQ builder's dataset, the others through Acme's
    `make_reverb_dataset` (batch 256, 2 readers). CPU time counts every thread of this process
    (Reverb readers, tf.data), so it stays meaningful on a shared machine; the rate does not.
    """

    if layout == "frame_replay":
        iterator = (
            _store_of(_experiment()).make_learner_replay(environment_spec(), client, None).iterator
        )
    else:
        from acme.datasets.reverb import make_reverb_dataset

        dataset = make_reverb_dataset(
            client.server_address,
            batch_size=SAMPLE_BATCH_SIZE,
            table=TABLE,
            num_parallel_calls=2,
            prefetch_size=4,
        )
        iterator = dataset.as_numpy_iterator()
    for _ in range(2):
        next(iterator)
    start, start_cpu = time.perf_counter(), process_cpu_seconds()
    for _ in range(batches):
        next(iterator)
    cpu_ms = 1000 * (process_cpu_seconds() - start_cpu) / batches
    return batches / (time.perf_counter() - start), cpu_ms


def measure_layout(
    layout: str, episodes: list[list], chunk_length: int, max_size: int, sample_batches: int = 0
) -> dict:
    """Inserts `episodes` into a fresh server process of `layout`; its memory per item (and,
    with `sample_batches`, the learner-side sampling rate from it)."""
    import reverb

    with tempfile.TemporaryDirectory() as checkpoint_dir:
        env = common.marked_env(cpu_only_env())
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.replay_memory",
                "serve",
                layout,
                str(max_size),
                checkpoint_dir,
            ],
            cwd=common.REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            port = int(server.stdout.readline())
            client = reverb.Client(f"localhost:{port}")
            client.server_info()  # the table exists and the server answers
            rss_before = _settled_rss(server.pid, 2.0)
            start = time.perf_counter()
            _insert(layout, client, episodes, chunk_length)
            insert_s = time.perf_counter() - start
            items = int(client.server_info()[TABLE].current_size)
            rss_after = _settled_rss(server.pid, 2.0)
            path = pathlib.Path(client.checkpoint())
            chunk_bytes = sum(f.stat().st_size for f in path.glob("chunks*"))
            table_bytes = sum(f.stat().st_size for f in path.glob("tables*"))
            sampling = sample_rate(layout, client, sample_batches) if sample_batches else None
        finally:
            stop_server(server)
    result = {
        "items": items,
        "rss_before_mb": rss_before / 2**20,
        "rss_growth_mb": (rss_after - rss_before) / 2**20,
        "rss_bytes_per_transition": (rss_after - rss_before) / max(items, 1),
        "checkpoint_bytes_per_transition": (chunk_bytes + table_bytes) / max(items, 1),
        "insert_seconds": insert_s,
    }
    if sampling is not None:
        result["batches_per_second"], result["sample_cpu_ms_per_batch"] = sampling
    return result


def measure(quick: bool) -> dict:
    return measure_layouts(400 if quick else 4000, LAYOUTS)


def measure_layouts(transitions: int, layouts: Sequence[str], sample_batches: int = 0) -> dict:
    """Renders `transitions` once and measures each of `layouts` on them."""
    chunk_length = 1  # naive layout: every item its own chunk (the others choose their own)
    actual = _experiment().get_environment_spec()
    expected = environment_spec()
    for name in ("observations", "actions", "rewards", "discounts"):
        a, e = getattr(actual, name), getattr(expected, name)
        if (a.shape, a.dtype) != (e.shape, e.dtype):
            raise RuntimeError(f"environment spec changed: {name} {a} != {e}")
    progress(f"rendering {transitions} transitions of reacher_hard at 84x84")
    start = time.perf_counter()
    episodes = render_episodes(transitions)
    render_s = time.perf_counter() - start
    results = {}
    for layout in layouts:
        progress(f"inserting into a fresh {layout} server")
        results[layout] = measure_layout(
            layout, episodes, chunk_length, 10 * transitions + 1000, sample_batches
        )
        progress(f"  {results[layout]['rss_bytes_per_transition']:.0f} B/transition (RSS)")
    return {
        "transitions": transitions,
        "episodes": len(episodes),
        "render_seconds": render_s,
        "chunk_length": chunk_length,
        "n_step": N_STEP,
        "frame_stack": FRAME_STACK,
        "official_bytes": OFFICIAL_BYTES,
        "goal_bytes": GOAL_BYTES,
        "layouts": results,
    }


_LABELS = {
    "frame_replay": "magi_lp frame replay (FrameStackAdder)",
    "acme_nstep": "Acme NStepTransitionAdder (stack per step, shared)",
    "naive_copy": "naive: obs + next obs copied into every item",
}


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    layouts = result["layouts"]
    ours = layouts["frame_replay"]["rss_bytes_per_transition"]
    naive = layouts["naive_copy"]["rss_bytes_per_transition"]
    return (
        f"{fmt(ours / 1000, 1)} KB/transition (server RSS); goal <= "
        f"{fmt(result['goal_bytes'] / 1000, 0)} KB",
        f"naive {fmt(naive / 1000, 1)} KB; official DrQ-v2 "
        f"{fmt(result['official_bytes'] / 1000, 1)} KB",
        f"{fmt(ratio(ours, naive), 3)} vs naive; "
        f"{fmt(ratio(ours, result['official_bytes']), 3)} vs official",
    )


def report(result: dict) -> str:
    layouts = result["layouts"]
    ours = layouts["frame_replay"]["rss_bytes_per_transition"]
    naive = layouts["naive_copy"]["rss_bytes_per_transition"]
    lines = [
        f"**{fmt(ours / 1000, 1)} KB per transition** (server RSS growth) for the frame "
        f"replay; the naive layout takes {fmt(naive / 1000, 1)} KB (ratio "
        f"**{fmt(ratio(ours, naive), 3)}**), the official DrQ-v2 replay's "
        f"{fmt(result['official_bytes'] / 1000, 1)} KB (ratio "
        f"**{fmt(ratio(ours, result['official_bytes']), 3)}**). Goal <= "
        f"{fmt(result['goal_bytes'] / 1000, 0)} KB.",
        "",
        "| layout | items | RSS growth | RSS B/transition | checkpoint B/transition "
        "| vs official 63.5 KB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, label in _LABELS.items():
        layout = layouts[name]
        lines.append(
            f"| {label} | {fmt(layout['items'])} | {fmt(layout['rss_growth_mb'])} MB "
            f"| {fmt(layout['rss_bytes_per_transition'], 0)} "
            f"| {fmt(layout['checkpoint_bytes_per_transition'], 0)} "
            f"| {fmt(ratio(layout['rss_bytes_per_transition'], result['official_bytes']), 3)} |"
        )
    lines += [
        "",
        f"How: {fmt(result['transitions'])} real transitions ({result['episodes']} "
        "episodes) of reacher_hard rendered once by the project's environment (84x84, "
        "action repeat 2, frame stack 3, random actions), inserted with n-step "
        f"{result['n_step']} into a fresh Reverb server process per layout (the frame "
        "replay and Acme's adder choose their own chunk lengths; the naive layout writes "
        f"chunks of {result['chunk_length']} item(s)). RSS = the server's VmRSS growth "
        "from 2 s before the first insert to 2 s after "
        "the last item is confirmed, per item stored. Checkpoint = compressed chunks and "
        "item records in a Reverb checkpoint of the table, per item: the payload without "
        "allocator slack. Reverb 0.7.0 compresses every chunk (Snappy). Official DrQ-v2: one "
        "uncompressed 9x84x84 uint8 stack per step = 63,504 B.",
    ]
    return "\n".join(lines)


def table_main(argv: list[str]) -> None:
    """`python -m benchmarks.replay_memory table ...`: prints a table and one JSON line."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.replay_memory table", description=TITLE
    )
    parser.add_argument("--transitions", type=int, default=4000, help="agent steps rendered")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    parser.add_argument(
        "--sample-batches", type=int, default=0, help="batches of 256 to time per layout"
    )
    args = parser.parse_args(argv)
    layouts = args.layouts.split(",")
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        parser.error(f"unknown layout {', '.join(unknown)}; the layouts are {', '.join(LAYOUTS)}")
    for name, value in cpu_only_env().items():  # as run.py gives the figure, unless set
        os.environ.setdefault(name, value)
    result = measure_layouts(args.transitions, layouts, args.sample_batches)
    columns = {
        "items": ("items", 0),
        "rss_bytes_per_transition": ("RSS B/tr", 0),
        "checkpoint_bytes_per_transition": ("ckpt B/tr", 0),
        "rss_growth_mb": ("RSS MB", 1),
        "batches_per_second": ("batch/s", 1),
        "sample_cpu_ms_per_batch": ("cpu ms/b", 1),
    }
    print("".join(f"{h:>14}" for h in ("layout", *(label for label, _ in columns.values()))))
    for layout, row in result["layouts"].items():
        cells = [fmt(row.get(key), digits) for key, (_, digits) in columns.items()]
        print("".join(f"{c:>14}" for c in (layout, *cells)))
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "table":
        table_main(sys.argv[2:])
    else:
        common.figure_main(measure)


def _store_of(experiment):
    """The replay store the runners would resolve for `experiment`."""
    from magi_lp.replay.stores import resolve_store

    return resolve_store(experiment.builder, experiment.config)
