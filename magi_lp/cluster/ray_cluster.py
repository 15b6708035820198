"""What the two Ray cluster engines share (`--launcher slurm|kubernetes` on the current stack).

Where Launchpad does not install (Python 3.12), a job on several machines is one Ray cluster
with a node per machine of the host plan. Each Ray node offers its machine's custom resource
(`magi_lp.engines.base.host_resource`: `magi_lp_host_<host>`), and the driver, the entry
point run again inside the job with `--launcher ray` and `RAY_ADDRESS` set, plans the same
hosts from the same config and asks each launch group's actors for its machine's resource
(`Launch.group_resources`), so every node runs on the machine the plan gave it. Nothing is
pickled ahead: the driver builds the program graph where it runs.

This module imports no Ray: the generated files call the `ray` CLI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Sequence

from magi_lp.cluster.job import ClusterJob, generated_header
from magi_lp.engines.base import host_resource

RAY_SECURITY = (
    "SECURITY: the Ray cluster of this job authenticates every connection with a token made "
    "for the job (RAY_AUTH_MODE=token); whoever holds the token can run code as the job's "
    "user. Ray's servers still listen on every interface of their machine, so keep the job's "
    "ports closed to other networks (docs/cluster.md)."
)
"""Printed by every dry run of a Ray engine and written at the top of its files."""

DRIVER_DROPPED_FLAGS = ("launcher", "workdir", "dry_run", "nodry_run", "render")
"""Flags of the submitting command the driver does not get again (it gets its own)."""

_FLAGS_WITH_VALUE = ("launcher", "workdir", "render", "config")


@dataclasses.dataclass(frozen=True)
class RayPorts:
    """Where one machine's Ray listens: a block of ports from the machine's base port.

    Ray's servers bind every interface of their machine; the block keeps them inside the
    range the config gives the machine (`hosts.machines.<name>.base_port`, else
    `hosts.base_port`), so two machines that are one (a test cluster) do not collide.
    """

    base: int
    workers: int

    OFFSETS = {
        "gcs": 0,  # `ray start --head --port`: the cluster's address (head only)
        "node_manager": 1,
        "object_manager": 2,
        "runtime_env_agent": 3,
        "dashboard_agent_grpc": 4,
        "dashboard_agent_listen": 5,
        "metrics_export": 6,
        "dashboard": 7,  # head only; the dashboard is off, its process binds loopback
        "autoscaler_metrics": 8,  # head only: the monitor's metrics (AUTOSCALER_METRIC_PORT)
    }
    FIRST_WORKER = 10

    def port(self, name: str) -> int:
        return self.base + self.OFFSETS[name]

    @property
    def min_worker(self) -> int:
        return self.base + self.FIRST_WORKER

    @property
    def max_worker(self) -> int:
        return self.min_worker + self.workers - 1

    @property
    def last(self) -> int:
        return self.max_worker

    def start_options(self, head: bool) -> list[str]:
        """`ray start` options that fix every port it opens."""
        names = [n for n in self.OFFSETS if n not in ("gcs", "dashboard", "autoscaler_metrics")]
        options = [f"--port={self.port('gcs')}"] if head else []
        options += [f"--{n.replace('_', '-')}-port={self.port(n)}" for n in names]
        if head:
            options.append(f"--dashboard-port={self.port('dashboard')}")
        options += [f"--min-worker-port={self.min_worker}", f"--max-worker-port={self.max_worker}"]
        return options


def ray_ports(base: int, nodes_on_machine: int) -> RayPorts:
    """The port block of a machine that runs `nodes_on_machine` program nodes: a worker port
    per node and as many again (a node's worker is not reused for another, and Ray keeps idle
    ones a while), and room for the driver and the program's control actor. Ray starts no
    worker ahead in these jobs (`NO_PRESTART`)."""
    return RayPorts(base=base, workers=2 * nodes_on_machine + 16)


NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
"""Ray would start a machine's CPU count of idle workers ahead, each taking a worker port."""


def resources_json(host: str) -> str:
    """`ray start --resources` of a machine: its custom resource, one unit (each node placed
    there asks for `magi_lp.engines.base.HOST_SHARE` of it)."""
    return json.dumps({host_resource(host): 1}, separators=(", ", ": "))


def driver_argv(command: str, workdir: str, cwd: str) -> list[str]:
    """The driver the job runs: the submitting command's entry point and flags, with absolute
    paths, `--workdir` and `--launcher=ray` (without `--dry_run` / `--render`).

    `command` is the submitting command line (`shlex.join(sys.argv)`: the entry point first;
    a leading `python` is dropped).
    """
    argv = shlex.split(command)
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]
    if not argv:
        raise ValueError("no entry point in the command")
    entry, rest = argv[0], argv[1:]
    out = [_absolute(entry, cwd)]
    skip = False
    for index, arg in enumerate(rest):
        if skip:
            skip = False
            continue
        name, has_value, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or name.startswith("config."):
            out.append(arg)
            continue
        takes = name in _FLAGS_WITH_VALUE
        if takes and not has_value:
            value = rest[index + 1] if index + 1 < len(rest) else ""
            skip = True
        if name in DRIVER_DROPPED_FLAGS:
            continue
        if name == "config":
            path, colon, part = value.partition(":")
            out.append(f"--config={_absolute(path, cwd)}{colon}{part}")
            continue
        out.append(arg if not takes or has_value else f"{arg}={value}")
    return [*out, f"--workdir={workdir}", "--launcher=ray"]


def _absolute(path: str, cwd: str) -> str:
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(cwd, path))


def shell_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def ray_cli(job: ClusterJob) -> str:
    """The `ray` command of the job's virtualenv (beside its Python)."""
    return os.path.join(os.path.dirname(job.paths.python), "ray")


def machine_nodes(job: ClusterJob, host: str) -> int:
    return sum(len(g.nodes) for g in job.groups_on(host))


def ray_header_lines(job: ClusterJob, what: str) -> list[str]:
    """The comment block at the top of a Ray engine's file (without comment markers)."""
    about = [
        "editing it. It starts one Ray cluster, a node per machine, and runs the driver (the",
        "entry point with --launcher ray), which places each launch group on its machine",
        "through the machine's custom resource.",
    ]
    lines = generated_header(job, what, about, RAY_SECURITY)
    lines.append("machine / launch group / nodes / Ray resource:")
    for host in job.hosts:
        for group in job.groups_on(host.name):
            nodes = f"{len(group.nodes)} node(s)"
            lines.append(
                f"  {host.name:<10} {group.launch_group:<18} {nodes:<11} {host_resource(host.name)}"
            )
    return lines
