"""What every engine is handed to launch a program, and the rules they share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from magi_lp.runtime.config import stop_tiers
from magi_lp.runtime.graph import ProgramGraph


@dataclasses.dataclass(frozen=True)
class HostsLaunch:
    """What an engine of several hosts (`magi_lp.cluster.main`) is handed besides the workdir.

    Attributes:
      config: the experiment config (its `hosts` section places the nodes).
      launcher: the `--launcher` value.
      config_name: the config file's name (the job's default name).
      dry_run: print the plan and the files, start nothing.
      render_dir: write the files there, start nothing.
      build_program: placement plan -> the Launchpad program (called only by an engine that
        pickles it ahead; a Ray job's driver builds its program in the job).
      command: the command line, written into the files.
    """

    config: Any
    launcher: str
    config_name: str
    dry_run: bool
    render_dir: str | None
    build_program: Callable[[Any], Any]
    command: str = ""


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch, as every engine's `run(launch) -> int` takes it.

    Attributes:
      graph: the program (`magi_lp.runtime.program.build_program`); None for the engines that
        build their own (one process; several hosts, whose hosts or job build it).
      plan: the validated placement plan (each launch group's env, devices and threads).
      experiment: the experiment the graph was built from (the status view's numbers).
      workdir: the run folder (node logs under `<workdir>/nodes`).
      status_every: seconds between plain status lines when the output is not a terminal.
      termination_notice_secs: how long a stopping node gets before it is killed.
      group_resources: launch group -> custom resources its nodes ask the engine for (on a
        Ray cluster of several machines: the machine the plan gave the group, as
        `{host_resource(host): HOST_SHARE}`); a group not named asks for none.
      logger_factory: the run's loggers (the single-process engine's; the graph's nodes have
        theirs).
      standing: what the same command would do next, read from the workdir once the run
        has ended (a stopped single-process run's last line).
      hosts: what an engine of several hosts needs.
    """

    graph: ProgramGraph | None
    plan: Any
    experiment: Any
    workdir: Path
    status_every: float = 30.0
    termination_notice_secs: float = 10.0
    group_resources: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    logger_factory: Any = None
    standing: Callable[[], str] | None = None
    hosts: HostsLaunch | None = None


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
