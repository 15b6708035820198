"""What a launch on several hosts needs to know, engine by engine, as plain data.

`ClusterJob` is the host plan as the launch layer sees it: hosts, launch groups with their
env and nodes, each node's host, ports and stop tier, where the shared code, Python and
workdir are, and the engine's own settings. The runtime builds it from the config and the
host plan (`magi_lp.cluster.main`); the renderers (`slurm`, `kubernetes`, `host_scripts`)
turn it into text and `prepare.prepare_job` into the pickled program every node loads.

How a node finds another one depends on the engine, and is decided here once:
- hosts: the address the config gives for the host;
- SLURM: that address, or else the name SLURM gave the allocated node, which the batch
  script exports as MAGI_LP_HOST_<HOST> before any step starts (read when a node resolves
  the address, so the pickled program does not depend on the allocation);
- Kubernetes: every node is a pod of an Indexed Job, reached by its DNS name
  `<job>-<index>.<service>` through the headless Service.

No Launchpad here: renderers and their golden tests stay fast.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from magi_lp.engines import several_hosts_launchers
from magi_lp.stack import STACKS

RUNTIMES = STACKS
"""What runs the program graph on the hosts: a pickled Launchpad program, or a Ray cluster
(the stack the job's machines run, `magi_lp.stack`)."""

SECURITY_WARNING = (
    "SECURITY: the nodes talk through Courier and Reverb, which have no authentication, and "
    "Courier calls any Python function a caller names. Their servers listen on every "
    "interface of their host (neither library can be given one address to bind), so anyone "
    "who can reach a node's port can run code as the job's user. Run this only on a private "
    "network that no untrusted machine can reach (docs/cluster.md)."
)
"""Printed by every dry run and written at the top of every generated file."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class AddressRef:
    """Where a node's host is: a fixed host name / IP, or an environment variable.

    Attributes:
      host: the host name or IP; used when `host_var` is "" or unset at run time.
      host_var: a variable holding the host (SLURM: set by the batch script), or "".
    """

    host: str = ""
    host_var: str = ""

    def describe(self) -> str:
        """ "10.0.0.2", or "$MAGI_LP_HOST_MAIN" when the engine provides it."""
        return f"${self.host_var}" if self.host_var else self.host

    def resolve(self, port: int, environ: Mapping[str, str] | None = None) -> str:
        """ "host:port" (IPv6 in brackets), reading `host_var` from the environment."""
        environ = os.environ if environ is None else environ
        host = (environ.get(self.host_var, "") if self.host_var else "") or self.host
        if not host:
            raise RuntimeError(
                f"no address: {self.host_var} is not set (the SLURM batch script sets it "
                "before starting any node)"
            )
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(frozen=True)
class ClusterNode:
    """One node process.

    Attributes:
      launch_group: its launch group ("actor@a1").
      task: its index in the launch group.
      host: the host it runs on.
      ports: the ports its servers listen on, in the order of its addresses.
      stop_tier: when it is told to stop: tier 0 first; a tier is told once every node of
        the tiers before it has left.
    """

    launch_group: str
    task: int
    host: str
    ports: tuple[int, ...]
    stop_tier: int

    @property
    def name(self) -> str:
        """`launch_group/task`."""
        return f"{self.launch_group}/{self.task}"


@dataclasses.dataclass(frozen=True)
class ClusterGroup:
    """A launch group: nodes on one host that share one env.

    Attributes:
      launch_group: its name.
      host: the host all its nodes run on.
      env: the environment variables every node of the group gets (the placement plan's).
      nodes: its nodes, by task id.
      gpus: how many GPUs each of its nodes uses (0 for a CPU node).
      cpus: how many CPUs to ask the engine for per node, or None (the engine's default).
      summary: one line for comments ("actor nodes 0-3: cpu").
    """

    launch_group: str
    host: str
    env: Mapping[str, str]
    nodes: tuple[ClusterNode, ...]
    gpus: int = 0
    cpus: int | None = None
    summary: str = ""


@dataclasses.dataclass(frozen=True)
class ClusterHost:
    """A host of the job.

    Attributes:
      name: its name in the config.
      address: its private-network address, "" when the engine gives it.
      gpus: how many GPUs it has (None: unknown).
      node_selector: Kubernetes node labels its pods must run on ("k=v,k2=v2"), or "".
      cpus: its CPU cores (0: unknown).
      base_port: the first port of its range (`hosts.machines.<name>.base_port`, else
        `hosts.base_port`; 0: not given).
    """

    name: str
    address: str = ""
    gpus: int | None = None
    node_selector: str = ""
    cpus: int = 0
    base_port: int = 0

    @property
    def host_var(self) -> str:
        """The variable a SLURM batch script puts this host's node name in."""
        return "MAGI_LP_HOST_" + re.sub(r"[^A-Z0-9]", "_", self.name.upper())


@dataclasses.dataclass(frozen=True)
class JobPaths:
    """Where things are; the same path on every host (a shared filesystem).

    Attributes:
      python: the Python every node runs (the shared virtualenv's).
      project_dir: the code (the folder holding `magi_lp/` and the project); the nodes'
        working directory and PYTHONPATH.
      workdir: the run folder (checkpoints, logs).
      job_dir: where the pickled program and its manifest are (`<workdir>/cluster/job`).
      log_dir: where each node's stdout/stderr go (`<workdir>/nodes/<group>/<task>`).
    """

    python: str
    project_dir: str
    workdir: str
    job_dir: str
    log_dir: str


@dataclasses.dataclass(frozen=True)
class StopSettings:
    """How nodes follow the coordinator (see `magi_lp.cluster.stop_board`).

    Attributes:
      poll_seconds: how often each node asks the coordinator whether to stop.
      notice_seconds: how long a node told to stop may take before it exits anyway.
      heartbeat_timeout_seconds: a node silent this long is reported dead, and the
        program stopped; a node that cannot reach the coordinator this long stops.
      start_timeout_seconds: how long the coordinator waits for a node's first poll.
    """

    poll_seconds: float = 0.5
    notice_seconds: float = 10.0
    heartbeat_timeout_seconds: float = 60.0
    start_timeout_seconds: float = 900.0


@dataclasses.dataclass(frozen=True)
class ClusterJob:
    """Everything the renderers and the job preparation need.

    Attributes:
      engine: "hosts", "slurm" or "kubernetes".
      name: the program's name, a DNS label (job, Service and file names derive from it).
      hosts: the hosts, in config order.
      groups: the launch groups, in program order.
      coordinator: the coordinator node's name; its process serves the stop board on
        `control_port`, the last of its ports.
      paths: shared paths.
      stop: stop and fault-detection timings.
      settings: the engine's own settings (`config.hosts.slurm` / `.kubernetes`), as a dict.
      command: the command line that generated the files (for their headers).
      runtime: what runs the program graph on the hosts (`RUNTIMES`).
      driver: the Ray engines' driver, the entry point with `--launcher ray` (argv, absolute
        paths, without the Python); empty for Launchpad's engines.
    """

    engine: str
    name: str
    hosts: tuple[ClusterHost, ...]
    groups: tuple[ClusterGroup, ...]
    coordinator: str
    paths: JobPaths
    stop: StopSettings = StopSettings()
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    command: str = ""
    runtime: str = "launchpad"
    driver: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        several = several_hosts_launchers()
        if self.engine not in several:
            raise ValueError(f"engine {self.engine!r} is not one of {tuple(several)}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime {self.runtime!r} is not one of {RUNTIMES}")
        if not _DNS_LABEL.match(self.name) or len(self.name) > 40:
            raise ValueError(f"job name {self.name!r} must be a DNS label of <= 40 characters")
        self.node(self.coordinator)  # raises if missing

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        """Every node, in program order."""
        return tuple(n for g in self.groups for n in g.nodes)

    def node(self, name: str) -> ClusterNode:
        """The node called `name` ("learner/0")."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} in the job")

    def group(self, launch_group: str) -> ClusterGroup:
        """The launch group called `launch_group`."""
        for group in self.groups:
            if group.launch_group == launch_group:
                return group
        raise KeyError(f"no launch group {launch_group!r} in the job")

    def host(self, name: str) -> ClusterHost:
        """The host called `name`."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in the job")

    def groups_on(self, host: str) -> tuple[ClusterGroup, ...]:
        """The launch groups that run on `host`."""
        return tuple(g for g in self.groups if g.host == host)

    @property
    def control_port(self) -> int:
        """The port of the coordinator's stop board (its last port)."""
        return self.node(self.coordinator).ports[-1]

    def address_of(self, node: ClusterNode) -> AddressRef:
        """Where other nodes reach `node` (see the module docstring)."""
        if self.engine == "kubernetes":
            return AddressRef(host=f"{self.pod_name(node)}.{self.service_name}")
        host = self.host(node.host)
        if host.address or self.engine == "hosts":
            return AddressRef(host=host.address)
        return AddressRef(host_var=host.host_var)

    def control_address(self) -> AddressRef:
        """Where nodes reach the coordinator's stop board."""
        return self.address_of(self.node(self.coordinator))

    # Kubernetes names.
    @property
    def service_name(self) -> str:
        """The headless Service that gives every pod a DNS name."""
        return self.name

    def job_name(self, launch_group: str) -> str:
        """The Indexed Job of a launch group: `<name>-<launch group as a DNS label>`."""
        label = re.sub(r"[^a-z0-9]+", "-", launch_group.lower()).strip("-")
        return f"{self.name}-{label}"

    def pod_name(self, node: ClusterNode) -> str:
        """A node's pod host name (Indexed Jobs name pods `<job>-<index>`)."""
        return f"{self.job_name(node.launch_group)}-{node.task}"


def node_command(job: ClusterJob, launch_group: str, task_selector: list[str]) -> list[str]:
    """The command that starts nodes of `launch_group` (before the shell's quoting).

    `task_selector` says which task: ["--task", "3"], or ["--task_var", "SLURM_PROCID",
    "--task_offset", "4"] to read it from the engine.
    """
    return [
        job.paths.python,
        "-m",
        "magi_lp.cluster.host_node",
        "--job",
        job.paths.job_dir,
        "--group",
        launch_group,
        *task_selector,
    ]


def common_env(job: ClusterJob) -> dict[str, str]:
    """Variables every node gets on top of its group's env."""
    return {"PYTHONUNBUFFERED": "1", "PYTHONPATH": job.paths.project_dir}


def generated_header(job: ClusterJob, what: str, about: list[str], security: str) -> list[str]:
    """The opening of every engine's comment block: what the file is and that it is
    generated (`about` goes on to say what it does), the command that wrote it, and the
    engine's `security` warning. Each engine then lists where the nodes run."""
    lines = [
        f"{what}, generated by magi_lp for program {job.name!r}; regenerate it instead of",
        *about,
    ]
    if job.command:
        lines += ["Generated by:", f"  {job.command}"]
    lines.append("")
    lines += wrap_words(security, 88)
    lines.append("")
    return lines


def header_lines(job: ClusterJob, what: str) -> list[str]:
    """The comment block at the top of every generated file (without comment markers)."""
    about = [
        "editing it. Nodes load the pickled program from",
        f"  {job.paths.job_dir}",
        "which `--launcher " + job.engine + "` (without --render / --dry_run) writes.",
    ]
    lines = generated_header(job, what, about, SECURITY_WARNING)
    lines.append("host / node / ports / address:")
    for host in job.hosts:
        for group in job.groups_on(host.name):
            for node in group.nodes:
                ports = ",".join(map(str, node.ports))
                address = job.address_of(node).describe()
                lines.append(f"  {host.name:<10} {node.name:<22} {ports:<12} {address}")
    lines.append(
        f"The coordinator {job.coordinator} serves the stop board on port {job.control_port}."
    )
    return lines


def wrap_words(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken between words only (a longer
    word stands alone): the warnings of the generated job folders' READMEs."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines
