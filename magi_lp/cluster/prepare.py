"""Turn a Launchpad program into a job that nodes on several hosts start from one folder.

`prepare_job(program, job)` does what `lp.launch` does before it spawns anything, with the
host plan's decisions instead of local ones:
- every node's launch context is LOCAL_MULTI_PROCESSING (each node is its own process, as
  on one machine) but `lp.stop()` runs `stop_board.ProgramStopper`, which goes through the
  coordinator, instead of SIGTERMing a launcher PID that does not exist on other hosts;
- every server address is bound to the node's fixed host and port (`NodeAddress`) instead
  of `localhost:<picked port>`;
- each launch group's node functions are cloudpickled to `<job_dir>/<group>.pkl`, the same
  serialization Launchpad's `process_entry` reads, and `manifest.json` records which node is
  which, the stop board's address, tiers and timings.
Nodes are then started by `python -m magi_lp.cluster.host_node --job <job_dir> --group G
--task N` on their host (the generated scripts and manifests do that), with the job folder
on a filesystem every host shares.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import launchpad as lp
from launchpad import address as lp_address
from launchpad import context as lp_context
from launchpad.launch import serialization

from magi_lp.cluster.job import AddressRef, ClusterJob
from magi_lp.cluster.stop_board import ProgramStopper
from magi_lp.launch.files import write_atomically, write_text_atomically

MANIFEST = "manifest.json"
FORMAT = 1


class NodeAddress(lp_address.AbstractAddressBuilder):
    """A server address fixed by the host plan: `host:port`, the host read at run time when
    the engine provides it (SLURM)."""

    def __init__(self, ref: AddressRef, port: int):
        self._ref = ref
        self._port = port

    def build(self) -> str:
        return self._ref.resolve(self._port)

    def __repr__(self) -> str:
        return f"NodeAddress({self._ref.describe()}:{self._port})"


def pickle_name(launch_group: str) -> str:
    """The file a launch group's node functions are pickled to."""
    return f"{launch_group}.pkl"


def prepare_job(program: lp.Program, job: ClusterJob) -> Path:
    """Binds, pickles and describes `program` for `job`; returns the job folder.

    Raises:
      RuntimeError: the program's launch groups or servers do not match the plan (a bug in
        the plan or in the program assembly, not a user mistake).
    """
    groups = dict(program.groups)
    planned = [g.launch_group for g in job.groups]
    if sorted(groups) != sorted(planned):
        raise RuntimeError(
            f"the program's launch groups {sorted(groups)} differ from the host plan's "
            f"{sorted(planned)}"
        )
    stopper = ProgramStopper(job.control_address(), job.control_port)
    for label, nodes in groups.items():
        if len(nodes) != len(job.group(label).nodes):
            raise RuntimeError(
                f"launch group {label}: the program has {len(nodes)} nodes, the host plan "
                f"{len(job.group(label).nodes)}"
            )
        for node in nodes:
            node.launch_context.initialize(
                lp_context.LaunchType.LOCAL_MULTI_PROCESSING, None, stopper
            )
    for label, nodes in groups.items():
        for node in nodes:
            for handle in node.input_handles:
                handle.connect(node, label)
    for label, nodes in groups.items():
        for planned_node, node in zip(job.group(label).nodes, nodes, strict=True):
            ports = planned_node.ports
            if planned_node.name == job.coordinator:
                ports = ports[:-1]  # the last one is the stop board's
            if len(node.addresses) != len(ports):
                raise RuntimeError(
                    f"node {planned_node.name} has {len(node.addresses)} server address(es) "
                    f"but the host plan gives it the port(s) {list(ports)}"
                )
            ref = job.address_of(planned_node)
            for address, port in zip(node.addresses, ports, strict=True):
                address.bind(NodeAddress(ref, port))

    job_dir = Path(job.paths.job_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    # A node starting while the job is rewritten must never read half a file.
    for label, nodes in groups.items():
        write_atomically(
            job_dir / pickle_name(label),
            lambda path, label=label, nodes=nodes: serialization.serialize_functions(
                path, label, [node.function for node in nodes]
            ),
        )
    manifest = job_manifest(job)
    write_text_atomically(job_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return job_dir


def job_manifest(job: ClusterJob) -> dict[str, Any]:
    """What a node process needs to know about the job (written as manifest.json)."""
    control = job.control_address()
    return {
        "format": FORMAT,
        "name": job.name,
        "engine": job.engine,
        "coordinator": job.coordinator,
        "control": {"host": control.host, "host_var": control.host_var, "port": job.control_port},
        "stop": dataclasses.asdict(job.stop),
        "log_dir": job.paths.log_dir,
        "groups": {
            g.launch_group: {
                "pickle": pickle_name(g.launch_group),
                "host": g.host,
                "nodes": [n.name for n in g.nodes],
            }
            for g in job.groups
        },
        "nodes": {
            n.name: {"host": n.host, "ports": list(n.ports), "tier": n.stop_tier} for n in job.nodes
        },
    }
