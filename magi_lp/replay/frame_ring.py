"""The host's bookkeeping of a frame replay: unique frame rows + an n-step transition ring.

Shared by the frame stores (`magi_lp.replay.frame_store.DeviceFrameStore`, one ring per
device shard; `magi_lp.replay.compressed_frames.CompressedFrameStore`, one ring in host
memory): which frame row a new frame takes, which transitions are live (positions
[head - size, head) mod capacity, the oldest evicted first, as the Reverb table's FIFO
remover), each transition's window of frame rows, and the n-step return.

A row is reused only when no live transition and no writer's open window points at it
(`refs`), so a frame is never overwritten while it can be sampled. A new frame and a new
transition are staged (`staged_frames`: row -> the frame as the store keeps it;
`staged_rows`: position -> (rows, action, reward, discount, extras)) until the store applies
them. The ring never looks at a frame: a store may stage raw pixels or compressed bytes.

`FrameRingStore` is the writing side both stores share (`add_first`, `add`, `in_episode`
over their rings, under the store's lock), `index_leaves` the per-transition arrays both
keep, and `StoreBatches` the learner's side (batches at the replay ratio).

Pure numpy: no JAX, no lock (the caller holds the store's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import tree

from magi_lp.replay.spec import FrameReplaySpec


def n_step_return(
    rewards: np.ndarray, discounts: np.ndarray, gamma: float
) -> tuple[np.float32, np.float32]:
    """(sum_k w_k r_k, prod_k gamma d_k) with w = exclusive cumprod of gamma d, in float32.

    The same operations in the same order as `frame_replay.window_to_frame_transition`
    (TF, float32), so both stores give bit-identical returns.
    """
    step_discounts = np.float32(gamma) * np.asarray(discounts, np.float32)
    weight = np.float32(1.0)
    total = np.float32(0.0)
    for reward, step_discount in zip(np.asarray(rewards, np.float32), step_discounts, strict=True):
        total = np.float32(total + weight * reward)
        weight = np.float32(weight * step_discount)
    return total, weight


def index_leaves(
    spec: FrameReplaySpec, lead: tuple[int, ...], make: Callable[[tuple, Any], Any]
) -> dict[str, Any]:
    """A transition index's arrays besides its frame rows (the action, the n-step reward and
    discount, the extras), each `make(shape, dtype)` with `lead` (the rows: capacity, or
    shards and rows) before its own shape: `np.zeros` for host arrays, `jax.ShapeDtypeStruct`
    for a device layout."""
    return {
        "action": make((*lead, *spec.action_shape), spec.action_dtype),
        "reward": make(lead, np.float32),
        "discount": make(lead, np.float32),
        "extras": tree.map_structure(lambda s: make((*lead, *s.shape), s.dtype), spec.extras),
    }


def checked_frame(spec: FrameReplaySpec, frame: Any) -> np.ndarray:
    """`frame` as an array, refused unless it is uint8 of the spec's [H, W, C]."""
    frame = np.asarray(frame)
    if frame.shape != tuple(spec.frame_shape) or frame.dtype != np.uint8:
        raise ValueError(
            f"frame store: a frame must be uint8 {tuple(spec.frame_shape)}, "
            f"got {frame.dtype} {frame.shape}"
        )
    return frame


class OpenEpisode:
    """One writer's open episode: its window of frame rows and its last steps."""

    __slots__ = ("env_steps", "steps", "window")

    def __init__(self, window: list[int]):
        self.window = window  # frame rows, oldest first
        self.steps: list[tuple] = []  # (action, reward, discount, extras), oldest first
        self.env_steps = 0


