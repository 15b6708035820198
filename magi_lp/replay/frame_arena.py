"""Variable-length frames (zstd's output) in one fixed-size byte array, written as a log.

Why fixed: the compressed host store (`magi_lp.replay.compressed_frames`) must take no more
host memory than the plan counted. So the frames live in one uint8 array of `nbytes`, and a
frame row's bytes are at [offset[row], offset[row] + length[row]). A checkpoint writes only
the bytes up to the high-water mark (`high`: all of them once the log has wrapped), and a
restore copies them into the start of the fixed array.

Frames are appended at the write position and wrap to the start; the space is taken back in
the order it was written (the oldest frames first, as the transition ring evicts them). Where
the oldest written frame is still held (`refs[row] > 0`), `free(row)` is asked to let it go
(the store evicts its oldest transitions, or ends an open episode that holds it): a full
arena evicts early, as a device store short of frame rows does. A row written again has a
newer generation; its old bytes in the log are then stale and skipped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np

from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError


class FrameArena:
    """Frames by row in one byte array. The caller holds the store's lock."""

    def __init__(self, nbytes: int, rows: int):
        """An empty arena of `nbytes` bytes for frame rows [0, rows)."""
        self.data = np.zeros(int(nbytes), np.uint8)
        self.offset = np.zeros(rows, np.int64)
        self.length = np.zeros(rows, np.int64)  # 0: the row holds no bytes here
        self._generation = np.zeros(rows, np.int64)
        self._log: collections.deque[tuple[int, int, int]] = collections.deque()  # row, gen, off
        self.write = 0
        self.high = 0
        """The end of the furthest bytes ever written: none lie past it (`in_use`)."""
        self.used = 0
        """Bytes of the rows that hold bytes (their frames, live or freed but not yet reused)."""

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def in_use(self) -> np.ndarray:
        """The bytes up to the high-water mark (a view: valid until the next write), what a
        checkpoint writes; the rest of the array has never been written. At least one byte:
        orbax cannot write an empty array."""
        return self.data[: max(1, self.high)]

    def put(self, row: int, blob: bytes, refs: np.ndarray, free: Callable[[int], None]) -> None:
        """Writes `blob` as row `row`'s bytes, taking back the oldest space first (`refs`:
        what holds each row; `free(row)` makes a held row's count 0)."""
        size = len(blob)
        if size > self.nbytes:
            raise ValueError(f"frame arena: a frame of {size} bytes, the arena holds {self.nbytes}")
        self.drop(row)
        at = self._room(size, refs, free)
        self.data[at : at + size] = np.frombuffer(blob, np.uint8)
        self._generation[row] += 1
        self.offset[row], self.length[row] = at, size
        self._log.append((row, int(self._generation[row]), at))
        self.write = at + size
        self.high = max(self.high, self.write)
        self.used += size

    def drop(self, row: int) -> None:
        """Forgets row `row`'s bytes (its space is taken back when the log reaches it)."""
        if self.length[row]:
            self.used -= int(self.length[row])
            self.length[row] = 0
            self._generation[row] += 1

    def _room(self, size: int, refs: np.ndarray, free: Callable[[int], None]) -> int:
        """Where `size` contiguous free bytes start, after the write position."""
        while True:
            if not self._log:
                return 0
            row, generation, at = self._log[0]
            if generation != self._generation[row]:  # written again, or dropped
                self._log.popleft()
                continue
            if refs[row] == 0:  # freed by the ring: its bytes go now
                self.drop(row)
                self._log.popleft()
                continue
            if at >= self.write:
                if at - self.write >= size:
                    return self.write
            elif self.nbytes - self.write >= size:
                return self.write
            elif at >= size:
                return 0
            free(row)  # the oldest frame is held: let it go, then look again

    def frame(self, row: int) -> bytes:
        """Row `row`'s bytes (a copy: the space may be written again later)."""
        at = int(self.offset[row])
        return self.data[at : at + int(self.length[row])].tobytes()

    def restore(self, data: np.ndarray, offset: np.ndarray, length: np.ndarray, write: int) -> None:
        """Takes a saved arena (`data`: its bytes up to its high-water mark, or all of them;
        rows' `offset` and `length`; the write position), copied into the start of this one.

        Raises:
          ConfigError: `data` is longer than this arena (saved with another replay size).
        """
        data = np.asarray(data, np.uint8).reshape(-1)
        if len(data) > self.nbytes:
            raise ConfigError(
                fact_refusal(
                    f"the replay checkpoint's frame arena holds {len(data)} bytes, this "
                    f"store's {self.nbytes}",
                    "it was saved with another replay size",
                    "relaunch with the config it was saved with, or use a new --workdir",
                )
            )
        self.data[: len(data)] = data
        self.high = len(data)
        self.offset[:] = offset
        self.length[:] = length
        self._generation[:] = 0
        self.write = int(write)
        held = np.flatnonzero(self.length)
        # The log's order: the oldest bytes start right after the write position.
        held = held[np.argsort((self.offset[held] - self.write) % max(1, self.nbytes))]
        self._log = collections.deque((int(r), 0, int(self.offset[r])) for r in held)
        self.used = int(self.length.sum())
