"""`lp_main.py --launcher hosts|slurm|kubernetes`: the same program on several hosts.

From the config's `hosts` section this module makes the host plan (`magi_lp.cluster.host_plan`,
validated before anything starts), the `ClusterJob` the launch layer renders, and then does
one of three things:
- `--dry_run`: prints the host plan, the security warning and every generated file;
- `--render DIR`: writes the generated files to DIR (the golden files of the tests are this);
- neither: builds the program, binds every server to its planned host and port, pickles it
  into `<workdir>/cluster/job/` (`multihost.prepare_job`), writes the generated files to
  `<workdir>/cluster/`, and prints the one command that starts it (sbatch, kubectl apply,
  or one script per host).
The workdir, the code and the Python (a virtualenv) must be at the same paths on every host:
a shared filesystem (docs/cluster.md).

`python -m magi_lp.cluster --golden` regenerates the golden files in
tests/golden/cluster from configs/cluster_example.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from magi_lp import console
from magi_lp.cluster import host_scripts, kubernetes, slurm
from magi_lp.cluster.config import (
    KubernetesSettings,
    SlurmSettings,
    node_ports,
    validate_hosts_config,
)
from magi_lp.cluster.host_plan import HostPlan, HostSpec, make_host_plan
from magi_lp.cluster.job import (
    ENGINES,
    SECURITY_WARNING,
    ClusterGroup,
    ClusterHost,
    ClusterJob,
    ClusterNode,
    JobPaths,
    StopSettings,
)
from magi_lp.errors import ConfigError
from magi_lp.placement.jax_build import JaxBuild
from magi_lp.runtime.config import placement_requests, stop_tiers

LAUNCHERS = ("local", *ENGINES)
"""The `--launcher` choices."""

CLUSTER_DIR = "cluster"
"""`<workdir>/cluster`: the generated files; `<workdir>/cluster/job`: the pickled program."""


def job_name(config: ml_collections.ConfigDict, config_name: str) -> str:
    """The job's name: `hosts.name`, or the config's, as a DNS label."""
    raw = config.hosts.name or config_name
    name = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:40].strip("-")
    if not name or not name[0].isalpha():
        raise ConfigError(
            f"hosts.name={config.hosts.name!r}: the job needs a name of letters, digits and '-' "
            "starting with a letter; set hosts.name"
        )
    return name


def host_specs(config: ml_collections.ConfigDict) -> list[HostSpec]:
    """`config.hosts.machines` as the host plan's `HostSpec`s, in config order."""
    hosts = []
    for name, machine in config.hosts.machines.items():
        hosts.append(
            HostSpec(
                name=name,
                address=machine.address,
                gpus=None if machine.gpus < 0 else machine.gpus,
                gpu_model=machine.gpu_model,
                base_port=machine.base_port or None,
            )
        )
    return hosts


def plan_hosts(
    config: ml_collections.ConfigDict, launcher: str, jax_build: JaxBuild | None = None
) -> HostPlan:
    """The validated host plan of `config` for `launcher`."""
    validate_hosts_config(config)
    if launcher not in ENGINES:
        raise ConfigError(f"--launcher={launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    return make_host_plan(
        placement_requests(config),
        host_specs(config),
        config.hosts.place.to_dict(),
        ports_per_node=node_ports(config),
        base_port=config.hosts.base_port,
        port_per_pod=launcher == "kubernetes",
        jax_build=jax_build,
    )