class FrameRing:
    """The host's bookkeeping of one shard: which frame rows are free, the transition ring
    (a host copy of every live transition's frame rows), writers' open windows, and the
    writes staged for the next flush. Pure numpy; the caller holds the store's lock."""

    def __init__(self, spec: FrameReplaySpec, frame_capacity: int):
        self.spec = spec
        self.frame_capacity = frame_capacity
        self.refs = np.zeros(frame_capacity, np.int32)
        self.free = np.arange(frame_capacity - 1, -1, -1, dtype=np.int32)  # a stack
        self.num_free = frame_capacity
        self.rows = np.zeros((spec.capacity, spec.window), np.int32)
        self.head = 0  # transitions ever placed; the next goes to head % capacity
        self.size = 0
        self.writers: dict[int, OpenEpisode] = {}
        self.cut: set[int] = set()  # writers whose episode `cut` ended: the rest is dropped
        self.staged_frames: dict[int, np.ndarray] = {}
        self.staged_rows: dict[int, tuple] = {}

    # -- frame rows ----------------------------------------------------------------------
    def _release(self, slots: Any) -> None:
        # A handful of rows per call: plain indexing beats numpy's ufunc.at + unique here.
        refs, free = self.refs, self.free
        for slot in slots:
            refs[slot] -= 1
            if refs[slot] == 0:
                free[self.num_free] = slot
                self.num_free += 1

    def evict_oldest(self) -> None:
        """Drops the oldest live transition (its rows freed where nothing else holds them)."""
        self._evict_oldest()

    def cut_short(self, writer: int) -> None:
        """Ends writer `writer`'s open episode for the store (to take back its frames): its
        later steps are dropped, not refused, until its next first step."""
        self._close(writer)
        self.cut.add(writer)

    def _evict_oldest(self) -> None:
        position = (self.head - self.size) % self.spec.capacity
        self._release(self.rows[position])
        self.size -= 1

    def _allocate(self, frame: np.ndarray) -> int:
        while self.num_free == 0:
            if self.size == 0:
                raise RuntimeError(
                    f"frame store: all {self.frame_capacity} frame rows are held by open "
                    f"episodes of {len(self.writers)} writers; the store was sized for fewer "
                    "writers per shard"
                )
            self._evict_oldest()  # frees rows only its window held; never a live one
        self.num_free -= 1
        slot = int(self.free[self.num_free])
        self.staged_frames[slot] = frame
        return slot

    # -- steps ---------------------------------------------------------------------------
    def _close(self, writer: int) -> None:
        state = self.writers.pop(writer, None)
        if state is not None:
            self._release(state.window)

    def add_first(self, writer: int, frame: Any) -> None:
        self._close(writer)  # an episode cut short without its last step
        self.cut.discard(writer)
        slot = self._allocate(frame)
        self.refs[slot] += self.spec.frame_stack
        self.writers[writer] = OpenEpisode([slot] * self.spec.frame_stack)

    def add(self, writer: int, frame: Any, step: tuple, last: bool) -> int:
        """Records one step, `frame` and `step` = (action, reward, discount, extras); returns
        the transitions it completed (0 or 1)."""
        state = self.writers.get(writer)
        if state is None:
            if writer in self.cut:
                return 0  # the rest of an episode `cut_short` ended
            raise ValueError(f"writer {writer}: add() before add_first()")
        action, reward, discount, extras = step
        slot = self._allocate(frame)
        self.refs[slot] += 1
        state.window.append(slot)
        state.steps.append((action, np.float32(reward), np.float32(discount), extras))
        state.env_steps += 1
        made = 0
        n = self.spec.n_step
        if state.env_steps >= n:
            self._place(state.window[-self.spec.window :], state.steps[-n:])
            made = 1
            # The next transition's window starts one frame later.
            drop = len(state.window) - (self.spec.window - 1)
            if drop > 0:
                self._release(state.window[:drop])
                del state.window[:drop]
            del state.steps[: len(state.steps) - (n - 1)]
        if last:
            self._close(writer)
        return made

    def _place(self, window: list[int], steps: list[tuple]) -> None:
        capacity = self.spec.capacity
        position = self.head % capacity
        if self.size == capacity:
            self._evict_oldest()  # the oldest sits at this very position
        row = np.asarray(window, np.int32)
        self.rows[position] = row
        for slot in window:
            self.refs[slot] += 1
        reward, discount = n_step_return(
            np.array([s[1] for s in steps]), np.array([s[2] for s in steps]), self.spec.discount
        )
        action, extras = steps[0][0], steps[0][3]
        self.staged_rows[position] = (row, action, reward, discount, extras)
        self.head += 1
        self.size += 1

    @property
    def staged_steps(self) -> int:
        return len(self.staged_frames)

    def clear_staged(self) -> None:
        """Drops the staged writes (once they are inserted on the device)."""
        self.staged_frames, self.staged_rows = {}, {}

    # -- checkpoints ---------------------------------------------------------------------
    def restore(self, rows: np.ndarray, head: int, size: int) -> None:
        """Takes the saved ring; open episodes are gone (their writers restart theirs)."""
        self.rows = np.asarray(rows, np.int32).copy()
        self.head, self.size = int(head), int(size)
        self.writers, self.cut = {}, set()
        self.staged_frames, self.staged_rows = {}, {}
        self.refs[:] = 0
        positions = (self.head - self.size + np.arange(self.size)) % self.spec.capacity
        np.add.at(self.refs, self.rows[positions].reshape(-1), 1)
        free = np.flatnonzero(self.refs == 0).astype(np.int32)[::-1]
        self.num_free = len(free)
        self.free[: self.num_free] = free


