"""How the toolkit writes durations and index sets for a person, in one place (the status
table, the terminal log line and the placement tables all use these)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def format_duration(seconds: float) -> str:
    """'45s', '2m05s', '3h05m', '27d04h': short, for an ETA; '?' when unknown or negative."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def format_ranges(values: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0-3,5' (sorted, repeats dropped)."""
    ordered = sorted(set(values))
    parts: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)
