"""The engines that start a program on several machines, one object each.

`--launcher hosts|slurm|kubernetes` names the engine; the stack decides what runs the program
graph on the machines: Launchpad where it is installed (Python 3.10: the program pickled
ahead, one process per node started by the engine's own files), else a Ray cluster inside the
job (Python 3.12: the entry point runs again there as the driver with `--launcher ray`). Each
engine is one object with what differs between them: how it plans ports, what it refuses,
what files it writes, what it prepares and how the job starts. `magi_lp.cluster.main` calls
them and never tests an engine's name.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from magi_lp import console
from magi_lp.cluster import host_scripts, kuberay, kubernetes, ray_slurm, slurm
from magi_lp.cluster.config import KubernetesSettings, SlurmSettings
from magi_lp.cluster.host_plan import HostPlan
from magi_lp.cluster.job import SECURITY_WARNING, ClusterHost, ClusterJob
from magi_lp.cluster.ray_cluster import RAY_SECURITY, RayPorts, machine_nodes, ray_cli, ray_ports
from magi_lp.config_schema import fact_refusal
from magi_lp.engines import REGISTRY
from magi_lp.errors import ConfigError
from magi_lp.stack import stack_here


class ClusterEngine:
    """One `--launcher` value on several machines (the base: what every engine shares).

    Attributes:
      launcher: the `--launcher` value ("hosts", "slurm", "kubernetes").
      runtime: what runs the graph there: "launchpad" (a pickled program, a process per node)
        or "ray" (a Ray cluster, the driver with `--launcher ray`).
      port_per_pod: every node is its own host (a pod) in the host plan.
      security: the warning every dry run prints and every file starts with.
    """

    launcher = ""
    runtime = "launchpad"
    port_per_pod = False
    security = SECURITY_WARNING

    def settings(self, hosts: Any) -> Mapping[str, Any]:
        """The engine's own settings (`config.hosts.<launcher>`), as a dict."""
        return {}

    def group_env(self, env: dict[str, str], gpus: int) -> dict[str, str]:
        """A launch group's env as its nodes get it from this engine."""
        return env

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        """What this engine needs beyond the plan (ConfigError naming the key)."""

    def ports_of_host(self, job: ClusterJob) -> dict[str, str]:
        """The plan table's ports column where this engine's servers take other ports than
        the plan's (host name -> text); empty: the plan's."""
        return {}

    def render(self, job: ClusterJob) -> dict[str, str]:
        """The generated files: file name -> text."""
        raise NotImplementedError

    def start_command(self, job: ClusterJob, folder: Path) -> str:
        """What the user runs next to start the prepared job."""
        raise NotImplementedError

    @property
    def pickles_program(self) -> bool:
        """Whether the job's nodes load a program pickled ahead (Launchpad)."""
        return self.runtime == "launchpad"

    def start(self, job: ClusterJob, folder: Path) -> int:
        """After the files are written: start the job, or say how to."""
        console.say(f"to start it: {self.start_command(job, folder)}")
        return 0

    def describe(self) -> str:
        return f"--launcher {self.launcher} ({self.runtime})"


class HostsEngine(ClusterEngine):
    """Per-host scripts, run by hand on every machine (Launchpad)."""

    launcher = "hosts"

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        for host in job.hosts:
            if not host.address and job.groups_on(host.name):
                raise ConfigError(
                    fact_refusal(
                        f"hosts.machines.{host.name}.address is empty",
                        "--launcher hosts needs the private-network address (IP or name) of "
                        "every host that runs nodes",
                        f"set hosts.machines.{host.name}.address",
                    )
                )

    def render(self, job: ClusterJob) -> dict[str, str]:
        return host_scripts.render_host_scripts(job)

    def start_command(self, job: ClusterJob, folder: Path) -> str:
        lines = ["run each host's script on that host, at the same time (e.g. through ssh):"]
        for host in job.hosts:
            if job.groups_on(host.name):
                script = folder / host_scripts.script_name(host.name)
                lines.append(f"  {host.name} ({host.address}): bash {shlex.quote(str(script))}")
        return "\n".join(lines)


