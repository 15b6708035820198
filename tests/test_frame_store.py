"""The frame stores (the device store and the compressed host store): the same transitions as
the Reverb frame replay, bit for bit; FIFO eviction that never overwrites a live frame;
uniform sampling; checkpoints; shards (device); a full arena evicts early (host)."""

from __future__ import annotations

import threading

import dm_env
import jax
import numpy as np
import pytest

from magi_lp.errors import ConfigError
from magi_lp.replay.compressed_frames import CompressedFrameStore
from magi_lp.replay.frame_store import DeviceFrameStore, StoreAdder
from magi_lp.replay.frame_window import CHECK_ROW_STRIDE, NewestFrames
from magi_lp.replay.spec import FrameReplaySpec
from magi_lp.runtime.checkpointing import Checkpointer
from tests.e2e_utils import run_on_host_devices

H, W, C = 6, 5, 3
STACK, N_STEP, GAMMA = 3, 3, 0.99


STORES = {"device": DeviceFrameStore, "host": CompressedFrameStore}
"""The frame stores, by their `replay.store` value: each test taking `Store` runs on both."""


@pytest.fixture(params=sorted(STORES))
def Store(request):  # noqa: N802 (a class)
    return STORES[request.param]


def make_spec(capacity: int = 1000, batch_size: int = 8, **overrides) -> FrameReplaySpec:
    fields = dict(
        frame_shape=(H, W, C),
        frame_stack=STACK,
        n_step=N_STEP,
        discount=GAMMA,
        capacity=capacity,
        batch_size=batch_size,
        action_shape=(2,),
    )
    fields.update(overrides)
    return FrameReplaySpec(**fields)


def episode(rng: np.random.Generator, length: int, terminal: bool = False) -> list:
    """The timesteps and actions of one episode with stacked observations, as the wrapper
    stacks them: the first observation repeats its frame; each later one shifts by one."""
    frames = rng.integers(0, 256, size=(length + 1, H, W, C), dtype=np.uint8)
    stack = [frames[0]] * STACK
    steps = [(None, dm_env.restart(np.concatenate(stack, axis=-1)))]
    for t in range(1, length + 1):
        stack = [*stack[1:], frames[t]]
        observation = np.concatenate(stack, axis=-1)
        reward = np.float32(rng.normal())
        action = rng.uniform(-1, 1, size=2).astype(np.float32)
        if t < length:
            timestep = dm_env.transition(reward, observation, discount=float(rng.uniform(0.5, 1)))
        elif terminal:
            timestep = dm_env.termination(reward, observation)
        else:
            timestep = dm_env.truncation(reward, observation)
        steps.append((action, timestep))
    return steps


def episodes(seed: int, lengths: list[int]) -> list[list]:
    rng = np.random.default_rng(seed)
    return [episode(rng, length, terminal=i % 3 == 1) for i, length in enumerate(lengths)]


def feed(adders: list, writer_episodes: list[list[list]]) -> None:
    """Interleaves the writers' episodes step by step (writer 0, 1, 0, 1, ...)."""
    cursors = [iter([s for ep in eps for s in ep]) for eps in writer_episodes]
    live = list(range(len(adders)))
    while live:
        for w in list(live):
            step = next(cursors[w], None)
            if step is None:
                live.remove(w)
                continue
            action, timestep = step
            if timestep.first():
                adders[w].add_first(timestep)
            else:
                adders[w].add(action, timestep)


