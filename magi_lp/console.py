"""How magi_lp talks to a person: every line the toolkit writes goes through here.

Two kinds of line, one format each:
- `say(text, source=...)`: what the toolkit is doing or noticed (plan notices, the launcher's
  node reports, isolation status), as `[magi_lp.<source> HH:MM:SS.mmm] text` on stderr. The
  local time matches the absl prefix of node logs, so a report can be matched with the log
  of the node it is about; stderr keeps these lines apart from a program's own output.
- `error(text)`: a user mistake, as the single line `error: text` on stderr (entry points
  then exit with status 2).
Training metrics are not printed here: they are log rows (`magi_lp.runtime.loggers`), and the
dry run's plan table is the command's result, printed to stdout by the entry point.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _stamp(now: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def say(text: str, *, source: str = "", stream: TextIO | None = None) -> None:
    """Writes `text` (one or more lines) as `[magi_lp.<source> HH:MM:SS.mmm] line`, flushed."""
    out = stream if stream is not None else sys.stderr
    name = f"magi_lp.{source}" if source else "magi_lp"
    prefix = f"[{name} {_stamp(time.time())}]"
    for line in text.splitlines() or [""]:
        print(f"{prefix} {line}", file=out)
    out.flush()


def error(text: str, *, stream: TextIO | None = None) -> None:
    """Writes a user mistake as the one line `error: text`."""
    out = stream if stream is not None else sys.stderr
    print(f"error: {' '.join(text.split())}", file=out)
    out.flush()
