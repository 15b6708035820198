"""`lp_main.py --launcher hosts|slurm|kubernetes`: the same program on several hosts.

From the config's `hosts` section this module makes the host plan (`magi_lp.cluster.host_plan`,
validated before anything starts), the `ClusterJob` the launch layer renders, and then does
one of three things:
- `--dry_run`: prints the host plan, the security warning and every generated file;
- `--render DIR`: writes the generated files to DIR (the golden files of the tests are this);
- neither: on the Launchpad stack builds the program, binds every server to its planned host
  and port and pickles it into `<workdir>/cluster/job/` (`prepare.prepare_job`; the Ray
  stack's engines pickle nothing: their driver builds it), writes the generated files to
  `<workdir>/cluster/`, and starts the job (`sbatch`, for SLURM unless
  `hosts.slurm.submit=False`) or prints the command that does (kubectl apply, one script per
  host).
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
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from magi_lp import console
from magi_lp.cluster.config import node_ports, validate_hosts_config
from magi_lp.cluster.engines import ClusterEngine, cluster_engine, engine_of, submit_sbatch
from magi_lp.cluster.host_plan import HostPlan, HostSpec, make_host_plan
from magi_lp.cluster.job import (
    ClusterGroup,
    ClusterHost,
    ClusterJob,
    ClusterNode,
    JobPaths,
    StopSettings,
)
from magi_lp.cluster.ray_cluster import driver_argv
from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.engines import REGISTRY, several_hosts_launchers
from magi_lp.engines.base import HOST_SHARE, HostsLaunch, Launch, host_resource
from magi_lp.errors import ConfigError
from magi_lp.placement.jax_build import JaxBuild
from magi_lp.placement.plan import PlacementPlan
from magi_lp.runtime.config import placement_requests, stop_tiers
from magi_lp.runtime.workdir import Workdir

__all__ = ["submit_sbatch"]  # re-exported: the SLURM engines submit with it


def job_name(config: ml_collections.ConfigDict, config_name: str) -> str:
    """The job's name: `hosts.name`, or the config's, as a DNS label."""
    raw = config.hosts.name or config_name
    name = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")[:40].strip("-")
    if not name or not name[0].isalpha():
        raise ConfigError(
            refusal(
                "hosts.name",
                "a name of letters, digits and '-' starting with a letter",
                config.hosts.name,
                "set hosts.name (the job's name in files, jobs and pods)",
            )
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


def _engine(launcher: str | ClusterEngine) -> ClusterEngine:
    if isinstance(launcher, ClusterEngine):
        return launcher
    if launcher not in several_hosts_launchers():
        raise ConfigError(
            fact_refusal(
                f"--launcher {launcher} runs on one machine",
                "the files of several hosts come from hosts, slurm or kubernetes",
                f"choose one of {', '.join(several_hosts_launchers())}",
            )
        )
    return cluster_engine(launcher)


def plan_hosts(
    config: ml_collections.ConfigDict,
    launcher: str | ClusterEngine,
    jax_build: JaxBuild | None = None,
) -> HostPlan:
    """The validated host plan of `config` for `launcher` (its name: this stack's engine)."""
    validate_hosts_config(config)
    engine = _engine(launcher)
    return make_host_plan(
        placement_requests(config),
        host_specs(config),
        config.hosts.place.to_dict(),
        ports_per_node=node_ports(config),
        base_port=config.hosts.base_port,
        port_per_pod=engine.port_per_pod,
        jax_build=jax_build,
    )


def joined_cluster_plan(
    config: ml_collections.ConfigDict,
) -> tuple[PlacementPlan, dict[str, dict[str, float]]]:
    """Inside a Ray cluster of several machines (the driver of `--launcher slurm|kubernetes`
    on the current stack): the host plan's placement, and each launch group's custom
    resource, `{host_resource(its machine): HOST_SHARE}`, for `Launch.group_resources`."""
    plan = plan_hosts(config, cluster_engine("slurm", "ray"))
    resources = {
        group: {host_resource(host): HOST_SHARE} for group, host in plan.launch_group_hosts.items()
    }
    return plan.placement, resources


def make_cluster_job(
    config: ml_collections.ConfigDict,
    plan: HostPlan,
    launcher: str | ClusterEngine,
    *,
    name: str,
    workdir: str,
    python: str = "",
    project_dir: str = "",
    command: str = "",
    driver: tuple[str, ...] = (),
) -> ClusterJob:
    """The launch layer's description of the job (engine checks included).

    Args:
      driver: a Ray engine's driver (`ray_cluster.driver_argv`); empty: made from `command`.
    """
    engine = _engine(launcher)
    settings = config.hosts
    python = settings.python or python or sys.executable
    project_dir = settings.project_dir or project_dir or os.getcwd()
    for key, path in (("hosts.python", python), ("hosts.project_dir", project_dir)):
        if not os.path.isabs(path):
            raise ConfigError(
                refusal(key, "an absolute path (the same on every host)", path, "give one")
            )
    if not os.path.isabs(workdir):
        raise ConfigError(
            refusal(
                "--workdir",
                "an absolute path on the shared filesystem",
                workdir,
                "give one every host sees",
            )
        )
    paths = JobPaths(
        python=python,
        project_dir=project_dir,
        workdir=workdir,
        job_dir=str(Workdir(workdir).cluster_job),
        log_dir=str(Workdir(workdir).nodes),
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
        gpus = len(placement.gpu_ids)
        env = engine.group_env(dict(placement.env), gpus)
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
            cpus=machines[h.name].cpus,
            base_port=h.base_port if h.base_port is not None else settings.base_port,
        )
        for h in plan.hosts
    )
    if engine.runtime == "ray" and not driver and command:
        driver = tuple(driver_argv(command, workdir, os.getcwd()))
    job = ClusterJob(
        engine=engine.launcher,
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
        settings=dict(engine.settings(settings)),
        command=command,
        runtime=engine.runtime,
        driver=tuple(driver),
    )
    engine.check(job, plan)
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