def reference(writer_episodes: list[list[list]]) -> list[tuple]:
    """Every transition (frames window, action, reward, discount) the stores should hold,
    in the order they complete, computed the naive way: from stacked observations."""
    out = []
    cursors = [iter(eps) for eps in writer_episodes]
    per_writer = []
    for eps in writer_episodes:
        transitions = []
        for ep in eps:
            observations = [ts.observation for _, ts in ep]
            frames = [obs[..., -C:] for obs in observations]
            first = observations[0]
            padded = [first[..., i * C : (i + 1) * C] for i in range(STACK - 1)] + frames
            for t in range(len(ep) - N_STEP):
                window = np.stack(padded[t : t + STACK + N_STEP])
                action = ep[t + 1][0]
                reward, weight = np.float32(0), np.float32(1)
                for k in range(N_STEP):
                    ts = ep[t + 1 + k][1]
                    reward = np.float32(reward + weight * np.float32(ts.reward))
                    weight = np.float32(weight * (np.float32(GAMMA) * np.float32(ts.discount)))
                # completes when step t + n is added: order key = (global step index, writer)
                transitions.append((window, action, reward, weight))
        per_writer.append(transitions)
    del cursors
    # Writers are fed round-robin one step at a time: order transitions by completion step.
    order = []
    for w, eps in enumerate(writer_episodes):
        step_index = 0
        t_index = 0
        for ep in eps:
            for t in range(len(ep)):
                if t >= N_STEP:
                    order.append((step_index, w, per_writer[w][t_index]))
                    t_index += 1
                step_index += 1
    order.sort(key=lambda item: (item[0], item[1]))
    out = [item[2] for item in order]
    return out


def as_keys(frames, action, reward, discount) -> list[bytes]:
    return [
        b"".join(np.ascontiguousarray(x).tobytes() for x in (f, a, np.float32(r), np.float32(d)))
        for f, a, r, d in zip(frames, action, reward, discount, strict=True)
    ]


def test_holds_exactly_the_reference_transitions_in_fifo_order(Store):
    data = [episodes(1, [7, 2, 12, 3]), episodes(2, [9, 4, 11])]
    store = Store(make_spec(), writers=2)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
    got = store.transitions_at(0)
    want = reference(data)
    assert (
        len(got.reward) == len(want) == sum(max(n - N_STEP + 1, 0) for n in [7, 2, 12, 3, 9, 4, 11])
    )
    assert as_keys(got.frames, got.action, got.reward, got.discount) == as_keys(
        *zip(*want, strict=True)
    )


def test_a_flush_cut_before_its_insert_keeps_the_staged_writes_for_the_next(monkeypatch):
    """main.py flushes in its one thread: a Ctrl-C there dropped the staged frames and rows
    the host already counted, and the store kept live transitions of unwritten frames."""
    data = [episodes(1, [7, 12]), episodes(2, [9])]
    store = DeviceFrameStore(make_spec(), writers=2)
    store.flush()  # nothing yet: waits for the programs it compiles ahead
    arrays, cuts = store._padded_arrays, [1]

    def cut_once(staged):
        if cuts:
            cuts.pop()
            raise KeyboardInterrupt
        return arrays(staged)

    monkeypatch.setattr(store, "_padded_arrays", cut_once)
    with pytest.raises(KeyboardInterrupt):
        feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
        store.flush()
    assert not cuts, "the flush was not cut"
    got, want = store.transitions_at(0), reference(data)
    assert as_keys(got.frames, got.action, got.reward, got.discount) == as_keys(
        *zip(*want, strict=True)
    )


def test_evicts_oldest_first_and_never_overwrites_a_live_frame(Store):
    # A capacity far below the data: rows and frame slots are reused many times over.
    data = [episodes(3, [40, 5, 3, 17, 30, 8]), episodes(4, [25, 25, 6, 2, 33])]
    spec = make_spec(capacity=16)
    store = Store(spec, writers=2)
    adders = [StoreAdder(store, 0), StoreAdder(store, 1)]
    feed(adders, data)
    got = store.transitions_at(0)
    want = reference(data)
    size = len(got.reward)
    assert spec.capacity - 2 <= size <= spec.capacity  # short episodes may evict early
    assert as_keys(got.frames, got.action, got.reward, got.discount) == as_keys(
        *zip(*want[-size:], strict=True)
    )


