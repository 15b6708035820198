"""The host plan: which host every node runs on, the ports it serves on, and its env there.

A program that outgrows one machine keeps the same node groups and resource specs; the
config names the hosts (`config.hosts.machines`) and which groups run where
(`config.hosts.place`, read by `magi_lp.cluster.host_place`), and `make_host_plan` turns
that into one node list with a fixed host and fixed ports per node, checked as a whole
before anything starts:
- every node group with nodes is placed, on hosts that exist; a group's nodes may be spread
  over several hosts (evenly, or with explicit counts "a1:6,a2:10");
- each host's share of each group is planned against that host's GPUs with the same
  `make_plan` a single machine uses (GPU ids exist, one model per node, memory fractions
  fit, ...), when the config says what GPUs the host has. A host whose GPUs are unknown
  gets the GPUs its `gpu` groups ask for, with a notice; its `gpu_if_available` groups run
  on the CPU;
- ports are fixed (`base_port` + the node's position on its host, or per node when every
  node is its own host, as in Kubernetes pods), inside 1024-65535, and distinct wherever two
  nodes share an address. Every loopback address (127.0.0.0/8) is this one machine, whose
  servers listen on all its interfaces, so ports must be distinct across all of them.

Launch groups: a node group that lives on one host keeps the launch groups the single-host
plan gives it ("learner", "actor_gpu1"); one spread over several hosts gets one launch group
per host ("actor@a1", "actor@a2"), because Launchpad gives env per launch group and the
engines start nodes per host. `HostPlan.placement` is an ordinary `PlacementPlan` over those
launch groups, so program assembly does not know whether it runs on one host or many.

Pure Python: no Launchpad, no ML framework (see magi_lp.placement).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping, Sequence

import tabulate

from magi_lp.cluster.config import address_ok
from magi_lp.cluster.host_place import place_nodes
from magi_lp.config_schema import fact_refusal, is_int, not_among, refusal, refusal_at
from magi_lp.errors import ConfigError
from magi_lp.formatting import format_ranges
from magi_lp.placement.gpu_inventory import GpuInfo, GpuInventory
from magi_lp.placement.jax_build import JaxBuild, detect_jax_build
from magi_lp.placement.plan import GroupPlacement, GroupRequest, PlacementPlan, make_plan

MIN_PORT = 1024
MAX_PORT = 65535
HOST_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,30}[a-z0-9])?$")
"""A host's name in the config: a short DNS label, usable in file, job and pod names."""

_UNKNOWN_GPU_MODEL = "GPU (model unknown)"
# An assumed GPU's memory: only fractions are planned, so any positive size does.
_ASSUMED_GPU_BYTES = 1 << 34


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """One host of the cluster, as the config describes it.

    Attributes:
      name: the host's name in the config and in generated files ("main", "a1").
      address: its address on the private network that the nodes use to reach each other;
        "" when the engine provides it at run time (SLURM's allocated node, a pod's name).
      gpus: how many GPUs the host has (all of one model), or None when unknown.
      gpu_model: their model, "" when unknown (only used to describe them).
      base_port: the first port of this host's nodes; None: the plan's base port.
    """

    name: str
    address: str = ""
    gpus: int | None = None
    gpu_model: str = ""
    base_port: int | None = None

    def __post_init__(self) -> None:
        where = f"hosts.machines.{self.name}"
        if not isinstance(self.name, str) or not HOST_NAME.match(self.name):
            raise ConfigError(
                refusal(
                    "a host's name in hosts.machines",
                    "lower-case letters, digits and '-', starting with a letter (at most 32 "
                    "characters)",
                    self.name,
                    "e.g. 'main' or 'actors-1'",
                )
            )
        if not isinstance(self.address, str) or not address_ok(self.address):
            raise ConfigError(
                refusal(
                    f"{where}.address",
                    "a private-network IP address or host name (no scheme, no port), or ''",
                    self.address,
                    "e.g. '10.0.0.2', or '' where the engine provides it",
                )
            )
        if self.gpus is not None and not (is_int(self.gpus) and self.gpus >= 0):
            raise ConfigError(
                refusal(
                    f"{where}.gpus",
                    "an integer >= 0, or None (unknown)",
                    self.gpus,
                    "give the number of GPUs the host has",
                )
            )
        if self.base_port is not None and not MIN_PORT <= self.base_port <= MAX_PORT:
            raise ConfigError(
                refusal(
                    f"{where}.base_port",
                    f"a port in {MIN_PORT}-{MAX_PORT}",
                    self.base_port,
                    "pick one in that range, or None for hosts.base_port",
                )
            )

    def inventory(self) -> GpuInventory:
        """The host's GPUs as a plan sees them (empty, with a reason, when unknown)."""
        if self.gpus is None:
            return GpuInventory(reason=f"the GPUs of host {self.name} are not in the config")
        if self.gpus == 0:
            return GpuInventory(reason=f"hosts.machines.{self.name}.gpus=0")
        return _assumed_inventory(self.gpus, self.gpu_model or _UNKNOWN_GPU_MODEL)


