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

Pure numpy: no JAX, no lock (the caller holds the store's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

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

    def close(self, writer: int) -> None:
        """Ends writer `writer`'s open episode (its later steps need a new first step)."""
        self._close(writer)

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

    def add_first(self, writer: int, frame: np.ndarray) -> None:
        self._close(writer)  # an episode cut short without its last step
        slot = self._allocate(frame)
        self.refs[slot] += self.spec.frame_stack
        self.writers[writer] = OpenEpisode([slot] * self.spec.frame_stack)

    def add(
        self,
        writer: int,
        frame: np.ndarray,
        action: Any,
        reward: Any,
        discount: Any,
        extras: Any,
        last: bool,
    ) -> int:
        """Records one step; returns the transitions it completed (0 or 1)."""
        state = self.writers.get(writer)
        if state is None:
            raise ValueError(f"writer {writer}: add() before add_first()")
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
        self.writers = {}
        self.staged_frames, self.staged_rows = {}, {}
        self.refs[:] = 0
        positions = (self.head - self.size + np.arange(self.size)) % self.spec.capacity
        np.add.at(self.refs, self.rows[positions].reshape(-1), 1)
        free = np.flatnonzero(self.refs == 0).astype(np.int32)[::-1]
        self.num_free = len(free)
        self.free[: self.num_free] = free