def test_sampling_is_uniform_over_live_transitions_and_matches_them(Store):
    data = [episodes(5, [20, 20]), episodes(6, [20])]
    store = Store(make_spec(capacity=30, batch_size=64), writers=2)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
    live = store.transitions_at(0)
    live_keys = as_keys(live.frames, live.action, live.reward, live.discount)
    counts = dict.fromkeys(live_keys, 0)
    key = jax.random.PRNGKey(0)
    for i in range(40):
        batch = jax.device_get(store.sample(jax.random.fold_in(key, i)))
        for k in as_keys(batch.frames, batch.action, batch.reward, batch.discount):
            counts[k] += 1  # KeyError: sampled something that is not live
    total = 40 * 64
    assert len(counts) == 30
    # Each of 30 items expects 85.3 draws; a chi-square test at a generous level.
    expected = total / len(counts)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 70, chi2  # 29 dof: p ~ 5e-5


def test_checkpoint_round_trip_restores_transitions_and_keeps_writing(Store):
    data = [episodes(7, [15, 9]), episodes(8, [12])]
    spec = make_spec(capacity=20)
    store = Store(spec, writers=2)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
    saved = jax.device_get(store.save())
    before = store.transitions_at(0)

    restored = Store(spec, writers=2)
    restored.restore(saved)
    after = restored.transitions_at(0)
    assert as_keys(after.frames, after.action, after.reward, after.discount) == as_keys(
        before.frames, before.action, before.reward, before.discount
    )
    assert restored.inserted == store.inserted
    # Writing on: new episodes evict old transitions without touching live frames.
    more = [episodes(9, [10, 10]), episodes(10, [10])]
    feed([StoreAdder(restored, 0), StoreAdder(restored, 1)], more)
    got = restored.transitions_at(0)
    want = [
        *[(f, a, r, d) for f, a, r, d in zip(*before[:4], strict=True)],
        *reference(more),
    ]
    size = len(got.reward)
    assert as_keys(got.frames, got.action, got.reward, got.discount) == as_keys(
        *zip(*want[-size:], strict=True)
    )


def test_a_checkpoint_written_while_writes_are_held_is_the_store_at_its_save(Store, tmp_path):
    """The learner node's drain thread flushes while the learner's checkpoint is written: an
    insert donates the store's arrays, and what `save()` had returned was deleted before
    orbax wrote it (the replay's checkpoint and that learner checkpoint lost)."""
    spec = make_spec(capacity=20)
    store = Store(spec, writers=2)
    flushed = threading.Event()

    def write_more(seed: int = 9) -> None:
        more = [episodes(seed, [10, 10]), episodes(seed + 1, [10])]
        feed([StoreAdder(store, 0), StoreAdder(store, 1)], more)
        store.flush()
        flushed.set()

    feed([StoreAdder(store, 0), StoreAdder(store, 1)], [episodes(7, [15, 9]), episodes(8, [12])])
    write_more(seed=20)  # compiles this flush's insert: the writer's below takes milliseconds
    flushed.clear()
    before = store.transitions_at(0)
    with store.holding_writes():
        saved = store.save()
        writer = threading.Thread(target=write_more)
        writer.start()
        assert not flushed.wait(1.0), "a flush went on inside the hold"  # it takes ms
        Checkpointer(tmp_path).save(1, saved)
    writer.join(timeout=60)
    assert flushed.is_set()

    restored = Store(spec, writers=2)
    state, _ = Checkpointer(tmp_path).restore(restore_target(restored))
    restored.restore(state)
    after = restored.transitions_at(0)
    assert as_keys(after.frames, after.action, after.reward, after.discount) == as_keys(
        before.frames, before.action, before.reward, before.discount
    )
    if Store is not DeviceFrameStore:
        return
    # Unheld, the same flush deletes what save() returned, where inserts donate (jax >= 0.5).
    saved = store.save()
    write_more()
    leaves = jax.tree_util.tree_leaves(saved["device"])
    assert all(leaf.is_deleted() for leaf in leaves) or jax.__version_info__ < (0, 5)


def restore_target(store) -> object:
    """What the learner runner restores a store's checkpoint into (`ReplayCheckpoint`): the
    host store's saved shapes as they are (None), a fresh device store's own."""
    return getattr(store, "restore_target", store.save)()


