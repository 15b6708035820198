"""A pixel replay in the learner's host memory: each frame once, zstd-compressed.

Where the learner's device has no room for the device store (`magi_lp.replay.frame_store`:
1M transitions of 84x84x3 frames are 21.9 GB), the frames stay in host memory, each
compressed on its own with zstd (the `zstandard` bindings; a reacher frame at 84x84 takes
about 4.8 KB of its 21.2 KB). The index is the device store's (`magi_lp.replay.frame_ring`:
unique frame rows, an n-step transition ring, FIFO eviction, the same n-step returns), so
both stores hold the same transitions for the same steps, bit for bit.

    arena     uint8   [A]             each frame row's zstd frame, end to end, written as a
                                      log (`magi_lp.replay.frame_arena`): A is fixed, so the
                                      store takes what the plan counted and no more
    slots     int32   [N, S + n]      each transition's window of frame rows, oldest first
    action, reward, discount, extras  [N, ...] as in the device store

A batch is drawn uniformly over the live transitions and its frames decompressed into one
uint8 array [B, S + n, H, W, C] (a frame shared by two windows of the batch is decompressed
once). The learner samples on its prefetch thread (`magi_lp.agent.prefetch`), so sampling and
decompression overlap the update; the store's lock is held only while the batch's blobs are
picked, and zstd releases the GIL, so the drain thread (which compresses before it takes the
lock) and the update go on meanwhile.

Imports no JAX, no Reverb and no TensorFlow.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tree
import zstandard

from magi_lp.replay.frame_arena import FrameArena
from magi_lp.replay.frame_ring import FrameRing, FrameRingStore, StoreBatches, index_leaves
from magi_lp.replay.frame_window import FrameTransition
from magi_lp.replay.spec import FrameReplaySpec

ZSTD_LEVEL = 3
"""zstd's level: on reacher's 84x84 frames level 3 took 4.8 KB a frame at ~50 us to compress
(level 1: 5.0 KB, 64 us; level 6: 4.2 KB, 130 us); decompression costs about the same at
every level."""

COMPRESSED_SHARE = 0.25
"""What the plan expects a frame to take, as a share of its raw bytes, before any frame is
stored (reacher's measured 0.23, rounded up). Frames with more texture take more: the store's
`info()` gives what it holds."""

ROW_BYTES = 32
"""Host bytes per frame row beside its frame: its offset, length and generation in the arena,
its count and free-list entry in the ring."""


def arena_nbytes(spec: FrameReplaySpec, writers: int = 1) -> int:
    """The arena's bytes: `COMPRESSED_SHARE` of every frame row, and at least room for every
    writer's open window of frames that did not compress at all."""
    worst = spec.frame_nbytes + spec.frame_nbytes // 128 + 512  # zstd's bound, rounded up
    share = int(spec.frame_nbytes * COMPRESSED_SHARE)
    return max(spec.frame_capacity(writers) * share, (max(1, writers) * spec.window + 1) * worst)


def estimated_nbytes(spec: FrameReplaySpec, writers: int = 1) -> int:
    """Host bytes the compressed store of `spec` takes when full (the plan's figure): its
    arena, its frame rows' bookkeeping and the transition index."""
    rows = spec.frame_capacity(writers) * ROW_BYTES
    return arena_nbytes(spec, writers) + rows + spec.capacity * spec.index_nbytes()


class CompressedFrameStore(FrameRingStore):
    """The compressed host store: one `FrameRing` of zstd frames and the transition index.

    Thread-safe: writers (`add_first` / `add`, from the drain thread or the acting loop) and
    the sampler (`sample`, from the learner's prefetch thread) share one lock. A write is
    visible to `sample` as soon as `add` returns (`flush` has nothing to apply).
    """

    def __init__(
        self,
        spec: FrameReplaySpec,
        *,
        writers: int = 1,
        seed: int = 0,
        arena_bytes: int | None = None,
    ):
        """Creates an empty store.

        Args:
          spec: what is stored.
          writers: how many writers (adders) write at once: frame rows are reserved for
            their open windows.
          seed: seeds the sampling (each batch draws from the store's own generator).
          arena_bytes: bytes for the compressed frames (default `arena_nbytes`): frames that
            compress worse than expected make the store evict its oldest transitions early.
        """
        self.spec = spec
        self.writers = writers
        self._lock = threading.RLock()  # re-entered by save() inside holding_writes()
        self._ring = FrameRing(spec, spec.frame_capacity(writers))
        size = arena_nbytes(spec, writers) if arena_bytes is None else int(arena_bytes)
        self._arena = FrameArena(size, self._ring.frame_capacity)
        self.evicted_early = 0
        """Transitions evicted before the ring was full, to take back arena space."""
        self._index = index_leaves(spec, (spec.capacity,), np.zeros)
        self._rng = np.random.default_rng(seed)
        self._compress = threading.local()  # a zstd context is not thread-safe
        self.sampled_batches = 0
        self.inserted = 0
        """Transitions made visible to sampling since the store was made (or restored)."""
        self.steps_added = 0
        """Steps (frames) written, episode starts included."""

    # -- writing (`add_first`, `add`, `in_episode`: `FrameRingStore`'s) --------------------
    def _stored(self, frame: np.ndarray) -> bytes:
        """The frame's zstd bytes (compressed outside the lock: the sampler goes on)."""
        context = getattr(self._compress, "context", None)
        if context is None:
            context = self._compress.context = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        return context.compress(np.ascontiguousarray(frame).data)

    def _ring_of(self, writer: int) -> FrameRing:
        return self._ring

    def _after_add(self, ring: FrameRing) -> None:
        """Moves what the ring staged into the arrays (the caller holds the lock)."""
        index = self._index
        for row, blob in ring.staged_frames.items():
            self._arena.put(row, blob, ring.refs, self._free)
        for position, (_, action, reward, discount, extras) in ring.staged_rows.items():
            index["action"][position] = action
            index["reward"][position] = reward
            index["discount"][position] = discount
            if self.spec.extras != ():
                for out, value in zip(
                    tree.flatten(index["extras"]), tree.flatten(extras), strict=True
                ):
                    out[position] = value
        self.inserted += len(ring.staged_rows)
        self.steps_added += len(ring.staged_frames)
        ring.clear_staged()

    def _free(self, row: int) -> None:
        """Lets go of frame row `row`, the oldest in the arena, to take its space back: ends
        an open episode that still holds it (a writer stalled for a whole arena of frames),
        then evicts the oldest transitions until none holds it."""
        ring = self._ring
        for writer, episode in list(ring.writers.items()):
            if row in episode.window:
                ring.cut_short(writer)
        while ring.refs[row] > 0 and ring.size > 0:
            ring.evict_oldest()
            self.evicted_early += 1
        if ring.refs[row] > 0:  # held by a staged transition's window: cannot happen
            raise RuntimeError(f"frame store: frame row {row} is held by no transition")

    def flush(self) -> int:
        """Nothing to apply: every write is visible when it returns (the device store's
        interface, which the drain and the adders call)."""
        return 0

    # -- reading -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Transitions sampling can return now."""
        with self._lock:
            return self._ring.size

    def ready(self) -> bool:
        """Whether there is a transition to sample."""
        return self.size > 0

    def info(self) -> dict[str, Any]:
        """The store's numbers for the status view: its host bytes, the compressed frames'
        bytes, and the transitions evicted early for arena space."""
        with self._lock:
            return {
                "replay_host_bytes": self.nbytes(),
                "replay_frame_bytes": self._arena.used,
                "replay_evicted_early": self.evicted_early,
            }

    def nbytes(self) -> int:
        """Host bytes the store takes: its arena (all of it, once written round), its rows'
        bookkeeping and its index arrays."""
        index = sum(a.nbytes for a in tree.flatten(self._index)) + self._ring.rows.nbytes
        return self._arena.nbytes + self._ring.frame_capacity * ROW_BYTES + index

    def _pick(self, positions: np.ndarray | None) -> tuple[dict, np.ndarray, dict[str, Any]]:
        """(each frame row's zstd bytes, the windows' rows, oldest first, the index rows) of
        `positions` (default: a uniform draw of a batch), under the lock."""
        with self._lock:
            ring = self._ring
            if ring.size == 0:
                raise RuntimeError("frame store: sample() before it holds a transition")
            if positions is None:
                offsets = self._rng.integers(0, ring.size, self.spec.batch_size)
                positions = (ring.head - ring.size + offsets) % self.spec.capacity
                self.sampled_batches += 1
            rows = ring.rows[positions]
            # Copies: a row's space may be written again once the lock is let go.
            blobs = {row: self._arena.frame(row) for row in np.unique(rows).tolist()}
            picked = tree.map_structure(lambda a: a[positions], self._index)
        return blobs, rows, picked

    def _transitions(self, positions: np.ndarray | None = None) -> FrameTransition:
        blobs, rows, picked = self._pick(positions)
        spec = self.spec
        flat = rows.reshape(-1).tolist()
        frames = np.empty((len(flat), spec.frame_nbytes), np.uint8)
        context = zstandard.ZstdDecompressor()
        first: dict[int, int] = {}
        for i, row in enumerate(flat):
            seen = first.setdefault(row, i)
            if seen == i:  # straight into the batch: no frame-sized copy in between
                context.stream_reader(blobs[row]).readinto(memoryview(frames[i]))
            else:  # the same frame in another window of this batch
                frames[i] = frames[seen]
        return FrameTransition(
            frames=frames.reshape(len(rows), spec.window, *spec.frame_shape),
            action=picked["action"],
            reward=picked["reward"],
            discount=picked["discount"],
            extras=picked["extras"],
        )

    def sample(self, key: Any = None) -> FrameTransition:
        """A uniform batch of `spec.batch_size` live transitions, as numpy arrays on the
        host (the learner's prefetcher puts it on the device). `key` (a JAX PRNG key's
        data) reseeds the draw; by default the store's generator goes on."""
        if key is not None:
            self._rng = np.random.default_rng(np.asarray(key).astype(np.uint32).tolist())
        return self._transitions()

    def transitions_at(self, shard: int = 0) -> FrameTransition:
        """Every live transition, oldest first (for tests and checks; one shard: 0)."""
        del shard
        with self._lock:
            ring = self._ring
            positions = (ring.head - ring.size + np.arange(ring.size)) % self.spec.capacity
        return self._transitions(positions)

    # -- checkpoints ---------------------------------------------------------------------
    @contextlib.contextmanager
    def holding_writes(self) -> Iterator[None]:
        """Holds every write and sample (other threads') until the block ends."""
        with self._lock:
            yield

    def save(self) -> dict[str, Any]:
        """The store as a pytree of numpy arrays: the arena's bytes up to its high-water mark
        (a view of the arena, valid until the next write, so written inside
        `holding_writes()` where writers run; the whole arena once it has wrapped), where
        each row's bytes are, the ring and the index. Every array but the arena has the same
        shape at every save: a restore reads the saved shapes (`restore_target`)."""
        with self._lock:
            ring, arena = self._ring, self._arena
            return {
                "arena": arena.in_use,
                "offset": arena.offset.copy(),
                "length": np.where(ring.refs > 0, arena.length, 0),
                "rows": ring.rows.copy(),
                "ring": np.asarray([ring.head, ring.size, arena.write], np.int64),
                "index": tree.map_structure(np.copy, self._index),
                "counts": np.asarray(
                    [self.inserted, self.sampled_batches, self.steps_added], np.int64
                ),
            }

    def restore_target(self) -> None:
        """What a checkpoint of `save()` is restored into: None, the saved shapes as they are
        (the arena's length is the bytes it held; `Checkpointer.restore(None)`)."""
        return None

    def restore(self, saved: dict[str, Any]) -> None:
        """Takes what `save()` returned (same spec and writers; an arena up to this one's
        size), or a checkpoint of it restored with the saved shapes (`restore_target`).

        Raises:
          ConfigError: the saved arena is longer than this store's (another replay size).
        """
        index = saved["index"]
        with self._lock:
            head, size, write = (int(v) for v in np.asarray(saved["ring"]))
            self._ring.restore(saved["rows"], head, size)
            self._arena.restore(saved["arena"], saved["offset"], saved["length"], write)
            for name in ("action", "reward", "discount"):
                self._index[name][:] = np.asarray(index[name])
            for out, value in zip(
                tree.flatten(self._index["extras"]),
                _in_order_of(self._index["extras"], index.get("extras")),
                strict=True,
            ):
                out[:] = np.asarray(value)
            self.inserted, self.sampled_batches, self.steps_added = (
                int(v) for v in np.asarray(saved["counts"])
            )


def _in_order_of(like: Any, saved: Any) -> list[Any]:
    """`saved`'s leaves in `tree.flatten(like)`'s order. Restored with the saved shapes
    (no target), a namedtuple comes back as a dict of its fields or a list, a tuple as a
    list, an empty structure as None."""
    if not tree.is_nested(like):
        return [saved]
    if saved is None and not tree.flatten(like):
        return []
    if isinstance(like, Mapping):
        keys: Sequence[Any] = sorted(like)
        parts = [like[k] for k in keys]
    elif hasattr(like, "_fields") and isinstance(saved, Mapping):
        keys, parts = like._fields, list(like)
    else:
        return [x for a, b in zip(like, saved, strict=True) for x in _in_order_of(a, b)]
    return [x for k, a in zip(keys, parts, strict=True) for x in _in_order_of(a, saved[k])]


class HostReplayIterator(StoreBatches):
    """The learner's batches from a `CompressedFrameStore`: each `next()` waits for the
    replay ratio (`RatioGate`, when given), then samples and decompresses a batch on the
    host. Not `on_device`: `JaxLearner` calls it from its prefetch thread, off the update's."""

    def _sample(self, flush: bool) -> FrameTransition:
        del flush  # every write is visible when it returns
        return self._store.sample()