class _Slurm(ClusterEngine):
    """What both SLURM engines share: the settings and `sbatch`."""

    launcher = "slurm"

    def settings(self, hosts: Any) -> Mapping[str, Any]:
        return hosts.slurm.to_dict()

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        SlurmSettings(**job.settings)

    def script(self, job: ClusterJob) -> str:
        return f"{job.name}.sbatch"

    def start_command(self, job: ClusterJob, folder: Path) -> str:
        return f"sbatch {shlex.quote(str(folder / self.script(job)))}"

    def start(self, job: ClusterJob, folder: Path) -> int:
        if job.settings.get("submit", True) and shutil.which("sbatch"):
            for missing in not_on_the_submit_host(job, self.runtime):
                console.say(f"warning: {missing}")
            refused = slurm_fit(job, _sinfo_nodes())
            if refused:
                console.error(f"SLURM cannot run the job: {refused}")
                return 1
            return submit_sbatch(job, folder / self.script(job))
        return super().start(job, folder)


def not_on_the_submit_host(job: ClusterJob, runtime: str) -> list[str]:
    """The job's paths this machine lacks, a line each.

    A SLURM job's machines see the submit host's filesystem as a rule (the code and the
    virtualenv on a shared one): a path missing here is then missing there, and every step
    fails at its start (a Ray-stack job given the Launchpad venv's Python ran a `ray` that is
    not beside it). Said, not refused: a cluster may keep them elsewhere.
    """
    needed = [("hosts.python", job.paths.python), ("hosts.project_dir", job.paths.project_dir)]
    if runtime == "ray":
        needed.append(("the `ray` beside hosts.python", ray_cli(job)))
    return [
        f"{what} {path} is not on this machine: the job's machines need it at that path "
        "(set hosts.python / hosts.project_dir to the ones they share)"
        for what, path in needed
        if not os.path.exists(path)
    ]


class SlurmEngine(_Slurm):
    """A SLURM batch script with one srun step per launch group (Launchpad)."""

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        super().check(job, plan)
        for host in job.hosts:
            # CPU steps run with --exact: past the machine's CPUs, a step waits for CPUs
            # that the steps before it hold for the whole job.
            steps = [g for g in job.groups_on(host.name) if not g.gpus and g.cpus]
            asked = sum(g.cpus * len(g.nodes) for g in steps)
            if host.cpus and asked > host.cpus:
                listed = ", ".join(f"{g.launch_group} {g.cpus * len(g.nodes)}" for g in steps)
                raise ConfigError(
                    fact_refusal(
                        f"machine {host.name}: its srun steps ask for {asked} CPUs ({listed})",
                        f"hosts.machines.{host.name}.cpus={host.cpus}, and a step past them "
                        "would wait for the whole job",
                        "lower resources.<group>.cpu_threads, place fewer nodes there, or give "
                        "the CPUs SLURM counts on that machine (its hardware threads, where "
                        "SLURM counts those)",
                    )
                )

    def render(self, job: ClusterJob) -> dict[str, str]:
        return {self.script(job): slurm.render_sbatch(job)}


class RaySlurmEngine(_Slurm):
    """A SLURM batch script that starts a Ray cluster across the job's machines and runs the
    driver there (`magi_lp.cluster.ray_slurm`)."""

    runtime = "ray"
    security = RAY_SECURITY
    port_per_pod = True  # the plan's node ports are Launchpad's; Ray's are checked here

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        super().check(job, plan)
        _check_ray_ports(job)

    def ports_of_host(self, job: ClusterJob) -> dict[str, str]:
        """Ray's block of each machine (its servers and workers), not Launchpad's ports."""
        return {host.name: f"{ports.base}-{ports.last} (Ray's)" for host, ports in _ray_blocks(job)}

    def render(self, job: ClusterJob) -> dict[str, str]:
        return {self.script(job): ray_slurm.render_ray_sbatch(job)}


class _Kubernetes(ClusterEngine):
    """What both Kubernetes engines share: the settings, the volume, whole GPUs per pod."""

    launcher = "kubernetes"

    def settings(self, hosts: Any) -> Mapping[str, Any]:
        return hosts.kubernetes.to_dict()

    def file(self, job: ClusterJob) -> str:
        return f"{job.name}.yaml"

    def start_command(self, job: ClusterJob, folder: Path) -> str:
        return f"kubectl apply -f {shlex.quote(str(folder / self.file(job)))}"

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        k8s = KubernetesSettings(**job.settings)
        if not k8s.image:
            raise ConfigError(
                fact_refusal(
                    "hosts.kubernetes.image is empty",
                    "",
                    "give the image that holds the code at hosts.project_dir and the "
                    "virtualenv at hosts.python",
                )
            )
        if not k8s.volume_claim:
            raise ConfigError(
                fact_refusal(
                    "hosts.kubernetes.volume_claim is empty",
                    "",
                    "give the PersistentVolumeClaim (ReadWriteMany) that holds the workdir, "
                    "shared by every pod",
                )
            )
        mount, workdir = PurePosixPath(k8s.volume_mount), PurePosixPath(job.paths.workdir)
        if mount != workdir and mount not in workdir.parents:
            raise ConfigError(
                fact_refusal(
                    f"--workdir {job.paths.workdir} is not inside hosts.kubernetes.volume_mount="
                    f"{k8s.volume_mount!r}",
                    "pods see the shared volume only there",
                    "put the workdir on the volume, or mount the volume above it",
                )
            )