def make_cluster_job(
    config: ml_collections.ConfigDict,
    plan: HostPlan,
    launcher: str,
    *,
    name: str,
    workdir: str,
    python: str = "",
    project_dir: str = "",
    command: str = "",
) -> ClusterJob:
    """The launch layer's description of the job (engine checks included)."""
    settings = config.hosts
    python = settings.python or python or sys.executable
    project_dir = settings.project_dir or project_dir or os.getcwd()
    for key, path in (("hosts.python", python), ("hosts.project_dir", project_dir)):
        if not os.path.isabs(path):
            raise ConfigError(f"{key}={path!r} must be an absolute path (the same on every host)")
    if not os.path.isabs(workdir):
        raise ConfigError(f"--workdir {workdir} must be an absolute path on the shared filesystem")
    paths = JobPaths(
        python=python,
        project_dir=project_dir,
        workdir=workdir,
        job_dir=str(Path(workdir) / CLUSTER_DIR / "job"),
        log_dir=str(Path(workdir) / "nodes"),
    )
    tiers = stop_tiers(several_hosts=True)
    machines = settings.machines
    groups = []
    for launch_group, placement in plan.placement.groups.items():
        host = plan.launch_group_hosts[launch_group]
        nodes = tuple(
            # A group stop_tiers does not know stops with the learner: after the actors,
            # before the servers.
            ClusterNode(n.launch_group, n.task, n.host, n.ports, tiers.get(n.group, 1))
            for n in plan.launch_group_nodes(launch_group)
        )
        env = dict(placement.env)
        gpus = len(placement.gpu_ids)
        if launcher == "kubernetes" and gpus:
            # A pod sees only the GPUs it was given, numbered from 0.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
        groups.append(
            ClusterGroup(
                launch_group=launch_group,
                host=host,
                env=env,
                nodes=nodes,
                gpus=gpus,
                cpus=_cpus_per_node(config, plan, launch_group),
                summary=_summary(placement, nodes),
            )
        )
    hosts = tuple(
        ClusterHost(
            name=h.name,
            address=h.address,
            gpus=h.gpus if h.gpus is not None else _assumed_gpus(plan, h.name),
            node_selector=machines[h.name].node_selector,
        )
        for h in plan.hosts
    )
    engine = {"slurm": settings.slurm, "kubernetes": settings.kubernetes}.get(launcher)
    job = ClusterJob(
        engine=launcher,
        name=name,
        hosts=hosts,
        groups=tuple(groups),
        coordinator=plan.node("coordinator", 0).name,
        paths=paths,
        stop=StopSettings(
            poll_seconds=settings.poll_seconds,
            notice_seconds=settings.stop_notice_seconds,
            heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
            start_timeout_seconds=settings.start_timeout_seconds,
        ),
        settings=engine.to_dict() if engine is not None else {},
        command=command,
    )
    _check_engine(job, plan)
    return job


def _summary(placement: Any, nodes: tuple[ClusterNode, ...]) -> str:
    indices = ", ".join(str(i) for i in placement.node_indices)
    device = placement.device
    if placement.gpu_ids:
        device += " " + ",".join(str(i) for i in placement.gpu_ids)
    return f"{placement.group} node(s) {indices}: {device}"


def _assumed_gpus(plan: HostPlan, host: str) -> int:
    ids = [
        i
        for name, p in plan.placement.groups.items()
        if plan.launch_group_hosts[name] == host
        for i in p.gpu_ids
    ]
    return max(ids) + 1 if ids else 0


