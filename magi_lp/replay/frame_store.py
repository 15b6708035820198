"""A pixel replay held on the learner's own device(s): unique frames + an n-step index.

Why: dm-reverb 0.7.0 decompresses the Snappy chunks of every sampled item again (~46 CPU
ms per 256-batch at 84x84, one core per ~22 updates/s). Here a batch is a gather on the
device. Each step reaches the store once (from the step queue in a distributed run,
`magi_lp.replay.step_queue`; straight from the actor in one process, `StoreAdder`).

Layout (one shard per learner device; a one-device learner has one shard):

    frames    uint8   [F, H*W*C]      each rendered frame once (flat rows: a row gather
                                      is ~10x faster on a CPU than a [F, H, W, C] one)
    slots     int32   [N, S + n]      each transition's window of frame rows, oldest first
    action    [N, ...]                the action at the observation
    reward    float32 [N]             the n-step return sum_k gamma^k prod_{j<k} d_j r_k
    discount  float32 [N]             gamma^n prod_k d_k (multiplies the bootstrap as is)
    extras    [N, ...]                what the actor stored with the action (often nothing)

N is the transition capacity, S the frame stack, n the n-step. Transitions live in a ring:
the live ones are the positions [head - size, head) mod N, oldest evicted first (FIFO, as the
Reverb table's remover). Sampling is uniform over them: `randint(size)` on the device.

Which frame row a new frame takes is decided on the host (`magi_lp.replay.frame_ring`): a
row is reused only when no live transition or open window points at it. F = N + N/32 +
writers x (S + n): N transitions of episodes longer than ~32 steps need fewer rows; with
shorter episodes the store evicts its oldest transitions early rather than overwrite.

Writes are staged on the host and applied in one jitted scatter per `flush()` with the store
donated (no copy of the store per insert). Staged rows of one flush are deduplicated (the
last write of a row wins), since a scatter's order over duplicate indices is unspecified.

The transitions are exactly those of the Reverb frame replay for the same episodes: episode
starts padded by repeating the first frame (here: the same row S times, no copies), a
transition only when its whole n-step window lies in the episode, n-step returns computed in
float32 in the same order as the Reverb dataset (`tests/test_frame_store.py` compares both
bit for bit).

Imports no Reverb and no TensorFlow: a single-process run on a current stack uses it alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.launch.interrupts import stop_deferred
from magi_lp.replay.frame_ring import FrameRing, FrameRingStore, StoreBatches, index_leaves
from magi_lp.replay.frame_window import FrameTransition, NewestFrames
from magi_lp.replay.spec import FrameReplaySpec

try:  # jax >= 0.6 exports it at the top level; 0.4.x only under experimental
    from jax import shard_map as _shard_map
except ImportError:  # pragma: no cover - depends on the installed jax
    from jax.experimental.shard_map import shard_map as _shard_map

SHARD_AXIS = "batch"
"""The mesh axis of the store's shards: the same as a data-parallel learner's batch axis
(`magi_lp.agent.data_parallel.BATCH_AXIS`), so a sampled batch is already split as the
update wants it."""

MAX_STAGED_STEPS = 256
"""Steps a shard stages on the host before `add` flushes them by itself."""


def transition_shape(spec: FrameReplaySpec, batch_size: int | None = None) -> FrameTransition:
    """A batch of `spec` as `jax.ShapeDtypeStruct`s: lets a learner compile before data
    exists."""
    batch = spec.batch_size if batch_size is None else batch_size

    def leaf(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((batch, *shape), np.dtype(dtype))

    return FrameTransition(
        frames=leaf((spec.window, *spec.frame_shape), np.uint8),
        action=leaf(spec.action_shape, spec.action_dtype),
        reward=leaf((), np.float32),
        discount=leaf((), np.float32),
        extras=jax.tree_util.tree_map(lambda s: leaf(s.shape, s.dtype), spec.extras),
    )


def _bucket(count: int) -> int:
    """Rows per jitted insert: powers of two from 8, so few shapes compile."""
    return max(8, 1 << max(0, count - 1).bit_length())


def staged_insert_bytes(spec: FrameReplaySpec) -> int:
    """Device bytes of the largest insert a shard applies at once (`MAX_STAGED_STEPS` rows of
    frames and index, padded to their bucket): what a flush holds beside the store."""
    return _bucket(MAX_STAGED_STEPS) * (spec.frame_nbytes + spec.index_nbytes())


class DeviceFrameStore(FrameRingStore):
    """The device store: host bookkeeping (a `FrameRing` per device) + the arrays on the devices.

    Thread-safe: writers (`add_first`/`add`, from a drain thread or the acting loop) and the
    learner (`sample`) share one lock, held only while bookkeeping and dispatching (JAX runs
    the scatter and the gather asynchronously, in order).
    """

    def __init__(
        self,
        spec: FrameReplaySpec,
        *,
        writers: int = 1,
        devices: Sequence[jax.Device] | None = None,
        on_visible: Callable[[int], None] | None = None,
    ):
        """Creates an empty store (allocated on the devices at once).

        Args:
          spec: what is stored.
          writers: how many writers (adders) write at once; writer w goes to shard
            w % len(devices), and each shard reserves frame rows for its writers' open
            windows.
          devices: one shard per device (default: this process's local devices, as a
            data-parallel learner uses them); the batch size must divide by their count.
          on_visible: called with the number of transitions each flush makes visible to
            `sample` (the replay ratio's insert count).
        """
        devices = tuple(devices) if devices is not None else tuple(jax.local_devices())
        shards = len(devices)
        if spec.batch_size % shards:
            raise ConfigError(
                fact_refusal(
                    f"agent.batch_size={spec.batch_size} does not split evenly over the "
                    f"learner's {shards} devices",
                    "each keeps one replay shard",
                    f"make it a multiple of {shards}",
                )
            )
        if writers < shards:
            raise ConfigError(
                fact_refusal(
                    f"only {writers} writer(s) (num_actors x envs_per_actor) write to the "
                    f"learner's {shards} devices",
                    "each device keeps a replay shard written by its own writers",
                    f"make num_actors x envs_per_actor at least {shards}, or give the learner "
                    "fewer devices",
                )
            )
        self.spec = spec
        self.devices = devices
        self.num_shards = shards
        self.writers = writers
        self._on_visible = on_visible
        self._lock = threading.RLock()  # re-entered by save() inside holding_writes()
        per_shard = -(-writers // shards)
        frame_capacity = spec.frame_capacity(per_shard)
        self._shards = [FrameRing(spec, frame_capacity) for _ in range(shards)]
        self._visible = np.zeros((2, shards), np.int32)  # tail, size as the device sees them
        self.sampled_batches = 0
        self.inserted = 0
        """Transitions made visible to sampling since the store was made (or restored)."""
        self.steps_added = 0
        """Steps (frames) written, episode starts included."""

        mesh = Mesh(np.array(devices), (SHARD_AXIS,))
        self._sharded = NamedSharding(mesh, PartitionSpec(SHARD_AXIS))
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._frame_capacity = frame_capacity
        self._state = self._allocate(mesh)
        self._insert = jax.jit(self._make_insert(mesh), donate_argnums=0)
        # One device: batches placed as `jax.device_put` places a host batch, so an update
        # compiled ahead for host batches (`JaxLearner`'s example_batch) is the one called.
        self.batch_sharding = (
            NamedSharding(mesh, PartitionSpec(SHARD_AXIS))
            if shards > 1
            else SingleDeviceSharding(devices[0])
        )
        """Where `sample`'s batches live: split over the shards along the batch axis."""
        self._sample = jax.jit(self._make_sample(mesh), out_shardings=self.batch_sharding)
        # Compiling the gather and the inserts (one per bucket size) takes seconds on a busy
        # CPU: do it while the learner builds and the actors start, not at the first batch.
        # Not a daemon: XLA aborts a process that exits while it compiles.
        self._compiling = threading.Thread(target=self._compile_ahead, name="magi_lp-store-compile")
        self._compiling.start()

    # -- device arrays -------------------------------------------------------------------
    def _leaf_specs(self) -> dict[str, Any]:
        spec = self.spec
        n, d = spec.capacity, self.num_shards
        return {
            "frames": jax.ShapeDtypeStruct((d, self._frame_capacity, spec.frame_nbytes), np.uint8),
            "slots": jax.ShapeDtypeStruct((d, n, spec.window), np.int32),
            **index_leaves(spec, (d, n), jax.ShapeDtypeStruct),
        }

    def _allocate(self, mesh: Mesh) -> dict[str, Any]:
        shapes = self._leaf_specs()
        make = jax.jit(
            lambda: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
            out_shardings=jax.tree_util.tree_map(lambda _: self._sharded, shapes),
        )
        return make()

    def _make_insert(self, mesh: Mesh) -> Callable:
        shard = PartitionSpec(SHARD_AXIS)

        def insert_local(state, frame_slots, frames, positions, rows):
            # One shard: leading axis 1. Padding carries out-of-range indices: dropped.
            def put(array, index, values):
                return array[0].at[index[0]].set(values[0], mode="drop")[None]

            new = dict(state)
            new["frames"] = put(state["frames"], frame_slots, frames)
            for name in ("slots", "action", "reward", "discount"):
                new[name] = put(state[name], positions, rows[name])
            new["extras"] = jax.tree_util.tree_map(
                lambda a, v: put(a, positions, v), state["extras"], rows["extras"]
            )
            return new

        return _shard_map(
            insert_local,
            mesh=mesh,
            in_specs=(shard, shard, shard, shard, shard),
            out_specs=shard,
        )

    def _make_sample(self, mesh: Mesh) -> Callable:
        spec = self.spec
        per_shard = spec.batch_size // self.num_shards
        shard = PartitionSpec(SHARD_AXIS)

        def sample_local(state, visible, key, step):
            tail, size = visible[0, 0], visible[1, 0]
            key = jax.random.fold_in(jax.random.fold_in(key, step), jax.lax.axis_index(SHARD_AXIS))
            offsets = jax.random.randint(key, (per_shard,), 0, jnp.maximum(size, 1))
            positions = (tail + offsets) % spec.capacity
            slots = state["slots"][0][positions]  # [b, S + n]
            frames = state["frames"][0][slots]  # [b, S + n, H*W*C]: a gather of rows
            return FrameTransition(
                frames=frames.reshape(per_shard, spec.window, *spec.frame_shape),
                action=state["action"][0][positions],
                reward=state["reward"][0][positions],
                discount=state["discount"][0][positions],
                extras=jax.tree_util.tree_map(lambda a: a[0][positions], state["extras"]),
            )

        return _shard_map(
            sample_local,
            mesh=mesh,
            in_specs=(shard, PartitionSpec(None, SHARD_AXIS), PartitionSpec(), PartitionSpec()),
            out_specs=shard,
        )

    def _compile_ahead(self) -> None:
        try:
            visible = jax.device_put(self._visible, self._replicated)
            key = jax.random.PRNGKey(0)
            self._sample.lower(self._state, visible, key, np.int32(0)).compile()
            size = 8
            while size <= _bucket(MAX_STAGED_STEPS):
                rows = {i: np.zeros(self.spec.frame_nbytes, np.uint8) for i in range(size)}
                args = self._padded_arrays([(rows, {}) for _ in self._shards])
                self._insert.lower(self._state, *args).compile()
                size *= 2
        except Exception as error:  # the first real call compiles instead
            logging.warning("frame store: compiling ahead failed: %s", error)

    # -- writing (`add_first`, `add`, `in_episode`: `FrameRingStore`'s) --------------------
    def shard_of(self, writer: int) -> int:
        """The shard writer `writer`'s steps go to."""
        return writer % self.num_shards

    def _stored(self, frame: np.ndarray) -> np.ndarray:
        return frame.reshape(-1)  # a flat row, as the device keeps it

    def _ring_of(self, writer: int) -> FrameRing:
        return self._shards[self.shard_of(writer)]

    def _after_add(self, shard: FrameRing) -> None:
        self.steps_added += 1
        if shard.staged_steps >= MAX_STAGED_STEPS and not self._compiling.is_alive():
            self._flush_locked()

    def flush(self) -> int:
        """Applies the staged writes on the devices; returns the transitions made visible."""
        self._compiling.join()  # its programs are the ones called now (writers go on meanwhile)
        with self._lock:
            return self._flush_locked()

    def _padded_arrays(self, staged: list[tuple[dict, dict]]) -> tuple:
        """The staged writes of every shard as fixed-size arrays on the devices (rows past
        a shard's writes carry out-of-range indices, which the scatter drops)."""
        spec = self.spec
        # One size for frames and rows: the few programs `_compile_ahead` made serve all.
        k_frames = k_rows = _bucket(max(max(len(f), len(r)) for f, r in staged))
        d = self.num_shards
        frame_slots = np.full((d, k_frames), self._frame_capacity, np.int32)  # dropped
        frames = np.zeros((d, k_frames, spec.frame_nbytes), np.uint8)
        positions = np.full((d, k_rows), spec.capacity, np.int32)  # dropped
        rows = {
            "slots": np.zeros((d, k_rows, spec.window), np.int32),
            **index_leaves(spec, (d, k_rows), np.zeros),
        }
        for i, (staged_frames, staged_rows) in enumerate(staged):
            if staged_frames:
                frame_slots[i, : len(staged_frames)] = list(staged_frames)
                frames[i, : len(staged_frames)] = np.stack(list(staged_frames.values()))
            for j, (position, (row, action, reward, discount, extras)) in enumerate(
                staged_rows.items()
            ):
                positions[i, j] = position
                rows["slots"][i, j] = row
                rows["action"][i, j] = action
                rows["reward"][i, j] = reward
                rows["discount"][i, j] = discount
                if spec.extras != ():
                    jax.tree_util.tree_map(
                        lambda out, value, j=j, i=i: out.__setitem__((i, j), value),
                        rows["extras"],
                        extras,
                    )
        # One transfer call for every array of the insert.
        return jax.device_put((frame_slots, frames, positions, rows), self._sharded)

    def _flush_locked(self) -> int:
        """Inserts what the shards staged. The staged writes stay until the insert is in
        place, and a Ctrl-C in the main thread (`main.py`'s) waits for its end: cut before,
        the rows the host already counts were dropped, and the store kept live transitions
        whose frames were never written; cut between the donating insert and the
        assignment, the store's arrays were gone."""
        staged = [(shard.staged_frames, shard.staged_rows) for shard in self._shards]
        if not any(frames or rows for frames, rows in staged):
            return 0
        with stop_deferred("the replay's insert ends"):
            self._state = self._insert(self._state, *self._padded_arrays(staged))
            for shard in self._shards:
                shard.clear_staged()
        for i, shard in enumerate(self._shards):
            self._visible[0, i] = (shard.head - shard.size) % self.spec.capacity
            self._visible[1, i] = shard.size
        made = sum(len(rows) for _, rows in staged)
        self.inserted += made
        if self._on_visible is not None and made:
            self._on_visible(made)
        return made

    # -- reading -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Transitions sampling can return now (all shards)."""
        with self._lock:
            return int(self._visible[1].sum())

    def shard_sizes(self) -> list[int]:
        """Transitions each shard holds (written, flushed or not)."""
        with self._lock:
            return [shard.size for shard in self._shards]

    def ready(self) -> bool:
        """Whether every shard has a transition to sample (after a flush)."""
        with self._lock:
            return bool((self._visible[1] > 0).all())

    def sample(
        self, key: jax.Array, step: int | None = None, *, flush: bool = True
    ) -> FrameTransition:
        """A uniform batch of `spec.batch_size` transitions, on the devices (split over the
        shards along the batch axis, as a data-parallel update wants it). Flushes first.

        The draw uses `key` folded with `step` (default: the batches sampled so far) and the
        shard's index, inside the jitted gather: no key handling on the host. `flush=False`
        samples what earlier flushes made visible (a writer that flushes by itself)."""
        self._compiling.join()
        with self._lock:
            if flush:
                self._flush_locked()
            if not (self._visible[1] > 0).all():
                raise RuntimeError("frame store: sample() before every shard has a transition")
            # A copy: jax 0.4.30's CPU client aliases a NumPy array it is given (the device
            # value follows later writes to it), and `_visible` changes at every flush.
            visible = jax.device_put(self._visible.copy(), self._replicated)
            step = self.sampled_batches if step is None else step
            batch = self._sample(self._state, visible, key, np.int32(step))
            self.sampled_batches += 1
        return batch

    def transitions_at(self, shard: int = 0) -> FrameTransition:
        """Every live transition of one shard, oldest first, on the host (for tests and
        checks; the store's whole index and the frames it points at)."""
        with self._lock:
            self._flush_locked()
            tail, size = (int(v) for v in self._visible[:, shard])
            positions = (tail + np.arange(size)) % self.spec.capacity
            state = jax.tree_util.tree_map(lambda a: np.asarray(a[shard]), self._state)
        slots = state["slots"][positions]
        frames = state["frames"][slots]
        return FrameTransition(
            frames=frames.reshape(size, self.spec.window, *self.spec.frame_shape),
            action=state["action"][positions],
            reward=state["reward"][positions],
            discount=state["discount"][positions],
            extras=jax.tree_util.tree_map(lambda a: a[positions], state["extras"]),
        )

    # -- checkpoints ---------------------------------------------------------------------
    @contextlib.contextmanager
    def holding_writes(self) -> Iterator[None]:
        """Holds every flush and sample (other threads') until the block ends.

        What `save()` returns is the store's own device arrays, and the next insert donates
        them (deleted, not copied: the store is most of the device's memory). A checkpoint
        writes them inside this block: saved after it, a flush by the drain thread in
        between made the save fail ("Array has been deleted") and lost that checkpoint.
        """
        with self._lock:
            yield

    def save(self) -> dict[str, Any]:
        """The store as a pytree of arrays (device arrays and the host's ring): valid until
        the next write, so written inside `holding_writes()` where writers run."""
        with self._lock:
            self._flush_locked()
            return {
                "device": self._state,
                "rows": np.stack([shard.rows for shard in self._shards]),
                "head": np.asarray([shard.head for shard in self._shards], np.int64),
                "size": np.asarray([shard.size for shard in self._shards], np.int64),
                "counts": np.asarray(
                    [self.inserted, self.sampled_batches, self.steps_added], np.int64
                ),
            }

    def restore(self, saved: dict[str, Any]) -> None:
        """Takes what `save()` returned (same spec, writers and devices)."""
        with self._lock:
            state = jax.tree_util.tree_map(
                lambda target, value: jax.device_put(np.asarray(value), target.sharding),
                self._state,
                saved["device"],
            )
            for i, shard in enumerate(self._shards):
                shard.restore(saved["rows"][i], saved["head"][i], saved["size"][i])
                self._visible[0, i] = (shard.head - shard.size) % self.spec.capacity
                self._visible[1, i] = shard.size
            self._state = state
            self.inserted, self.sampled_batches, self.steps_added = (
                int(v) for v in saved["counts"]
            )


class StoreAdder:
    """An Acme-style adder writing one environment's steps straight into a `DeviceFrameStore`
    (the single-process runner's: no Reverb, no TensorFlow).

    Takes the stacked observations the environment gives and stores the newest frame of each
    (`frame_window.NewestFrames` checks the stacking).
    """

    def __init__(self, store: DeviceFrameStore, writer: int, *, check_stacking: bool = True):
        spec = store.spec
        self._store = store
        self._writer = writer
        self._frames = NewestFrames(
            frame_stack=spec.frame_stack, channels=spec.frame_shape[-1], check=check_stacking
        )

    def add_first(self, timestep: Any) -> None:
        if not timestep.first():
            raise ValueError("add_first needs the first timestep of an episode.")
        self._store.add_first(self._writer, self._frames.first(timestep.observation))

    def add(self, action: Any, next_timestep: Any, extras: Any = ()) -> None:
        self._store.add(
            self._writer,
            self._frames.next(next_timestep.observation),
            action,
            next_timestep.reward,
            next_timestep.discount,
            last=next_timestep.last(),
            extras=extras,
        )

    def reset(self) -> None:
        self._frames.reset()

    def close(self) -> None:
        self._store.flush()


class DeviceReplayIterator(StoreBatches):
    """The learner's batches from a `DeviceFrameStore`: each `next()` waits for the replay
    ratio (`RatioGate`, when given) and returns a batch already on the learner's devices.

    `on_device` tells `JaxLearner` that no prefetch thread or copy is needed: the gather is
    dispatched asynchronously and runs just before the update that consumes it.
    """

    on_device = True

    def __init__(
        self,
        store: DeviceFrameStore,
        key: jax.Array,
        *,
        gate: Any = None,
        failure: Callable[[], BaseException | None] = lambda: None,
    ):
        """Creates the iterator: `key` is the sampling key (folded with the batch index on
        the device); the rest as `StoreBatches`'."""
        super().__init__(store, gate=gate, failure=failure)
        self._key = key

    @property
    def batch_sharding(self) -> jax.sharding.Sharding:
        """Where the batches live (`JaxLearner` compiles its update ahead for them)."""
        return self._store.batch_sharding

    def _sample(self, flush: bool) -> FrameTransition:
        # With a gate, the drain applies its writes every DRAIN_FLUSH_STEPS (64) steps: an
        # insert per batch cost the learner's host more than the rest of sampling together.
        return self._store.sample(self._key, flush=flush)
