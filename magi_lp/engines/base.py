"""What every engine is handed to launch a program, and the rules they share."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
      group_resources: launch group -> custom resources its nodes ask the engine for (on a
        Ray cluster of several machines: the machine the plan gave the group, as
        `{host_resource(host): HOST_SHARE}`); a group not named asks for none.
    """

    graph: ProgramGraph
    plan: Any
    experiment: Any
    workdir: Path
    status_every: float = 30.0
    termination_notice_secs: float = 10.0
    group_resources: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)


HOST_SHARE = 0.001
"""What a node asks of its machine's resource: every node of a machine fits in one unit."""


HOST_RESOURCE_PREFIX = "magi_lp_host_"


def host_resource(host: str) -> str:
    """The custom resource a machine of a cluster offers (`ray start --resources`), so a node
    placed there by the plan runs there."""
    return f"{HOST_RESOURCE_PREFIX}{host}"


def stop_tier(role: str) -> int:
    """A node's stop tier on one machine (`magi_lp.runtime.config.STOP_TIERS`)."""
    return stop_tiers(several_hosts=False)[role]


def saves_at_stop(role: str) -> bool:
    """Whether a node of `role` writes something at its stop (the learner's final save)."""
    return role == "learner"
