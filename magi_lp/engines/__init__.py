"""The engines that launch a program graph, keyed by `--launcher`: one module each.

As Launchpad's own `launch/` has one module per launch type, each engine is one module here
with a `run(launch: magi_lp.engines.base.Launch) -> int`, named in `REGISTRY` and imported
only when chosen (an engine's library, Launchpad or Ray, is imported by its module alone).
The program graph (`magi_lp.runtime.graph`), the placement plan and its per-group env are the
same for every engine; each carries them out its own way.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import socket
import sys
from types import ModuleType

from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.errors import ConfigError
from magi_lp.stack import STACKS, Stack, stack_here

SINGLE_PROCESS = "single_process"
"""The engine of main.py: every part of the agent in one process (no `--launcher` value)."""


@dataclasses.dataclass(frozen=True)
class Engine:
    """One `--launcher` value.

    Attributes:
      name: the `--launcher` value.
      module: the module with its `run` (several-hosts engines: `magi_lp.cluster.main`).
      summary: what it is, in a few words (`--help`, `--dry_run`).
      transport: how it carries replay (`magi_lp.replay.store.TRANSPORTS`).
      needs: the modules it imports (its stack).
      several_hosts: it runs the program on the hosts of `config.hosts`.
      cluster_var: the environment variable that names a running cluster to join instead of
        starting one on this machine (Ray's `RAY_ADDRESS`), if the engine can.
      colocates: it can run the replay inside the learner's process
        (`colocate_learner_and_replay`).
      stack: the stack it runs on (`magi_lp.stack`).
      cluster_engine: several hosts: its class in `magi_lp.cluster.engines` (what it renders
        and how its job starts).
      selectable: a `--launcher` value (the single-process engine is main.py's alone).
    """

    name: str
    module: str
    summary: str
    transport: str
    needs: tuple[str, ...]
    stack: Stack = "launchpad"
    several_hosts: bool = False
    cluster_var: str | None = None
    colocates: bool = True
    cluster_engine: str | None = None
    selectable: bool = True

    def check_colocation(self, colocate_learner_and_replay: bool, launcher: str = "") -> None:
        """Refuses `colocate_learner_and_replay` on an engine that cannot colocate; `launcher`:
        the `--launcher` whose job runs the program on this engine (slurm, kubernetes on
        Ray), when it is not this engine's own."""
        if colocate_learner_and_replay and not self.colocates:
            where = f"--launcher {self.name}"
            if launcher and launcher != self.name:
                where = f"--launcher {launcher} on this stack, whose job runs it with {where}"
            raise ConfigError(
                refusal(
                    "colocate_learner_and_replay",
                    f"False with {where} (the replay is a node of its own there)",
                    True,
                    "--config.colocate_learner_and_replay=False",
                )
            )

    def cluster_address(self) -> str | None:
        """The running cluster this launch joins (None: the engine starts its own). `local`
        (Ray's word for "start a new one here") is None too: the run's own embedded Ray,
        with its token, folder, loopback address and isolation, not a bare one that leaves
        /tmp/ray behind."""
        address = os.environ.get(self.cluster_var) if self.cluster_var else None
        return None if not address or address == "local" else address

    def check_cluster(self, timeout_s: float = 5.0) -> None:
        """Refuses a cluster address (`cluster_var`) where nothing answers, in one line, before
        the launch: Ray's own client retries for minutes. `auto` (the cluster running on this
        machine) is found by the engine module's `resolve_cluster_address`."""
        address = self.cluster_address()
        if not address:
            return
        if address == "auto":
            address = self.load().resolve_cluster_address(address)
        what = f"{self.cluster_var}={address}"
        fix = (
            f"start the cluster there first, or unset {self.cluster_var} to start "
            f"{self.name} on this machine"
        )
        host, _, port = address.split("://", 1)[-1].rpartition(":")
        host = host.strip("[]")  # an IPv6 address, [::1]:6379
        if not host or not port.isdigit():
            raise ConfigError(
                fact_refusal(what, "it is not host:port (or auto)", f"e.g. 10.0.0.5:6379; {fix}")
            )
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise ConfigError(
                fact_refusal(what, f"nothing answers at {host}:{port} ({reason})", fix)
            ) from None

    def missing(self) -> list[str]:
        """The modules it needs that are not installed here."""
        return [m for m in self.needs if importlib.util.find_spec(m) is None]

    def require_stack(self) -> None:
        """One line where this engine cannot run on this stack, naming what can."""
        missing = self.missing()
        if not missing:
            return
        python = ".".join(str(v) for v in sys.version_info[:2])
        here = [e.name for e in REGISTRY.values() if e.stack == stack_here() and e.selectable]
        here = [name for name in dict.fromkeys(here) if not engine(name).several_hosts]
        raise ConfigError(
            fact_refusal(
                f"--launcher {self.name} ({self.summary})",
                f"{', '.join(missing)} not installed here (Python {python})",
                (
                    f"use --launcher {' or '.join(here)} on this stack"
                    if here
                    else "install its stack"
                )
                + (
                    ", or the Python 3.10 stack (`make setup`, .venv) for Launchpad"
                    if "launchpad" in missing
                    else ""
                ),
            )
        )

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


_LAUNCHPAD_STACK = ("launchpad", "reverb")
_CLUSTER = "magi_lp.cluster.main"

REGISTRY: dict[tuple[str, Stack], Engine] = {
    (engine.name, engine.stack): engine
    for engine in (
        Engine(
            "local",
            "magi_lp.engines.launchpad_engine",
            "Launchpad on this machine, Reverb replay",
            "reverb",
            _LAUNCHPAD_STACK,
        ),
        Engine(
            "ray",
            "magi_lp.engines.ray_engine",
            "Ray Core on this machine, or on the Ray cluster RAY_ADDRESS names",
            "served",
            ("ray",),
            stack="ray",
            cluster_var="RAY_ADDRESS",
            colocates=False,
        ),
        Engine(
            "hosts",
            _CLUSTER,
            "config.hosts through per-host scripts (Launchpad, Python 3.10)",
            "reverb",
            _LAUNCHPAD_STACK,
            several_hosts=True,
            cluster_engine="HostsEngine",
        ),
        Engine(
            "slurm",
            _CLUSTER,
            "config.hosts in one SLURM job: Launchpad (Python 3.10), or a Ray cluster in the job",
            "reverb",
            _LAUNCHPAD_STACK,
            several_hosts=True,
            cluster_engine="SlurmEngine",
        ),
        Engine(
            "slurm",
            _CLUSTER,
            "config.hosts in one SLURM job: Launchpad (Python 3.10), or a Ray cluster in the job",
            "served",
            ("ray",),
            stack="ray",
            several_hosts=True,
            cluster_engine="RaySlurmEngine",
        ),
        Engine(
            "kubernetes",
            _CLUSTER,
            "config.hosts on Kubernetes: Launchpad manifests (Python 3.10), or a KubeRay RayJob",
            "reverb",
            _LAUNCHPAD_STACK,
            several_hosts=True,
            cluster_engine="KubernetesEngine",
        ),
        Engine(
            "kubernetes",
            _CLUSTER,
            "config.hosts on Kubernetes: Launchpad manifests (Python 3.10), or a KubeRay RayJob",
            "served",
            ("ray",),
            stack="ray",
            several_hosts=True,
            cluster_engine="KubeRayEngine",
        ),
        *(
            Engine(
                SINGLE_PROCESS,
                "magi_lp.engines.single_process_engine",
                "every part in this one process (main.py)",
                "in_process",
                (),
                stack=stack,
                selectable=False,
            )
            for stack in STACKS
        ),
    )
}
"""Every engine, by its `--launcher` value and the stack it runs on (`magi_lp.stack`): the one
registry. The flag's choices and help, the README's table and the cluster engines (their
`cluster_engine` class in `magi_lp.cluster.engines`) are read from it."""


def several_hosts_launchers() -> list[str]:
    """The `--launcher` values that run a program on several hosts (`magi_lp.cluster`)."""
    return list(dict.fromkeys(e.name for e in REGISTRY.values() if e.several_hosts))


def launchers() -> list[str]:
    """The `--launcher` values, in the registry's order."""
    return list(dict.fromkeys(e.name for e in REGISTRY.values() if e.selectable))


def default_engine() -> str:
    """Launchpad on the Launchpad stack (Python 3.10), else Ray (the current stack)."""
    return "local" if stack_here() == "launchpad" else "ray"


def engine(name: str | None, stack: Stack | None = None) -> Engine:
    """The engine `--launcher name` chooses on `stack` (None: this one's; a name of None:
    `default_engine()`). An engine of another stack only (local on the current one) is
    returned as it is: its `require_stack` says what runs here instead."""
    name = name or default_engine()
    stack = stack or stack_here()
    found = REGISTRY.get((name, stack))
    if found is not None:
        return found
    return next(e for (n, _), e in REGISTRY.items() if n == name)