class KubernetesEngine(_Kubernetes):
    """Indexed Jobs and a headless Service, a pod per node (Launchpad)."""

    port_per_pod = True

    def group_env(self, env: dict[str, str], gpus: int) -> dict[str, str]:
        if gpus:
            # A pod sees only the GPUs it was given, numbered from 0.
            env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus))}
        return env

    def check(self, job: ClusterJob, plan: HostPlan) -> None:
        super().check(job, plan)
        longest = max((job.pod_name(node) for node in job.nodes), key=len)
        if len(longest) > 63:  # a pod's host name (and its Job's label) is a DNS label
            raise ConfigError(
                fact_refusal(
                    f"the pod name {longest!r} ({len(longest)} characters)",
                    "Kubernetes takes at most 63: <hosts.name>-<launch group>-<index>",
                    "give a shorter hosts.name, or shorter machine names",
                )
            )
        for host in job.hosts:
            used: dict[int, list[str]] = {}
            for name, p in plan.placement.groups.items():
                if plan.launch_group_hosts[name] != host.name:
                    continue
                for index in p.node_indices:
                    for gpu in p.gpu_ids:
                        used.setdefault(gpu, []).append(f"{p.group}/{index}")
            shared = {gpu: nodes for gpu, nodes in used.items() if len(nodes) > 1}
            if shared:
                gpu, nodes = sorted(shared.items())[0]
                raise ConfigError(
                    fact_refusal(
                        f"machine {host.name}: GPU {gpu} would be shared by {', '.join(nodes)}",
                        "Kubernetes gives each pod whole GPUs of its own",
                        "give those groups gpu_distribution='round_robin' and enough GPUs, or "
                        "fewer GPU nodes",
                    )
                )

    def render(self, job: ClusterJob) -> dict[str, str]:
        return {self.file(job): kubernetes.render_manifests(job)}


class KubeRayEngine(_Kubernetes):
    """A KubeRay RayJob: a worker group per machine, the driver on the head
    (`magi_lp.cluster.kuberay`). A machine's pod has all the machine's GPUs, so GPU ids are
    the plan's, and nodes may share a GPU as on one machine."""

    runtime = "ray"
    security = RAY_SECURITY
    port_per_pod = True  # every machine is a pod, with Ray's default ports

    def render(self, job: ClusterJob) -> dict[str, str]:
        return {self.file(job): kuberay.render_rayjob(job)}


def _sinfo_nodes() -> list[tuple[str, str]] | None:
    """(node, partition) of every node `sinfo` lists ("debug*": the default partition); None
    where sinfo cannot say."""
    try:
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%P"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    pairs = [line.strip().split("|") for line in result.stdout.splitlines()]
    return [(p[0], p[1]) for p in pairs if len(p) == 2]


def slurm_fit(job: ClusterJob, nodes: list[tuple[str, str]] | None) -> str:
    """Why the cluster can never run `job` ("" where it can, or where `nodes` is None).

    Every host of the plan is one whole node (a component of the heterogeneous job). SLURM
    refuses at once a component no node can hold (GPUs it lacks: `sbatch: error: ...`), but
    accepts a job of more components than the partition has nodes, which then waits forever
    (state PD, reason Resources): counted here.
    """
    if not nodes:
        return ""
    partition = job.settings.get("partition", "")
    if partition:
        usable = {n for n, p in nodes if p.rstrip("*") == partition}
        where = f"partition {partition}"
    else:
        usable = {n for n, p in nodes if p.endswith("*")}
        default = next((p.rstrip("*") for _, p in nodes if p.endswith("*")), "")
        where = f"the default partition {default}".rstrip()
    hosts = [h.name for h in job.hosts if job.groups_on(h.name)]
    if usable and len(hosts) > len(usable):
        return fact_refusal(
            f"the plan has {len(hosts)} hosts ({', '.join(hosts)}), each a whole node of its own",
            f"{where} has {len(usable)} node(s)",
            "place the groups on fewer hosts (hosts.place), or choose a larger partition "
            "(hosts.slurm.partition)",
        )
    return ""


