"""An evaluator's log rows grouped into evaluations: one rule for every reader.

Each evaluation episode's row carries `evaluation_at` (the point it was due at: a multiple of
`evaluation.every_actor_steps`, or the limit) and `evaluation_episode` (1, 2, ... within one
attempt; `ActingLoop.start_evaluation`). A stop that cuts an evaluation leaves a short
attempt, and the relaunch evaluates that point again from episode 1: the last attempt at a
point is the evaluation. Rows written before these columns existed are grouped in runs of
`episodes`, as they come.
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


def _int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def group_evaluations(rows: Iterable[Mapping[str, Any]], episodes: int) -> list[Evaluation]:
    """`rows` (an evaluator's CSV rows, in file order) as evaluations, in order of their
    last attempt; `episodes`: `evaluation.episodes`, what makes one whole."""
    per = max(1, int(episodes))
    attempts: list[tuple[int | None, list[Mapping[str, Any]]]] = []
    for row in rows:
        at, index = _int(row.get("evaluation_at")), _int(row.get("evaluation_episode"))
        if at is None or index is None:  # an older log: runs of `per` rows
            last = attempts[-1] if attempts else None
            if last is None or last[0] is not None or len(last[1]) >= per:
                attempts.append((None, []))
        elif index == 1 or not attempts or attempts[-1][0] != at:
            attempts.append((at, []))
        attempts[-1][1].append(row)
    last_attempt: dict[Any, int] = {}
    for i, (at, _) in enumerate(attempts):
        if at is not None:
            last_attempt[at] = i
    return [
        Evaluation(at, tuple(group), len(group) == per)
        for i, (at, group) in enumerate(attempts)
        if at is None or last_attempt[at] == i
    ]
