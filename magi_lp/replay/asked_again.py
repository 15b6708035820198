"""Calls asked twice: what a served table remembers so that a repeat changes nothing.

An engine may ask a call again whose answer it lost: Ray's client does, for up to 30 s, when
the replay node is unreachable for a moment (`magi_lp.engines.ray_nodes.answer_through_blips`;
Ray says such a call "may or may not have been executed"). So a served table's calls that
change it name who asks and where they are:

- an insert names its `sender` and `offset`, the items of that sender the table took before
  this call (the sum of its earlier answers). `SenderPlaces` keeps each sender's count: a
  call asked again finds its first items taken already, and takes only the rest;
- a take names its `taker` and `ask` number. `LastAnswers` keeps each taker's last answer
  until its next take: a take asked again gets the same items, even while the first asking
  still waits for them.

Neither holds a lock of its own: the table calls them under the lock that guards its items.
Imports nothing but the standard library: it runs in any node process.
"""

from __future__ import annotations

import uuid
from typing import Any


def caller_name(kind: str) -> str:
    """A name for one sender or taker, unique across the program's processes ("sender-1f0c...")."""
    return f"{kind}-{uuid.uuid4().hex[:12]}"


IN_FLIGHT = object()
"""`LastAnswers`' mark of a take still being answered."""


class SenderPlaces:
    """How many items a table took from each sender."""

    def __init__(self, table: str):
        self._table = table  # for the error
        self._took: dict[str, int] = {}

    def taken_of(self, sender: str, offset: int, count: int) -> int:
        """How many of a call's `count` items, which start at `sender`'s item `offset`, the
        table has already (0 for a first asking; more where the call is asked again).

        Raises:
          ValueError: `offset` is past what the table took from `sender` (items went missing).
        """
        had = self._took.get(sender, 0)
        if offset > had:
            raise ValueError(
                f"{self._table}: a call of {sender} starts at its item {offset}, but the table "
                f"took only {had} of its items: the ones between never came"
            )
        return min(had - offset, count)

    def took(self, sender: str, offset: int, taken: int) -> None:
        """Records that the table has the first `taken` items of `sender`'s call at `offset`."""
        self._took[sender] = max(self._took.get(sender, 0), offset + taken)


class LastAnswers:
    """Each taker's last take: its number and its answer (`IN_FLIGHT` while answered)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, Any]] = {}

    @staticmethod
    def check(ask: int) -> None:
        if int(ask) < 1:
            raise ValueError(f"a take's ask number counts from 1, got {ask}")

    def in_flight(self, taker: str, ask: int) -> bool:
        """Whether `taker`'s take number `ask` is being answered (by its first asking)."""
        last = self._last.get(taker)
        return last is not None and last[0] == ask and last[1] is IN_FLIGHT

    def answered(self, taker: str, ask: int) -> tuple[bool, Any]:
        """(True, the answer) where `taker`'s take `ask` was answered; else (False, None)."""
        last = self._last.get(taker)
        if last is not None and last[0] == ask and last[1] is not IN_FLIGHT:
            return True, last[1]
        return False, None

    def begin(self, taker: str, ask: int) -> None:
        """Marks `taker`'s take `ask` as being answered (its previous answer is let go)."""
        self._last[taker] = (ask, IN_FLIGHT)

    def end(self, taker: str, ask: int, answer: Any) -> None:
        """Keeps `answer` for a take `ask` asked again; None (nothing handed out): a take asked
        again takes anew."""
        if answer is None:
            self._last.pop(taker, None)
        else:
            self._last[taker] = (ask, answer)