def _cpus_per_node(
    config: ml_collections.ConfigDict, plan: HostPlan, launch_group: str
) -> int | None:
    """CPUs to ask the engine for per node: cpu_threads, else a share of the host's cores."""
    placement = plan.placement.groups[launch_group]
    threads = config.resources[placement.group].cpu_threads
    if threads:
        return int(threads)
    host = plan.launch_group_hosts[launch_group]
    cores = config.hosts.machines[host].cpus
    if not cores:
        return None
    taken, unset = 0, 0
    for node in plan.nodes_on(host):
        own = config.resources[node.group].cpu_threads
        if own:
            taken += int(own)
        else:
            unset += 1
    return max(1, (cores - taken) // max(1, unset))


def _check_engine(job: ClusterJob, plan: HostPlan) -> None:
    """What one engine needs beyond the plan (ConfigError naming the key)."""
    if job.engine == "hosts":
        for host in job.hosts:
            if not host.address and job.groups_on(host.name):
                raise ConfigError(
                    f"hosts.machines.{host.name}.address is empty; --launcher hosts needs the "
                    "private-network address (IP or name) of every host that runs nodes"
                )
    if job.engine == "kubernetes":
        k8s = KubernetesSettings(**job.settings)
        if not k8s.image:
            raise ConfigError(
                "hosts.kubernetes.image is empty; give the image that holds the code at "
                "hosts.project_dir and the virtualenv at hosts.python"
            )
        if not k8s.volume_claim:
            raise ConfigError(
                "hosts.kubernetes.volume_claim is empty; give the PersistentVolumeClaim "
                "(ReadWriteMany) that holds the workdir, shared by every pod"
            )
        mount = k8s.volume_mount.rstrip("/") or "/"
        if not (job.paths.workdir + "/").startswith(mount + "/"):
            raise ConfigError(
                f"--workdir {job.paths.workdir} is not inside hosts.kubernetes.volume_mount="
                f"{k8s.volume_mount!r}; pods see the shared volume only there"
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
                    f"machine {host.name}: GPU {gpu} would be shared by {', '.join(nodes)}, but "
                    "Kubernetes gives each pod whole GPUs of its own; give those groups "
                    "gpu_distribution='round_robin' and enough GPUs, or fewer GPU nodes"
                )
    if job.engine == "slurm":
        SlurmSettings(**job.settings)


def render(job: ClusterJob) -> dict[str, str]:
    """The generated files of `job`: file name -> text."""
    if job.engine == "slurm":
        return {f"{job.name}.sbatch": slurm.render_sbatch(job)}
    if job.engine == "kubernetes":
        return {f"{job.name}.yaml": kubernetes.render_manifests(job)}
    return host_scripts.render_host_scripts(job)


def start_command(job: ClusterJob, folder: Path) -> str:
    """What the user runs next to start the prepared job."""
    if job.engine == "slurm":
        return f"sbatch {shlex.quote(str(folder / f'{job.name}.sbatch'))}"
    if job.engine == "kubernetes":
        return f"kubectl apply -f {shlex.quote(str(folder / f'{job.name}.yaml'))}"
    lines = ["run each host's script on that host, at the same time (e.g. through ssh):"]
    for host in job.hosts:
        if job.groups_on(host.name):
            script = folder / host_scripts.script_name(host.name)
            lines.append(f"  {host.name} ({host.address}): bash {shlex.quote(str(script))}")
    return "\n".join(lines)


def write_files(files: Mapping[str, str], folder: Path) -> list[Path]:
    """Writes the generated files (scripts executable); returns their paths."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--render {folder}: cannot create it ({error.strerror})") from None
    written = []
    for name, text in files.items():
        path = folder / name
        path.write_text(text)
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        written.append(path)
    return written


def run(
    config: ml_collections.ConfigDict,
    *,
    launcher: str,
    workdir: Path,
    config_name: str,
    dry_run: bool,
    render_dir: str | None,
    build_program: Callable[[Any], Any],
    command: str = "",
) -> int:
    """The body of `lp_main.py --launcher <engine>` (see the module docstring).

    Args:
      build_program: placement plan -> the Launchpad program (called only to prepare).
    """
    if launcher == "local":
        raise ConfigError("--render writes cluster files; add --launcher hosts|slurm|kubernetes")
    plan = plan_hosts(config, launcher)
    job = make_cluster_job(
        config,
        plan,
        launcher,
        name=job_name(config, config_name),
        workdir=str(workdir),
        command=command,
    )
    files = render(job)
    if dry_run:
        # The plan and the files are this command's result: stdout.
        for notice in plan.notices:
            print(f"notice: {notice}")
        print(plan.format_table())
        print()
        print("!" * 100)
        print(SECURITY_WARNING)
        print("!" * 100)
        for name, text in files.items():
            print(f"\n===== {name} =====")
            print(text, end="" if text.endswith("\n") else "\n")
        return 0
    for notice in plan.notices:
        console.say(f"notice: {notice}")
    console.say(SECURITY_WARNING)
    if render_dir:
        for path in write_files(files, Path(render_dir).absolute()):
            console.say(f"wrote {path}")
        return 0

    from magi_lp.cluster.prepare import prepare_job

    program = build_program(plan.placement)
    job_dir = prepare_job(program, job)
    folder = Path(workdir) / CLUSTER_DIR
    # SLURM opens the job's --output (in the log folder) before the script runs, and does
    # not make its folder: without it the job fails at once, with no output anywhere.
    Path(job.paths.log_dir).mkdir(parents=True, exist_ok=True)
    for path in write_files(files, folder):
        console.say(f"wrote {path}")
    console.say(f"prepared the program for {len(job.nodes)} nodes in {job_dir}")
    if job.engine == "slurm" and job.settings.get("submit", True) and shutil.which("sbatch"):
        return submit_sbatch(job, folder)
    console.say(f"to start it: {start_command(job, folder)}")
    return 0


def submit_sbatch(job: ClusterJob, folder: Path) -> int:
    """`sbatch` the prepared job: 0 and the job id in one line, or 1 and what SLURM said.

    A request the cluster can never satisfy (GPUs it lacks, more nodes than it has, an
    unknown partition) is refused by sbatch at once, before anything is queued.
    """
    script = folder / f"{job.name}.sbatch"
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


# The golden files: what `--render` writes for configs/cluster_example.py on a login node
# whose shared virtualenv has the CUDA 12 build of JAX, with fixed paths.
GOLDEN_CONFIG = "configs/cluster_example.py"
GOLDEN_DIR = "tests/golden/cluster"
GOLDEN_WORKDIR = "/shared/runs/cluster_example"
GOLDEN_PYTHON = "/shared/magi_lp/.venv/bin/python"
GOLDEN_PROJECT = "/shared/magi_lp"
GOLDEN_COMMAND = (
    "python projects/drq_v2/lp_main.py --config configs/cluster_example.py:{launcher} "
    "--workdir /shared/runs/cluster_example --launcher {launcher} --render DIR"
)


def golden_jax_build() -> JaxBuild:
    """A JAX build with the CUDA 12 plugin (what a GPU cluster's venv has)."""
    from magi_lp.placement.jax_build import CudaPlugin

    return JaxBuild(
        jaxlib_version="0.4.30",
        cuda_plugins=(CudaPlugin("jax_plugins.xla_cuda12", 12, "0.4.30"),),
        cuda_nvcc_dir="/shared/magi_lp/.venv/lib/python3.10/site-packages/nvidia/cuda_nvcc",
    )


def load_config_file(path: str, argument: str = "") -> ml_collections.ConfigDict:
    """Runs a config file's `get_config(argument)` (as `--config path:argument` does)."""
    spec = importlib.util.spec_from_file_location("_magi_lp_cluster_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(argument) if argument else module.get_config()


def golden_files(root: Path) -> dict[str, str]:
    """Relative path -> text of every golden file (one folder per launcher)."""
    out = {}
    for launcher in ENGINES:
        config = load_config_file(str(root / GOLDEN_CONFIG), launcher)
        plan = plan_hosts(config, launcher, jax_build=golden_jax_build())
        job = make_cluster_job(
            config,
            plan,
            launcher,
            name=job_name(config, Path(GOLDEN_CONFIG).stem),
            workdir=GOLDEN_WORKDIR,
            python=GOLDEN_PYTHON,
            project_dir=GOLDEN_PROJECT,
            command=GOLDEN_COMMAND.format(launcher=launcher),
        )
        job = dataclasses.replace(
            job,
            paths=dataclasses.replace(job.paths, python=GOLDEN_PYTHON, project_dir=GOLDEN_PROJECT),
        )
        for name, text in render(job).items():
            out[f"{launcher}/{name}"] = text
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m magi_lp.cluster --golden` (`make golden`): rewrites the golden files."""
    parser = argparse.ArgumentParser(prog="python -m magi_lp.cluster")
    parser.add_argument("--golden", action="store_true", help=f"rewrite {GOLDEN_DIR}/")
    parser.add_argument("--root", default=".", help="the project folder")
    args = parser.parse_args(argv)
    if not args.golden:
        parser.error("nothing to do; pass --golden")
    root = Path(args.root).absolute()
    for relative, text in golden_files(root).items():
        path = root / GOLDEN_DIR / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        console.say(f"wrote {path}", source="golden")
    return 0