@dataclasses.dataclass(frozen=True)
class PlacedNode:
    """One node of the program on its host.

    Attributes:
      group: the logical node group ("actor").
      index: the node's index in its logical group.
      launch_group: the launch group it belongs to ("actor@a1").
      task: its index inside the launch group (Launchpad's task id).
      host: the name of the host it runs on.
      ports: the ports it serves on, fixed before launch (one per server of the node).
    """

    group: str
    index: int
    launch_group: str
    task: int
    host: str
    ports: tuple[int, ...]

    @property
    def name(self) -> str:
        """`launch_group/task`, the node's name in logs, reports and generated files."""
        return f"{self.launch_group}/{self.task}"


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """A validated plan of the program over several hosts.

    Attributes:
      hosts: the hosts, in config order.
      nodes: every node, in program order (group by group, index by index).
      placement: devices and env per launch group, as on one machine.
      launch_group_hosts: launch group -> the host all its nodes run on.
      notices: choices the user should see.
    """

    hosts: tuple[HostSpec, ...]
    nodes: tuple[PlacedNode, ...]
    placement: PlacementPlan
    launch_group_hosts: Mapping[str, str]
    notices: tuple[str, ...]

    def host(self, name: str) -> HostSpec:
        """The host called `name`."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r}")

    def nodes_on(self, host: str) -> tuple[PlacedNode, ...]:
        """The nodes that run on `host`, in program order."""
        return tuple(n for n in self.nodes if n.host == host)

    def node(self, group: str, index: int) -> PlacedNode:
        """Node `index` of logical group `group`."""
        for node in self.nodes:
            if node.group == group and node.index == index:
                return node
        raise KeyError(f"no node {index} in group {group!r}")

    def launch_group_nodes(self, launch_group: str) -> tuple[PlacedNode, ...]:
        """The nodes of one launch group, by task id."""
        return tuple(n for n in self.nodes if n.launch_group == launch_group)

    def format_table(self, ports_of_host: Mapping[str, str] | None = None) -> str:
        """One row per launch group: host, nodes, ports, device, GPUs, env.

        `ports_of_host`: the ports column of each host where the engine's own servers take
        them (Ray's block per machine), in place of the nodes' planned ports."""
        header = ("host", "address", "launch group", "nodes", "ports", "device", "gpus", "env")
        rows = []
        for host in self.hosts:
            groups = [
                g
                for g in self.placement.groups.values()
                if self.launch_group_hosts[g.launch_group] == host.name
            ]
            for placement in groups:
                nodes = self.launch_group_nodes(placement.launch_group)
                ports = sorted(p for n in nodes for p in n.ports)
                env = [
                    f"{k}={v}" for k, v in placement.env.items() if v or k == "CUDA_VISIBLE_DEVICES"
                ]
                rows.append(
                    (
                        host.name,
                        host.address or "(from the engine)",
                        placement.launch_group,
                        f"{len(nodes)} ({placement.group} {format_ranges(n.index for n in nodes)})",
                        (ports_of_host or {}).get(host.name) or format_ranges(ports),
                        placement.device,
                        ",".join(map(str, placement.gpu_ids)) or "-",
                        "\n".join(env),
                    )
                )
        out = [tabulate.tabulate(rows, header, tablefmt="simple", disable_numparse=True)]
        out.append(
            f"JAX build (every host runs this Python): {self.placement.jax_build.describe()}"
        )
        return "\n".join(out)


def _assumed_inventory(count: int, model: str) -> GpuInventory:
    return GpuInventory(
        gpus=tuple(
            GpuInfo(
                index=i,
                pci_bus_id=f"assumed:{i}",
                name=model,
                memory_total_bytes=_ASSUMED_GPU_BYTES,
                memory_used_bytes=0,
                utilization_percent=0.0,
            )
            for i in range(count)
        )
    )


def _gpu_need(request: GroupRequest) -> int:
    """How many GPUs a host must have for `request` on its own (assumed inventories)."""
    gpus = request.spec.gpus
    if isinstance(gpus, tuple):
        return max(gpus) + 1
    if isinstance(gpus, int):
        return gpus
    if request.spec.gpu_distribution == "round_robin":
        return request.num_nodes
    return 1


def _host_inventory(
    host: HostSpec, requests: Mapping[str, GroupRequest], notices: list[str]
) -> tuple[GpuInventory, dict[str, GroupRequest]]:
    """The inventory to plan `host` against, and its requests (CPU fallbacks applied)."""
    if host.gpus is not None:
        return host.inventory(), dict(requests)
    planned = dict(requests)
    need = 0
    for group, request in requests.items():
        if request.spec.device == "gpu":
            need = max(need, _gpu_need(request))
        elif request.spec.device == "gpu_if_available":
            # Unknown GPUs: the safe guess is none; the user can say how many there are.
            notices.append(
                f"{group} on host {host.name}: the host's GPUs are not in the config; "
                f"device='gpu_if_available' runs on the CPU (set hosts.machines.{host.name}.gpus "
                "to the number of GPUs it has to use them)"
            )
            planned[group] = dataclasses.replace(
                request, spec=dataclasses.replace(request.spec, device="cpu", render_gpu=None)
            )
    if not need:
        return host.inventory(), planned
    notices.append(
        f"host {host.name}: its GPUs are not in the config; planning as if it had {need} "
        f"identical GPU(s) (set hosts.machines.{host.name}.gpus to have them checked)"
    )
    return _assumed_inventory(need, host.gpu_model or _UNKNOWN_GPU_MODEL), planned


def make_host_plan(
    requests: Mapping[str, GroupRequest],
    hosts: Sequence[HostSpec],
    place: Mapping[str, str],
    *,
    ports_per_node: Mapping[str, int],
    base_port: int,
    port_per_pod: bool = False,
    jax_build: JaxBuild | None = None,
) -> HostPlan:
    """Places every node of `requests` on `hosts` and validates the whole.

    Args:
      requests: logical group -> spec and node count, in program order.
      hosts: the hosts (at least one); names unique.
      place: logical group -> "host", "h1,h2" or "h1:n1,h2:n2" ("" = the only host).
      ports_per_node: logical group -> how many servers (ports) one of its nodes runs.
      base_port: first port of each host's nodes (a host's own base_port wins).
      port_per_pod: every node is its own host (a Kubernetes pod): each node's ports start
        at the base port.
      jax_build: the JAX every host runs (they share one Python); None: this one's.

    Raises:
      ConfigError: naming the key and the fix, before anything starts.
    """
    if jax_build is None:
        jax_build = detect_jax_build()
    _check_hosts(hosts, base_port)
    _check_place(place, requests, ports_per_node)
    names = [h.name for h in hosts]
    shares, spread = place_nodes(requests, place, names)
    notices: list[str] = []
    groups, launch_group_hosts = _plan_each_host(
        requests, hosts, shares, spread, jax_build, notices
    )
    nodes = _assign_ports(
        requests,
        hosts,
        groups,
        launch_group_hosts,
        ports_per_node=ports_per_node,
        base_port=base_port,
        port_per_pod=port_per_pod,
    )
    _check_port_range(nodes)  # a pod's ports too: its manifest names them
    if not port_per_pod:
        _check_ports(nodes, hosts)

    merged = PlacementPlan(
        groups=groups,
        notices=tuple(notices),
        inventory=GpuInventory(reason="several hosts: see the host plan"),
        jax_build=jax_build,
    )
    return HostPlan(
        hosts=tuple(hosts),
        nodes=tuple(nodes),
        placement=merged,
        launch_group_hosts=launch_group_hosts,
        notices=tuple(notices),
    )


def _check_hosts(hosts: Sequence[HostSpec], base_port: int) -> None:
    """Refuses no hosts, a host named twice and a base port out of range."""
    if not hosts:
        raise ConfigError(
            fact_refusal(
                "hosts.machines is empty",
                "",
                "name at least one host, e.g. config.hosts.machines.main = "
                "magi_lp.cluster.config.machine(address='10.0.0.2')",
            )
        )
    names = [h.name for h in hosts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            fact_refusal(
                f"hosts.machines names {', '.join(duplicates)} twice",
                "",
                "give each host its own name",
            )
        )
    if not MIN_PORT <= base_port <= MAX_PORT:
        raise ConfigError(
            refusal(
                "hosts.base_port",
                f"a port in {MIN_PORT}-{MAX_PORT}",
                base_port,
                "pick one in that range",
            )
        )


def _check_place(
    place: Mapping[str, str],
    requests: Mapping[str, GroupRequest],
    ports_per_node: Mapping[str, int],
) -> None:
    """Refuses a `hosts.place` key that names no node group."""
    for group in place:
        if group not in requests and group not in ports_per_node:
            what = f"hosts.place.{group} names no node group"
            raise not_among(
                what, group, list(ports_per_node), "the node groups", prefix="hosts.place."
            )


def _plan_each_host(
    requests: Mapping[str, GroupRequest],
    hosts: Sequence[HostSpec],
    shares: Mapping[str, Mapping[str, list[int]]],
    spread: Mapping[str, int],
    jax_build: JaxBuild,
    notices: list[str],
) -> tuple[dict[str, GroupPlacement], dict[str, str]]:
    """Plans each host's share of the groups against its GPUs (`make_plan`, as on one
    machine); returns launch group -> placement (with the program's node indices) and
    launch group -> host. A group spread over several hosts gets a launch group per host."""
    groups: dict[str, GroupPlacement] = {}
    launch_group_hosts: dict[str, str] = {}
    for host in hosts:
        share = shares[host.name]
        if not share:
            notices.append(f"host {host.name} runs no node (hosts.place names it for none)")
            continue
        host_requests = {
            g: GroupRequest(requests[g].spec, len(indices), renders=requests[g].renders)
            for g, indices in share.items()
        }
        inventory, host_requests = _host_inventory(host, host_requests, notices)
        try:
            plan = make_plan(host_requests, inventory, jax_build)
        except ConfigError as error:
            raise ConfigError(refusal_at(f"host {host.name}", error)) from None
        notices.extend(f"host {host.name}: {n}" for n in plan.notices)
        for placement in plan.groups.values():
            indices = share[placement.group]
            name = placement.launch_group
            if spread[placement.group] > 1:
                name = f"{name}@{host.name}"
            if name in groups:
                raise ConfigError(
                    fact_refusal(
                        f"launch group {name!r} appears on two hosts",
                        "",
                        f"rename node group {placement.group!r}",
                    )
                )
            global_indices = tuple(indices[i] for i in placement.node_indices)
            groups[name] = dataclasses.replace(
                placement, launch_group=name, node_indices=global_indices
            )
            launch_group_hosts[name] = host.name
    return groups, launch_group_hosts


def _assign_ports(
    requests: Mapping[str, GroupRequest],
    hosts: Sequence[HostSpec],
    groups: Mapping[str, GroupPlacement],
    launch_group_hosts: Mapping[str, str],
    *,
    ports_per_node: Mapping[str, int],
    base_port: int,
    port_per_pod: bool,
) -> list[PlacedNode]:
    """Every node, in program order, with its launch group, task, host and fixed ports: the
    next free ones of its host (or of its pod) from the base port."""
    # (group, logical index) -> (launch group, host)
    where: dict[tuple[str, int], tuple[str, str]] = {}
    for name, placement in groups.items():
        for index in placement.node_indices:
            where[(placement.group, index)] = (name, launch_group_hosts[name])
    by_name = {h.name: h for h in hosts}
    nodes: list[PlacedNode] = []
    next_port: dict[str, int] = {}
    for group, request in requests.items():
        for index in range(request.num_nodes):
            launch_group, host_name = where[(group, index)]
            host = by_name[host_name]
            key = f"{launch_group}/{index}" if port_per_pod else host_name
            first = next_port.get(key, host.base_port if host.base_port is not None else base_port)
            count = ports_per_node.get(group, 1)
            ports = tuple(range(first, first + count))
            next_port[key] = first + count
            task = groups[launch_group].node_indices.index(index)
            nodes.append(PlacedNode(group, index, launch_group, task, host_name, ports))
    return nodes


def _address_key(host: HostSpec) -> str:
    """Hosts with equal keys share one port space."""
    if not host.address:
        return f"host:{host.name}"  # the engine gives each host its own machine
    try:
        if ipaddress.ip_address(host.address).is_loopback:
            return "loopback"  # 127.0.0.0/8 and ::1: all this machine
    except ValueError:
        if host.address == "localhost":
            return "loopback"
    return f"address:{host.address}"


def _check_port_range(nodes: Sequence[PlacedNode]) -> None:
    for node in nodes:
        for port in node.ports:
            if not MIN_PORT <= port <= MAX_PORT:
                raise ConfigError(
                    fact_refusal(
                        f"node {node.name} on host {node.host} would serve on port {port}",
                        f"outside {MIN_PORT}-{MAX_PORT}",
                        f"lower hosts.base_port (or hosts.machines.{node.host}.base_port)",
                    )
                )


def _check_ports(nodes: Sequence[PlacedNode], hosts: Sequence[HostSpec]) -> None:
    """Refuses two nodes that would serve on one port of one address."""
    by_name = {h.name: h for h in hosts}
    used: dict[tuple[str, int], PlacedNode] = {}
    for node in nodes:
        host = by_name[node.host]
        for port in node.ports:
            key = (_address_key(host), port)
            other = used.get(key)
            if other is not None:
                same = "this machine's loopback" if key[0] == "loopback" else host.address
                raise ConfigError(
                    fact_refusal(
                        f"port {port}",
                        f"nodes {other.name} (host {other.host}) and {node.name} (host "
                        f"{node.host}) would both serve on it at {same}",
                        f"give host {node.host} another hosts.machines.{node.host}.base_port "
                        "(or address)",
                    )
                )
            used[key] = node