def test_the_host_stores_checkpoint_holds_the_arena_bytes_in_use_not_the_whole_arena(tmp_path):
    """A store sized for many more transitions than it holds writes only its arena's bytes
    up to the high-water mark (a 1M-transition arena is 5.46 GB: 23 s to write, past the
    stop's notice), and comes back from the saved shapes sampling the same transitions."""
    spec = make_spec(capacity=100_000, batch_size=32)
    store = CompressedFrameStore(spec, writers=2)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], [episodes(7, [150, 90]), episodes(8, [160])])
    assert 300 <= store.size < 400
    key = np.asarray([1, 2], np.uint32)
    before = store.sample(key)
    with store.holding_writes():
        Checkpointer(tmp_path).save(1, store.save())
    saved_arena = store.save()["arena"].nbytes
    assert saved_arena == store.info()["replay_frame_bytes"]  # nothing evicted, no gaps
    assert saved_arena < store._arena.nbytes // 50

    fresh = CompressedFrameStore(spec, writers=2)
    state, _ = Checkpointer(tmp_path).restore(fresh.restore_target())
    assert state["arena"].shape == (saved_arena,)
    fresh.restore(state)
    after = fresh.sample(key)
    assert as_keys(after.frames, after.action, after.reward, after.discount) == as_keys(
        before.frames, before.action, before.reward, before.discount
    )
    assert keys_of(fresh.transitions_at()) == keys_of(store.transitions_at())
    # Writing on, the restored store and the one that never stopped hold the same.
    more = [episodes(9, [40]), episodes(10, [30])]
    for side in (store, fresh):
        feed([StoreAdder(side, 0), StoreAdder(side, 1)], more)
    assert keys_of(fresh.transitions_at()) == keys_of(store.transitions_at())
    assert fresh.save()["arena"].nbytes == store.save()["arena"].nbytes > saved_arena


def test_the_host_store_refuses_an_arena_saved_with_another_replay_size():
    big = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=6000)
    feed([StoreAdder(big, 0), StoreAdder(big, 1)], [episodes(3, [60]), episodes(4, [60])])
    saved = big.save()
    assert saved["arena"].nbytes > 3000
    small = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=3000)
    with pytest.raises(ConfigError, match="another replay size") as raised:
        small.restore(saved)
    assert "\n" not in str(raised.value)


def test_a_wrapped_arena_saves_all_of_it_and_restores_exactly():
    store = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=3000)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], [episodes(3, [60]), episodes(4, [60])])
    saved = store.save()
    assert store.evicted_early > 0 and 2900 < saved["arena"].nbytes <= 3000
    fresh = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=3000)
    fresh.restore({k: np.copy(v) if k == "arena" else v for k, v in saved.items()})
    assert keys_of(fresh.transitions_at()) == keys_of(store.transitions_at())
    more = [episodes(5, [30]), episodes(6, [30])]
    for side in (store, fresh):
        feed([StoreAdder(side, 0), StoreAdder(side, 1)], more)
    assert keys_of(fresh.transitions_at()) == keys_of(store.transitions_at())


def keys_of(transitions) -> list[bytes]:
    return as_keys(transitions.frames, transitions.action, transitions.reward, transitions.discount)


def test_bad_inputs_say_what_to_change(Store):
    with pytest.raises(ConfigError, match="frame_stack must be an integer >= 1"):
        make_spec(frame_stack=0)
    store = Store(make_spec(), writers=1)
    with pytest.raises(ValueError, match="uint8"):
        store.add_first(0, np.zeros((H, W, C), np.float32))
    with pytest.raises(ValueError, match="add\\(\\) before add_first"):
        store.add(0, np.zeros((H, W, C), np.uint8), np.zeros(2), 0.0, 1.0)


def test_sizes_count_frames_and_index():
    spec = make_spec(capacity=1_000_000, frame_shape=(84, 84, 3), action_shape=(6,))
    frames = spec.frame_capacity(2) * 84 * 84 * 3
    assert spec.nbytes(writers=2) == frames + 1_000_000 * (4 * 6 + 4 + 4 + 4 * 6)
    assert 21.8e9 < spec.nbytes(writers=2) < 22.0e9


def test_a_full_arena_evicts_the_oldest_transitions_early_and_keeps_the_rest_exact():
    """The compressed store's frames fill a fixed arena: frames past it take back the oldest
    space, evicting the oldest transitions early; what stays is the newest reference ones."""
    data = [episodes(3, [40, 5, 3, 17, 30, 8]), episodes(4, [25, 25, 6, 2, 33])]
    store = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=3000)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
    got, want = store.transitions_at(), reference(data)
    size = len(got.reward)
    assert 5 <= size < len(want) and store.evicted_early == len(want) - size
    assert as_keys(got.frames, got.action, got.reward, got.discount) == as_keys(
        *zip(*want[-size:], strict=True)
    )
    assert store.info()["replay_frame_bytes"] <= store.save()["arena"].nbytes <= 3000


def test_a_writer_stalled_for_a_whole_arena_has_its_episode_ended_not_the_store():
    """A writer whose open window holds the oldest frame when the arena wraps loses the rest
    of that episode (its steps are skipped until its next first step); the others go on."""
    store = CompressedFrameStore(make_spec(capacity=1000), writers=2, arena_bytes=3000)
    stalled, running = StoreAdder(store, 0), StoreAdder(store, 1)
    (stalled_episode,) = episodes(5, [30])
    stalled.add_first(stalled_episode[0][1])
    stalled.add(*stalled_episode[1])
    feed([running], [episodes(6, [60, 60])])
    assert not store.in_episode(0)
    for action, timestep in stalled_episode[2:]:  # skipped, no error
        stalled.add(action, timestep)
    assert not store.in_episode(0)
    feed([stalled], [episodes(7, [10])])  # a new episode is taken in
    assert store.size > 0 and store.transitions_at().frames.shape[1:] == (6, H, W, C)


def test_the_host_store_sizes_its_arena_under_8_kb_a_transition():
    from magi_lp.replay.compressed_frames import arena_nbytes, estimated_nbytes

    spec = make_spec(capacity=1_000_000, frame_shape=(84, 84, 3), action_shape=(6,))
    assert arena_nbytes(spec, 4) == spec.frame_capacity(4) * int(84 * 84 * 3 * 0.25)
    assert 5.0e9 < estimated_nbytes(spec, 4) < 6.0e9  # 1M transitions: < 8 KB each
    store = CompressedFrameStore(make_spec(capacity=100), writers=2)
    assert store.nbytes() == estimated_nbytes(store.spec, 2)


def reverb_frame_replay_keys(data: list) -> tuple[int, list[bytes]]:
    """The official sampler's transitions for `data` (each writer's episodes), as keys: the
    Reverb frame replay's dataset over one table that two or more `FrameStackAdder`s fed; with
    the table's size. The reference every store's bit-for-bit check compares with."""
    import reverb
    from acme import specs

    from magi_lp.replay.frame_replay import FrameStackAdder, frame_replay_signature
    from tests.agent_harness import queue_dataset

    action_spec = specs.BoundedArray((2,), np.float32, -1.0, 1.0)
    table = reverb.Table(
        name="frames",
        sampler=reverb.selectors.Fifo(),
        remover=reverb.selectors.Fifo(),
        max_size=10_000,
        max_times_sampled=1,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=frame_replay_signature((H, W, C), action_spec, frame_stack=STACK, n_step=N_STEP),
    )
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        adders = [
            FrameStackAdder(client, "frames", frame_stack=STACK, n_step=N_STEP, channels=C)
            for _ in data
        ]
        feed(adders, data)
        for adder in adders:
            adder.close()
        count = client.server_info()["frames"].current_size
        dataset = queue_dataset(
            client.server_address,
            "frames",
            batch_size=count,
            frame_stack=STACK,
            n_step=N_STEP,
            discount=GAMMA,
            stack_on_host=False,
            prefetch=0,
            rate_limiter_timeout_ms=2000,
        )
        batch = next(dataset)
    finally:
        server.stop()
    return count, as_keys(batch.frames, batch.action, batch.reward, batch.discount)


