"""What every engine is handed to launch a program, and the rules they share."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from magi_lp.runtime.config import stop_tiers
from magi_lp.runtime.graph import ProgramGraph


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch of a program graph on one machine.

    Attributes:
      graph: the program (`magi_lp.runtime.program.build_program`).
      plan: the validated placement plan (each launch group's env, devices and threads).
      experiment: the experiment the graph was built from (the status view's numbers).
      workdir: the run folder (node logs under `<workdir>/nodes`).
      status_every: seconds between plain status lines when the output is not a terminal.
      termination_notice_secs: how long a stopping node gets before it is killed.
    """

    graph: ProgramGraph
    plan: Any
    experiment: Any
    workdir: Path
    status_every: float = 30.0
    termination_notice_secs: float = 10.0


def stop_tier(role: str) -> int:
    """A node's stop tier on one machine (`magi_lp.runtime.config.STOP_TIERS`)."""
    return stop_tiers(several_hosts=False)[role]


def saves_at_stop(role: str) -> bool:
    """Whether a node of `role` writes something at its stop (the learner's final save)."""
    return role == "learner"