def submit_sbatch(job: ClusterJob, script: Path) -> int:
    """`sbatch` the prepared job: 0 and the job id in one line, or 1 and what SLURM said.

    A request the cluster can never satisfy (GPUs it lacks, an unknown partition) is refused
    by sbatch at once, before anything is queued (more hosts than nodes: `slurm_fit`).
    """
    try:
        result = subprocess.run(
            ["sbatch", "--parsable", str(script)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=job.paths.project_dir,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        console.error(f"sbatch {script} failed: {error}; start it by hand: sbatch {script}")
        return 1
    said = " ".join(result.stderr.split())
    if result.returncode != 0:
        console.error(f"SLURM refused the job: {said or f'sbatch exited {result.returncode}'}")
        return 1
    job_id = result.stdout.strip().split(";")[0]
    console.say(
        f"submitted batch job {job_id}: output {job.paths.log_dir}/slurm-{job_id}.out, node "
        f"logs {job.paths.log_dir}/<group>/<task>; stop it with scancel {job_id}"
    )
    return 0


def _ray_blocks(job: ClusterJob) -> list[tuple[ClusterHost, RayPorts]]:
    """Each machine that runs nodes, with the port block its Ray takes."""
    blocks = []
    for host in job.hosts:
        nodes = machine_nodes(job, host.name)
        if nodes:
            blocks.append((host, ray_ports(host.base_port, nodes)))
    return blocks


def _check_ray_ports(job: ClusterJob) -> None:
    """Every machine's Ray ports inside 1024-65535; machines at one address (loopback, the
    same IP) in ranges of their own."""
    from magi_lp.cluster.host_plan import MAX_PORT, HostSpec, _address_key

    taken: dict[str, list[tuple[int, int, str]]] = {}
    for host, ports in _ray_blocks(job):
        if ports.last > MAX_PORT:
            raise ConfigError(
                fact_refusal(
                    f"machine {host.name}'s Ray ports {ports.base}-{ports.last}",
                    f"beyond {MAX_PORT}",
                    f"lower hosts.base_port (or hosts.machines.{host.name}.base_port)",
                )
            )
        key = _address_key(HostSpec(host.name, host.address))
        for low, high, other in taken.get(key, []):
            if ports.base <= high and low <= ports.last:
                raise ConfigError(
                    fact_refusal(
                        f"machines {other} and {host.name} share an address and their Ray "
                        f"ports {low}-{high} and {ports.base}-{ports.last}",
                        "Ray's servers listen on every interface",
                        f"give hosts.machines.{host.name}.base_port a range of its own",
                    )
                )
        taken.setdefault(key, []).append((ports.base, ports.last, host.name))


_CLASSES = (HostsEngine, SlurmEngine, KubernetesEngine, RaySlurmEngine, KubeRayEngine)

_ENGINES: dict[tuple[str, str], ClusterEngine] = {
    (e.name, e.stack): {c.__name__: c for c in _CLASSES}[e.cluster_engine]()
    for e in REGISTRY.values()
    if e.cluster_engine is not None
}
"""The several-hosts engines of `magi_lp.engines.REGISTRY`, by launcher and stack (runtime)."""


def engine_of(job: ClusterJob) -> ClusterEngine:
    """The engine that made `job`."""
    return _ENGINES[(job.engine, job.runtime)]


def cluster_engine(launcher: str, runtime: str | None = None) -> ClusterEngine:
    """The engine of `--launcher launcher`: Launchpad's where it is installed (or `runtime`
    says so), else Ray's."""
    runtime = runtime or stack_here()
    engine = _ENGINES.get((launcher, runtime))
    if engine is not None:
        return engine
    others = sorted(name for name, r in _ENGINES if r == runtime)
    raise ConfigError(
        fact_refusal(
            f"--launcher {launcher}",
            f"it starts Launchpad nodes, and Launchpad is not installed here (runtime {runtime})",
            f"use --launcher {' or '.join(others)} (a Ray cluster), or the Launchpad stack "
            "(`make setup`, .venv)",
        )
    )
