"""`config.hosts`: the schema of a config that runs on several hosts (docs/cluster.md).

A config for several hosts adds the section to the experiment defaults and fills in its
machines and where each node group runs:

    config = make_config("reacher_hard", distributed=True)
    config.hosts = hosts_defaults()
    config.hosts.machines.main = machine(address="10.0.0.2", gpus=1, cpus=16)
    config.hosts.place.actor = "main"

The core never reads it (a local launch ignores it); the entry point checks it with
`validate_hosts_config` whenever a config has it, so a typo fails before anything starts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Any

import ml_collections

from magi_lp.config_schema import (
    check,
    check_keys,
    fact_refusal,
    in_range,
    not_among,
    refusal,
    typed_section,
)
from magi_lp.errors import ConfigError
from magi_lp.runtime.config import NODE_GROUPS


@dataclasses.dataclass(frozen=True)
class HostsSettings:
    """`config.hosts`: running the program on several hosts (docs/cluster.md).

    Used by `--launcher hosts|slurm|kubernetes`; a local launch ignores it. The hosts are
    `hosts.machines.<name>` (see `machine`), the groups' hosts `hosts.place.<group>`, and
    the engines' own settings `hosts.slurm` / `hosts.kubernetes`.
    """

    name: str = ""  # the job's name in generated files ("": the config file's name)
    base_port: int = 27000  # a host's nodes serve on base_port, base_port + 1, ... (fixed)
    python: str = ""  # the Python every host runs, a shared venv ("": this one)
    project_dir: str = ""  # the code, at the same path on every host ("": the current folder)
    poll_seconds: float = 0.5  # how often each node asks the coordinator whether to stop
    stop_notice_seconds: float = 10.0  # a node told to stop exits at the latest this much later
    heartbeat_timeout_seconds: float = 60.0  # a node silent this long is reported dead
    start_timeout_seconds: float = 900.0  # a node must reach the coordinator this soon

    def __post_init__(self) -> None:
        for key in (
            "poll_seconds",
            "stop_notice_seconds",
            "heartbeat_timeout_seconds",
            "start_timeout_seconds",
        ):
            in_range(self, key, above=0)
        check(self, "base_port", 1024 <= self.base_port <= 65535, "a port in 1024-65535")
        check(
            self,
            "heartbeat_timeout_seconds",
            self.heartbeat_timeout_seconds > 4 * self.poll_seconds,
            f"more than 4 x hosts.poll_seconds ({4 * self.poll_seconds:g})",
            fix=f"e.g. --config.hosts.heartbeat_timeout_seconds={8 * self.poll_seconds:g}, "
            "or a smaller hosts.poll_seconds",
        )


@dataclasses.dataclass(frozen=True)
class MachineSettings:
    """`config.hosts.machines.<name>`: one host (write it with `machine(...)`)."""

    address: str = ""  # private-network IP or name the other hosts reach it at ("": engine's)
    gpus: int = -1  # how many GPUs it has (-1: unknown, GPU groups are then not checked)
    gpu_model: str = ""  # their model, for messages
    cpus: int = 0  # its CPU cores (0: unknown); shared among nodes without cpu_threads
    base_port: int = 0  # first port of its nodes (0: hosts.base_port)
    node_selector: str = ""  # Kubernetes: node labels its pods need ("k=v,k2=v2")

    def __post_init__(self) -> None:
        # `typed_section` names each key in full (hosts.machines.<name>.gpus).
        check(
            self,
            "gpus",
            self.gpus >= -1,
            "an integer >= 0, or -1 (unknown)",
            fix="e.g. machine(..., gpus=8)",
        )
        check(
            self,
            "cpus",
            self.cpus >= 0,
            "an integer >= 0 (0: unknown)",
            fix="e.g. machine(..., cpus=32)",
        )
        check(
            self,
            "base_port",
            self.base_port == 0 or 1024 <= self.base_port <= 65535,
            "0 or a port in 1024-65535",
            fix="e.g. machine(..., base_port=28000), or 0 for hosts.base_port",
        )
        check(
            self,
            "address",
            address_ok(self.address),
            "a private-network IP address or host name (no scheme, no port), or ''",
            fix='e.g. machine(address="10.0.0.3")',
        )
        labels = [label for label in self.node_selector.split(",") if label.strip()]
        check(
            self,
            "node_selector",
            all(_label_ok(label) for label in labels),
            "node labels as key=value, comma-separated (letters, digits, '-', '_' and '.'; no "
            "spaces), or ''",
            fix='e.g. machine(..., node_selector="gpu=h100,zone=a")',
        )


_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def address_ok(address: str) -> bool:
    """An address the other hosts can reach: '' (the engine's), an IP other than 0.0.0.0 /
    ::, or a host name ('_' allowed, as /etc/hosts allows it). Refused: a scheme, a port,
    an IPv4 with an octet over 255."""
    if not address:
        return True
    try:
        return not ipaddress.ip_address(address).is_unspecified
    except ValueError:
        pass
    if re.fullmatch(r"[\d.]+", address):  # dotted numbers that are no IPv4 (10.0.0.300)
        return False
    return len(address) <= 253 and bool(_HOST_NAME.fullmatch(address))


def _label_ok(label: str) -> bool:
    """A Kubernetes `key=value` label: key `[prefix/]name`, value a label name or ''."""
    key, _, value = label.strip().partition("=")
    prefix, slash, name = key.rpartition("/")
    return (
        "=" in label
        and bool(name)
        and bool(_LABEL_NAME.fullmatch(name))
        and (not slash or bool(_LABEL_PREFIX.fullmatch(prefix)))
        and bool(_LABEL_NAME.fullmatch(value))
    )


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """`config.hosts.slurm`: the sbatch script's own settings."""

    partition: str = ""  # #SBATCH --partition ("": the cluster's default)
    account: str = ""  # #SBATCH --account
    qos: str = ""  # #SBATCH --qos
    time: str = ""  # #SBATCH --time, e.g. "24:00:00"
    extra_sbatch: str = ""  # more #SBATCH options, ';'-separated ("--mem=0;--mail-type=END")
    setup: str = ""  # shell lines run before the nodes start, ';'-separated ("module load cuda")
    address_suffix: str = ""  # appended to SLURM node names to reach the private network ("-ib")
    submit: bool = True  # sbatch the prepared job (False, or no sbatch here: print the command)

    def __post_init__(self) -> None:
        # Each becomes a line of the sbatch script: a bad one fails at sbatch, or worse,
        # becomes a comment sbatch ignores ("#SBATCH garbage").
        for key in ("partition", "account", "qos"):
            value = getattr(self, key)
            check(self, key, not re.search(r"[\s;#]", value), "a name (no spaces, ';' or '#')")
        check(
            self,
            "time",
            bool(_SLURM_TIME.fullmatch(self.time))
            or self.time.upper() in ("", "UNLIMITED", "INFINITE", "-1"),
            "a SLURM time (minutes, HH:MM:SS, D-HH:MM:SS, UNLIMITED) or ''",
            fix='e.g. --config.hosts.slurm.time="24:00:00"',
        )
        items = [item.strip() for item in self.extra_sbatch.split(";") if item.strip()]
        check(
            self,
            "extra_sbatch",
            all(item.startswith("-") for item in items),
            "sbatch options separated by ';', each starting with '-'",
            fix='e.g. --config.hosts.slurm.extra_sbatch="--mem=0;--mail-type=END"',
        )


_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}")
"""sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""


@dataclasses.dataclass(frozen=True)
class KubernetesSettings:
    """`config.hosts.kubernetes`: the manifests' own settings."""

    image: str = ""  # container image with the code at hosts.project_dir and the venv
    namespace: str = "default"  # where the Jobs, Service and NetworkPolicy go
    volume_claim: str = ""  # PersistentVolumeClaim of the shared filesystem (ReadWriteMany)
    volume_mount: str = "/shared"  # where it is mounted; the workdir must be inside it
    service_account: str = ""  # pods' service account ("": the namespace's default)
    image_pull_policy: str = "IfNotPresent"  # Always, IfNotPresent or Never
    network_policy: bool = True  # only pods of this program may reach its pods' ports

    def __post_init__(self) -> None:
        policies = ("Always", "IfNotPresent", "Never")
        check(self, "image_pull_policy", self.image_pull_policy in policies, " or ".join(policies))
        check(
            self,
            "namespace",
            len(self.namespace) <= 63 and bool(_DNS_LABEL.fullmatch(self.namespace)),
            "a Kubernetes namespace name (lower-case letters, digits and '-', at most 63)",
            fix="e.g. --config.hosts.kubernetes.namespace=default",
        )
        for key in ("volume_claim", "service_account"):
            value = getattr(self, key)
            check(
                self,
                key,
                not value or (len(value) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(value))),
                "a Kubernetes object name (lower-case letters, digits, '-' and '.'), or ''",
            )
        check(
            self,
            "image",
            not re.search(r"\s", self.image),
            "a container image reference (no spaces), e.g. 'registry/magi_lp:1'",
        )


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def machine(**settings: Any) -> ml_collections.ConfigDict:
    """A `config.hosts.machines.<name>` entry listing every `MachineSettings` field.

    E.g. `config.hosts.machines.main = machine(address="10.0.0.2", gpus=2, cpus=32)`.
    Listing every field lets `--config.hosts.machines.main.gpus=4` override any of them.
    """
    names = [f.name for f in dataclasses.fields(MachineSettings)]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise not_among(
            f"machine setting {unknown[0]!r} is unknown", unknown[0], names, "the settings"
        )
    return ml_collections.ConfigDict({**dataclasses.asdict(MachineSettings()), **settings})


