"""An evaluator's log rows grouped into evaluations, by each row's evaluation point.

Each evaluation episode's row carries `evaluation_at` (the point it was due at: a multiple of
`evaluation.every_actor_steps`, or the limit) and `evaluation_episode` (1, 2, ... within one
attempt; `ActingLoop.start_evaluation`). A stop that cuts an evaluation leaves a short
attempt, and the relaunch evaluates that point again from episode 1: the evaluation at a
point is its last whole attempt (the last attempt, short, when none is whole; a relaunch
exactly at a point it had evaluated evaluates it again, and a stop may cut that). The point
names the evaluation; its rows' `actor_steps` place it on a curve (a distributed relaunch's
attempt evaluates the relaunch's parameters). Rows written before these columns existed are
grouped in runs of `episodes`, as they come.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation: its point (None for untagged rows), its rows, and whether whole."""

    at: int | None
    rows: tuple[Mapping[str, Any], ...]
    complete: bool

    @property
    def actor_steps(self) -> int:
        """Where it goes on a curve: the counts when its first episode ended, never before its
        point. A relaunch evaluates a point a stop cut before the counter has its counts
        back, and that row says 0 or nothing (so does `main.py`'s first, at 0)."""
        return max(self.at or 0, integer(self.rows[0].get("actor_steps")) or 0)


def number(value: Any) -> float | None:
    """A log's CSV cell as a number; None when it is empty, missing or not one (a row that a
    kill cut short, a column an older log lacks)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def integer(value: Any) -> int | None:
    """A log's CSV cell as a whole number (truncated); None as `number`, and for NaN or an
    infinity."""
    found = number(value)
    try:
        return None if found is None else int(found)
    except (ValueError, OverflowError):
        return None


def group_evaluations(rows: Iterable[Mapping[str, Any]], episodes: int) -> list[Evaluation]:
    """`rows` (an evaluator's CSV rows, in file order) as evaluations, in order of their
    last attempt; `episodes`: `evaluation.episodes`, what makes one whole."""
    per = max(1, int(episodes))
    attempts: list[tuple[int | None, list[Mapping[str, Any]]]] = []
    for row in rows:
        at, index = integer(row.get("evaluation_at")), integer(row.get("evaluation_episode"))
        if at is None or index is None:  # an older log: runs of `per` rows
            last = attempts[-1] if attempts else None
            if last is None or last[0] is not None or len(last[1]) >= per:
                attempts.append((None, []))
        elif index == 1 or not attempts or attempts[-1][0] != at:
            attempts.append((at, []))
        attempts[-1][1].append(row)
    chosen: dict[Any, int] = {}  # point -> its last whole attempt, else its last one
    for i, (at, group) in enumerate(attempts):
        if at is None:
            continue
        kept = chosen.get(at)
        if kept is None or len(group) >= per or len(attempts[kept][1]) < per:
            chosen[at] = i
    return [
        Evaluation(at, tuple(group), len(group) >= per)
        for i, (at, group) in enumerate(attempts)
        if at is None or chosen[at] == i
    ]
