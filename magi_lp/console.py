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


class LiveView:
    """A table redrawn in place on the terminal (rich), for the launcher's status view.

    While it runs, `say` / `error` lines printed to stdout or stderr appear above it.
    `update` takes `{"title": str, "columns": [str], "rows": [[str]]}`.
    """

    def __init__(self, refresh_per_second: float = 1.0):
        self._refresh = refresh_per_second
        self._live = None

    def start(self) -> None:
        """Starts drawing (on stderr, where the launcher's lines go)."""
        from rich.console import Console  # only the launcher on a terminal needs rich
        from rich.live import Live

        self._live = Live(
            "",
            console=Console(file=sys.stderr),
            refresh_per_second=self._refresh,
            redirect_stdout=True,
            redirect_stderr=True,
            transient=False,
        )
        self._live.start()

    def update(self, view: dict) -> None:
        """Replaces the table with `view`."""
        from rich.table import Table

        if self._live is None:
            return
        table = Table(title=view["title"], title_justify="left", expand=False)
        for column in view["columns"]:
            table.add_column(column)
        for row in view["rows"]:
            table.add_row(*row)
        self._live.update(table)

    def stop(self) -> None:
        """Leaves the last table on screen and stops redrawing."""
        if self._live is not None:
            self._live.stop()
            self._live = None