def hosts_defaults() -> ml_collections.ConfigDict:
    """`config.hosts` with every key: no machines; `place` empty (fine with one machine)."""
    hosts = ml_collections.ConfigDict(dataclasses.asdict(HostsSettings()))
    hosts.machines = ml_collections.ConfigDict()
    hosts.place = ml_collections.ConfigDict({group: "" for group in NODE_GROUPS})
    hosts.slurm = ml_collections.ConfigDict(dataclasses.asdict(SlurmSettings()))
    hosts.kubernetes = ml_collections.ConfigDict(dataclasses.asdict(KubernetesSettings()))
    return hosts


_HOSTS_SECTIONS = ("machines", "place", "slurm", "kubernetes")


def validate_hosts_config(config: ml_collections.ConfigDict) -> HostsSettings:
    """Checks `config.hosts`; returns its top-level settings, typed (ConfigError if bad)."""
    if "hosts" not in config:
        raise ConfigError(
            fact_refusal(
                "hosts is missing",
                "",
                "add config.hosts = magi_lp.cluster.config.hosts_defaults() and its machines "
                "to the config file (docs/cluster.md)",
            )
        )
    hosts = config.hosts
    known = [f.name for f in dataclasses.fields(HostsSettings)] + list(_HOSTS_SECTIONS)
    defaults = "magi_lp.cluster.config.hosts_defaults()"
    check_keys(hosts, "hosts.", known, required=_HOSTS_SECTIONS, start_from=defaults)
    for section in _HOSTS_SECTIONS:
        if not isinstance(hosts[section], ml_collections.ConfigDict | dict):
            raise ConfigError(
                refusal(
                    f"hosts.{section}",
                    "a section",
                    hosts[section],
                    f"start from {defaults}",
                )
            )
    top = {key: hosts[key] for key in hosts if key not in _HOSTS_SECTIONS}
    settings = typed_section(HostsSettings, top, "hosts.", suggest_defaults=True)
    for name in hosts.machines:
        if not isinstance(hosts.machines[name], ml_collections.ConfigDict | dict):
            raise ConfigError(
                refusal(
                    f"hosts.machines.{name}",
                    "a machine(...) entry",
                    hosts.machines[name],
                    f'e.g. config.hosts.machines.{name} = machine(address="10.0.0.5")',
                )
            )
        typed_section(
            MachineSettings,
            hosts.machines[name],
            f"hosts.machines.{name}.",
            suggest_defaults=True,
            start_from="magi_lp.cluster.config.machine(...), which lists every key",
        )
    check_keys(hosts.place, "hosts.place.", NODE_GROUPS)
    for group in hosts.place:
        if not isinstance(hosts.place[group], str):
            raise ConfigError(
                refusal(
                    f"hosts.place.{group}",
                    "a string such as 'main' or 'a1,a2'",
                    hosts.place[group],
                    "name the hosts that run the group",
                )
            )
    typed_section(SlurmSettings, hosts.slurm, "hosts.slurm.", suggest_defaults=True)
    typed_section(KubernetesSettings, hosts.kubernetes, "hosts.kubernetes.", suggest_defaults=True)
    return settings


def node_ports(config: ml_collections.ConfigDict) -> dict[str, int]:
    """How many servers (fixed ports) one node of each group runs on several hosts.

    Every node is a Courier or Reverb server; a learner colocated with the replay serves
    both; the coordinator also serves the stop board (magi_lp.cluster.stop_board).
    """
    ports = {group: 1 for group in NODE_GROUPS}
    ports["coordinator"] = 2
    if config.colocate_learner_and_replay:
        ports["learner"] = 2
    return ports