def render(job: ClusterJob) -> dict[str, str]:
    """The generated files of `job`: file name -> text."""
    return engine_of(job).render(job)


def start_command(job: ClusterJob, folder: Path) -> str:
    """What the user runs next to start the prepared job."""
    return engine_of(job).start_command(job, folder)


def write_files(files: Mapping[str, str], folder: Path) -> list[Path]:
    """Writes the generated files (scripts executable); returns their paths."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            fact_refusal(f"--render {folder}: cannot create it", error.strerror, "pick another")
        ) from None
    written = []
    for name, text in files.items():
        path = folder / name
        try:
            path.write_text(text)
        except OSError as error:
            raise ConfigError(
                fact_refusal(f"{path}: cannot write it", str(error.strerror), "pick another folder")
            ) from None
        if name.endswith((".sh", ".sbatch")):
            path.chmod(0o755)
        written.append(path)
    return written


def run(launch: Launch) -> int:
    """`--launcher hosts|slurm|kubernetes`: the engine of several hosts (`launch.hosts`)."""
    hosts = launch.hosts
    if hosts is None:
        raise ValueError("an engine of several hosts is handed a Launch with its hosts")
    return run_job(hosts, launch.workdir)


def run_job(hosts: HostsLaunch, workdir: Path) -> int:
    """The body of `lp_main.py --launcher <engine>` (see the module docstring): renders the
    job's files and prints them (`hosts.dry_run`), writes them (`hosts.render_dir`), or
    prepares the job in `workdir` and starts it."""
    config, launcher = hosts.config, hosts.launcher
    if launcher not in several_hosts_launchers():
        raise ConfigError(
            fact_refusal(
                "--render writes cluster files", "", "add --launcher hosts|slurm|kubernetes"
            )
        )
    engine = cluster_engine(launcher)
    plan = plan_hosts(config, engine)
    job = make_cluster_job(
        config,
        plan,
        engine,
        name=job_name(config, hosts.config_name),
        workdir=str(workdir),
        command=hosts.command,
    )
    files = engine.render(job)
    if hosts.dry_run:
        # The plan and the files are this command's result: stdout.
        print(f"engine: {engine.describe()}")
        for notice in plan.notices:
            print(f"notice: {notice}")
        print(plan.format_table(engine.ports_of_host(job)))
        print()
        print("!" * 100)
        print(engine.security)
        print("!" * 100)
        for name, text in files.items():
            print(f"\n===== {name} =====")
            print(text, end="" if text.endswith("\n") else "\n")
        return 0
    for notice in plan.notices:
        console.say(f"notice: {notice}")
    console.say(engine.security)
    if hosts.render_dir:
        for path in write_files(files, Path(hosts.render_dir).absolute()):
            console.say(f"wrote {path}")
        return 0

    folder = Workdir(workdir).cluster
    if engine.pickles_program:
        from magi_lp.cluster.prepare import prepare_job

        program = hosts.build_program(plan.placement)
        job_dir = prepare_job(program, job)
    # SLURM opens the job's --output (in the log folder) before the script runs, and does
    # not make its folder: without it the job fails at once, with no output anywhere.
    try:
        Path(job.paths.log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            fact_refusal(
                f"--workdir {workdir}: cannot create {job.paths.log_dir}",
                str(error.strerror),
                "pick a workdir you can write to",
            )
        ) from None
    for path in write_files(files, folder):
        console.say(f"wrote {path}")
    if engine.pickles_program:
        console.say(f"prepared the program for {len(job.nodes)} nodes in {job_dir}")
    else:
        console.say(
            f"the driver builds the program of {len(job.nodes)} nodes in the job: "
            f"{' '.join(job.driver[:1])} ... --launcher=ray"
        )
    return engine.start(job, folder)


# The golden files: what `--render` writes for configs/cluster_example.py on a login node
# whose shared virtualenv has the CUDA 12 build of JAX, with fixed paths.
GOLDEN_CONFIG = "configs/cluster_example.py"
GOLDEN_DIR = "tests/golden/cluster"
GOLDEN_WORKDIR = "/shared/runs/cluster_example"
GOLDEN_PYTHON = "/shared/magi_lp/.venv/bin/python"
GOLDEN_PYTHON_RAY = "/shared/magi_lp/.venv312/bin/python"
GOLDEN_PROJECT = "/shared/magi_lp"
GOLDEN_COMMAND = (
    "python projects/drq_v2/lp_main.py --config configs/cluster_example.py:{launcher} "
    "--workdir /shared/runs/cluster_example --launcher {launcher} --render DIR"
)


def golden_jax_build(runtime: str = "launchpad") -> JaxBuild:
    """A JAX build with a CUDA plugin (what a GPU cluster's venv has): CUDA 12 and jax 0.4.30
    on the Launchpad stack, CUDA 13 and jax 0.11.2 on the current one (Ray)."""
    from magi_lp.placement.jax_build import CudaPlugin

    if runtime == "ray":
        return JaxBuild(
            jaxlib_version="0.11.2",
            cuda_plugins=(CudaPlugin("jax_plugins.xla_cuda13", 13, "0.11.2"),),
        )
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


def golden_engines() -> dict[str, ClusterEngine]:
    """Golden folder -> engine: Launchpad's under the launcher's name, Ray's as ray-<launcher>."""
    return {
        (name if stack == "launchpad" else f"{stack}-{name}"): cluster_engine(name, stack)
        for (name, stack), engine in REGISTRY.items()
        if engine.cluster_engine is not None
    }


def golden_job(root: Path, engine: ClusterEngine) -> ClusterJob:
    """The job of configs/cluster_example.py for `engine`, with the golden paths."""
    launcher = engine.launcher
    config = load_config_file(str(root / GOLDEN_CONFIG), launcher)
    plan = plan_hosts(config, engine, jax_build=golden_jax_build(engine.runtime))
    python = GOLDEN_PYTHON if engine.runtime == "launchpad" else GOLDEN_PYTHON_RAY
    command = GOLDEN_COMMAND.format(launcher=launcher)
    job = make_cluster_job(
        config,
        plan,
        engine,
        name=job_name(config, Path(GOLDEN_CONFIG).stem),
        workdir=GOLDEN_WORKDIR,
        python=python,
        project_dir=GOLDEN_PROJECT,
        command=command,
        driver=tuple(driver_argv(command, GOLDEN_WORKDIR, GOLDEN_PROJECT)),
    )
    return dataclasses.replace(
        job, paths=dataclasses.replace(job.paths, python=python, project_dir=GOLDEN_PROJECT)
    )


def golden_files(root: Path) -> dict[str, str]:
    """Relative path -> text of every golden file (one folder per engine)."""
    out = {}
    for folder, engine in golden_engines().items():
        job = golden_job(root, engine)
        for name, text in engine.render(job).items():
            out[f"{folder}/{name}"] = text
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m magi_lp.cluster --golden` (`make golden`): rewrites the golden files."""
    # No abbreviations: `--gold` rewrote the golden files as `--golden`.
    parser = argparse.ArgumentParser(prog="python -m magi_lp.cluster", allow_abbrev=False)
    parser.add_argument("--golden", action="store_true", help=f"rewrite {GOLDEN_DIR}/")
    parser.add_argument("--root", default=".", help="the project folder")
    args = parser.parse_args(argv)
    if not args.golden:
        parser.error("nothing to do; pass --golden")
    root = Path(args.root).absolute()
    if not (root / GOLDEN_CONFIG).is_file():
        parser.error(f"--root {args.root}: no {GOLDEN_CONFIG} there; pass the project folder")
    for relative, text in golden_files(root).items():
        path = root / GOLDEN_DIR / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        console.say(f"wrote {path}", source="golden")
    return 0
