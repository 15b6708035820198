"""The entry points: `distributed_main` (lp_main.py) and `single_process_main` (main.py).

Three rooms, read in this order:
  flags     the flags and their parsing (`parse_flags`): one line for every bad input
  checks    what is refused before anything starts, and `standing`: where a workdir stands
  decision  the one launch decision (plan, store, GPU memory, notices), computed once, frozen
  dispatch  the entry points' bodies: check, decide, then hand a `Launch` to the engine
"""

from magi_lp.cli.dispatch import distributed_main, single_process_main
from magi_lp.cli.flags import parse_flags

__all__ = ["distributed_main", "parse_flags", "single_process_main"]