class FrameRingStore:
    """The writing side of a store indexed by `FrameRing`s (both frame stores): each step
    checked, kept as the store keeps frames, and recorded in its writer's ring under the
    store's lock.

    A store sets `spec` and `_lock` and says how it keeps a frame (`_stored`, called outside
    the lock), which ring a writer writes to (`_ring_of`) and what follows a write in a ring
    (`_after_add`: apply or count what it staged).
    """

    spec: FrameReplaySpec
    _lock: threading.RLock

    def _stored(self, frame: np.ndarray) -> Any:
        """A checked frame as the store keeps it (outside the lock: samplers go on)."""
        raise NotImplementedError

    def _ring_of(self, writer: int) -> FrameRing:
        """The ring writer `writer`'s steps go to."""
        raise NotImplementedError

    def _after_add(self, ring: FrameRing) -> None:
        """Called under the lock after each write to `ring`."""
        raise NotImplementedError

    def add_first(self, writer: int, frame: np.ndarray) -> None:
        """Starts writer `writer`'s episode with its first frame, [H, W, C] uint8."""
        stored = self._stored(checked_frame(self.spec, frame))
        with self._lock:
            ring = self._ring_of(writer)
            ring.add_first(writer, stored)
            self._after_add(ring)

    def add(
        self,
        writer: int,
        frame: np.ndarray,
        action: Any,
        reward: Any,
        discount: Any,
        *,
        last: bool = False,
        extras: Any = (),
    ) -> int:
        """Records writer `writer`'s next step: a_t, then r_t, d_t and the frame it led to.
        Returns the transitions it completed (0 or 1)."""
        stored = self._stored(checked_frame(self.spec, frame))
        step = (np.asarray(action, self.spec.action_dtype), reward, discount, extras)
        with self._lock:
            ring = self._ring_of(writer)
            made = ring.add(writer, stored, step, bool(last))
            self._after_add(ring)
        return made

    def in_episode(self, writer: int) -> bool:
        """Whether writer `writer` has an episode open here (its first step was added)."""
        with self._lock:
            return writer in self._ring_of(writer).writers


class StoreBatches:
    """The learner's batches from a frame store: each `next()` waits for the replay ratio
    (`RatioGate`, when given), raising the writer side's error instead of waiting, then
    samples (`_sample`: the store's own call)."""

    def __init__(
        self,
        store: Any,
        *,
        gate: Any = None,
        failure: Callable[[], BaseException | None] = lambda: None,
    ):
        """Creates the iterator.

        Args:
          store: the store to sample.
          gate: a `magi_lp.replay.schedule.RatioGate`; None samples whenever the store
            has data (the single-process runner interleaves by the schedule itself).
          failure: the writer side's error, if it died (raised here instead of waiting).
        """
        self._store = store
        self._gate = gate
        self._failure = failure

    def __iter__(self) -> StoreBatches:
        return self

    def _ready(self) -> bool:
        error = self._failure()
        if error is not None:
            raise error
        if not self._store.ready():
            self._store.flush()
        return self._store.ready()

    def _sample(self, flush: bool) -> Any:
        """A batch; `flush=False` takes what the writer's own flushes made visible."""
        raise NotImplementedError

    def __next__(self) -> Any:
        if self._gate is None:  # one process: the actor's writes of this very step count
            return self._sample(flush=True)
        if not self._gate.wait_to_sample(self._ready):
            raise StopIteration
        return self._sample(flush=False)