@pytest.mark.integration
def test_same_transitions_as_the_reverb_frame_replay_bit_for_bit(Store):
    """Both stores fed the same episodes (two writers, interleaved, with terminations,
    episodes shorter than n) hold the same set of (window, action, reward, discount)."""
    pytest.importorskip("reverb")
    data = [episodes(11, [7, 2, 12, 3, 30]), episodes(12, [9, 4, 11, 1, 25])]
    count, reverb_keys = reverb_frame_replay_keys(data)

    store = Store(make_spec(), writers=2)
    feed([StoreAdder(store, 0), StoreAdder(store, 1)], data)
    on_device = store.transitions_at(0)
    store_keys = as_keys(on_device.frames, on_device.action, on_device.reward, on_device.discount)
    assert count == len(store_keys) == len(reference(data))
    assert sorted(reverb_keys) == sorted(store_keys)


_TWO_DEVICE_PROBE = r"""
import json, jax, numpy as np, dm_env
from magi_lp.agent.data_parallel import compiled_collectives
from magi_lp.replay.frame_store import DeviceFrameStore, StoreAdder
from magi_lp.replay.frame_window import CHECK_ROW_STRIDE, NewestFrames
from magi_lp.replay.spec import FrameReplaySpec

spec = FrameReplaySpec(frame_shape=(6, 5, 3), frame_stack=3, n_step=3, discount=0.99,
                       capacity=50, batch_size=8, action_shape=(2,))
store = DeviceFrameStore(spec, writers=2)
for writer, value in ((0, 7), (1, 200)):  # each writer's frames carry its own value
    adder = StoreAdder(store, writer)
    frame = np.full((6, 5, 3), value, np.uint8)
    observation = np.concatenate([frame] * 3, axis=-1)
    adder.add_first(dm_env.restart(observation))
    for _ in range(20):
        adder.add(np.zeros(2, np.float32), dm_env.transition(1.0, observation))
batch = store.sample(jax.random.PRNGKey(0))
shards = {
    str(s.device.id): sorted(set(np.asarray(s.data).reshape(-1).tolist()))
    for s in batch.frames.addressable_shards
}
visible = jax.device_put(store._visible, store._replicated)
collectives = compiled_collectives(store._sample, store._state, visible,
                                   jax.random.PRNGKey(0), np.int32(0))
print(json.dumps({"devices": len(jax.devices()), "shard_sizes": store.shard_sizes(),
                  "frames_per_device": shards, "collectives": collectives,
                  "store_devices": sorted(d.id for d in store._state["frames"].devices())}))
"""


def test_each_device_keeps_its_writers_shard_and_samples_it_without_collectives():
    """A data-parallel learner's store: writer w's steps on device w % 2, each device draws
    its half of the batch from its own shard, and the sampling program moves no frames
    between devices (no collective of any kind)."""
    found = run_on_host_devices(_TWO_DEVICE_PROBE, devices=2)
    assert found["devices"] == 2 and found["store_devices"] == [0, 1]
    assert found["shard_sizes"] == [18, 18]  # 20 steps, n = 3: 18 transitions each
    assert found["frames_per_device"] == {"0": [7], "1": [200]}
    assert all(count == 0 for count in found["collectives"].values()), found["collectives"]


def test_newest_frames_are_taken_and_every_observation_is_checked_to_follow_on():
    """The newest frame of each stacked observation, copied contiguous; an episode's first
    shift is checked on every row, later ones on every `CHECK_ROW_STRIDE`-th row: a skipped
    frame fails either way."""
    height = 3 * CHECK_ROW_STRIDE
    frames = [np.full((height, W, C), i, np.uint8) for i in range(8)]

    def stacked(i: int) -> np.ndarray:
        return np.concatenate([frames[max(j, 0)] for j in range(i - STACK + 1, i + 1)], -1)

    window = NewestFrames(frame_stack=STACK, channels=C)
    window.first(stacked(0))
    for i in range(1, 4):
        frame = window.next(stacked(i))
        assert frame.flags.c_contiguous and np.array_equal(frame, frames[i])
    with pytest.raises(ValueError, match="shifted by one frame"):
        window.next(stacked(5))  # frame 4 skipped
    window.first(stacked(0))
    with pytest.raises(ValueError, match="shifted by one frame"):
        window.next(stacked(2))  # an episode's first shift, checked whole
