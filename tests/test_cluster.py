"""Several hosts: the host plan, the generated SLURM / Kubernetes / per-host files (golden),
the coordinator's stop board, the entry point's flags, and a small real program started on
two loopback "hosts" from its generated scripts (it stops by the coordinator; a crashed node
is reported by name and stops the rest).

The DrQ-v2 end to end run on three loopback hosts is tests/test_cluster_e2e.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ml_collections import ConfigDict

from magi_lp.cluster import job as cluster_module
from magi_lp.cluster import main as cluster
from magi_lp.cluster.config import hosts_defaults, machine, validate_hosts_config
from magi_lp.cluster.host_place import parse_place
from magi_lp.cluster.host_plan import HostSpec, make_host_plan
from magi_lp.cluster.job import AddressRef, StopSettings
from magi_lp.cluster.ray_cluster import machine_nodes, ray_ports
from magi_lp.cluster.stop_board import StopBoard
from magi_lp.errors import ConfigError
from magi_lp.placement.jax_build import JaxBuild
from magi_lp.placement.plan import GroupRequest
from magi_lp.placement.resources import ResourceSpec
from magi_lp.runtime.config import experiment_defaults

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / cluster.GOLDEN_DIR
CPU_JAX = JaxBuild(jaxlib_version="0.4.30")
PORTS = {"replay": 1, "counter": 1, "learner": 1, "actor": 1, "evaluator": 1, "coordinator": 2}


def _requests(actors: int = 4, learner: dict | None = None) -> dict[str, GroupRequest]:
    specs = {
        "replay": {},
        "counter": {"cpu_threads": 1},
        "learner": learner or {},
        "actor": {"cpu_threads": 1},
        "evaluator": {},
        "coordinator": {},
    }
    counts = {"actor": actors}
    return {
        group: GroupRequest(ResourceSpec.from_config(group, spec), counts.get(group, 1))
        for group, spec in specs.items()
    }


def _hosts(**addresses: str) -> list[HostSpec]:
    return [HostSpec(name, address) for name, address in addresses.items()]


SERVERS_ON_MAIN = {g: "main" for g in ("replay", "counter", "learner", "evaluator", "coordinator")}


def _plan(place: dict, hosts: list[HostSpec] | None = None, **kwargs):
    hosts = hosts or _hosts(main="10.0.0.2", a1="10.0.0.3", a2="10.0.0.4")
    kwargs.setdefault("jax_build", CPU_JAX)
    kwargs.setdefault("requests", _requests())
    return make_host_plan(
        kwargs.pop("requests"),
        hosts,
        place,
        ports_per_node=PORTS,
        base_port=27000,
        **kwargs,
    )


# --- the host plan ---------------------------------------------------------------------------


def test_groups_spread_over_hosts_get_a_launch_group_per_host_and_fixed_ports():
    plan = _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"})
    assert [(n.name, n.host, n.ports) for n in plan.nodes] == [
        ("replay/0", "main", (27000,)),
        ("counter/0", "main", (27001,)),
        ("learner/0", "main", (27002,)),
        ("actor@a1/0", "a1", (27000,)),
        ("actor@a1/1", "a1", (27001,)),
        ("actor@a2/0", "a2", (27000,)),
        ("actor@a2/1", "a2", (27001,)),
        ("evaluator/0", "main", (27003,)),
        ("coordinator/0", "main", (27004, 27005)),
    ]
    assert plan.placement.launch_group("actor", 3) == "actor@a2"
    assert plan.placement.groups["actor@a2"].node_indices == (2, 3)
    assert plan.placement.groups["actor@a1"].env["OMP_NUM_THREADS"] == "1"
    assert plan.launch_group_hosts == {
        "replay": "main",
        "counter": "main",
        "learner": "main",
        "actor@a1": "a1",
        "actor@a2": "a2",
        "evaluator": "main",
        "coordinator": "main",
    }


def test_explicit_counts_and_uneven_spreads():
    assert parse_place("actor", "a1:1,a2:3", ["a1", "a2"], 4) == [("a1", 1), ("a2", 3)]
    assert parse_place("actor", "a1, a2", ["a1", "a2"], 5) == [("a1", 3), ("a2", 2)]
    plan = _plan({**SERVERS_ON_MAIN, "actor": "a1:1,a2:3"})
    assert [n.name for n in plan.nodes if n.group == "actor"] == [
        "actor@a1/0",
        "actor@a2/0",
        "actor@a2/1",
        "actor@a2/2",
    ]


@pytest.mark.parametrize(
    "place, message",
    [
        (
            {"learner": "mian"},
            "hosts.place.learner='mian' names host 'mian', which is not in hosts.machines: "
            "the hosts are main, a1, a2; did you mean main?",
        ),
        ({"actor": "a3"}, "not in hosts.machines: the hosts are main, a1, a2; use one of those"),
        ({"actor": ""}, "hosts.place.actor is empty: there are 3 hosts"),
        ({"actor": "a1:1,a2:2"}, "places 3 nodes: group actor has 4; make the counts sum to 4"),
        ({"actor": "a1:2,a2"}, "node counts for some hosts: they go with every host or with none"),
        ({"actor": "a1:0,a2"}, "the node count of host a1 in hosts.place.actor must be an integer"),
        ({"actor": "a1,a1"}, "names host 'a1' twice"),
        ({"learner": "a1,a2"}, "spreads 1 node(s) over 2 hosts"),
        ({"actr": "a1"}, "hosts.place.actr names no node group: the node groups are replay, "),
        ({"actr": "a1"}, "; did you mean hosts.place.actor?"),
    ],
)
def test_bad_placements_name_the_key_and_the_fix(place, message):
    with pytest.raises(ConfigError) as error:
        _plan({**SERVERS_ON_MAIN, "actor": "a1,a2", **place})
    assert message in str(error.value)


def test_ports_must_not_collide_where_hosts_share_a_port_space():
    # Every loopback address is this one machine: distinct addresses, same ports -> refused.
    hosts = _hosts(main="127.0.0.2", a1="127.0.0.3", a2="127.0.0.4")
    with pytest.raises(ConfigError) as error:
        _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"}, hosts)
    assert "port 27000: nodes replay/0 (host main) and actor@a1/0 (host a1)" in str(error.value)
    assert "this machine's loopback" in str(error.value)
    assert "hosts.machines.a1.base_port" in str(error.value)
    spaced = [dataclasses.replace(h, base_port=27000 + 20 * i) for i, h in enumerate(hosts)]
    plan = _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"}, spaced)
    assert plan.node("actor", 2).ports == (27040,)
    # Two names for one address share its ports too.
    with pytest.raises(ConfigError, match=re.escape("at 10.0.0.9")):
        _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"}, _hosts(main="10.0.0.9", a1="10.0.0.9", a2="x"))
    # Hosts the engine provides are separate machines.
    _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"}, _hosts(main="", a1="", a2=""))


def test_ports_beyond_the_range_are_refused():
    hosts = [HostSpec("main", "10.0.0.2", base_port=65533), HostSpec("a1", "10.0.0.3")]
    with pytest.raises(ConfigError, match=re.escape("port 65536: outside 1024-65535; lower hosts")):
        _plan({**SERVERS_ON_MAIN, "actor": "a1"}, hosts)
    # A pod's too: its manifest named port 65536.
    hosts[0] = HostSpec("main", "10.0.0.2", base_port=65535)
    with pytest.raises(ConfigError, match=re.escape("port 65536: outside 1024-65535; lower hosts")):
        _plan({**SERVERS_ON_MAIN, "actor": "a1"}, hosts, port_per_pod=True)


@pytest.mark.parametrize(
    "address", ["http://10.0.0.2", "10.0.0.2:8000", "10.0.0.300", "0.0.0.0", " "]
)
def test_a_host_spec_refuses_an_address_as_the_hosts_settings_do(address):
    """`HostSpec` (what the plan is made of, also built directly) refused only whitespace,
    where `hosts.machines` refuses a scheme, a port, a bad IPv4 and the unspecified address."""
    with pytest.raises(
        ConfigError, match=r"hosts\.machines\.main\.address must be .*no scheme, no port"
    ):
        HostSpec("main", address)
    assert HostSpec("main", "node-1.cluster").address == "node-1.cluster"


def test_kubernetes_gives_every_pod_the_same_ports():
    plan = _plan({**SERVERS_ON_MAIN, "actor": "a1,a2"}, port_per_pod=True)
    assert {n.ports for n in plan.nodes if n.group != "coordinator"} == {(27000,)}
    assert plan.node("coordinator", 0).ports == (27000, 27001)


def test_gpu_groups_are_checked_against_the_gpus_of_their_host():
    cuda = JaxBuild(jaxlib_version="0.4.30", cuda_plugins=())
    cuda = dataclasses.replace(cuda, jaxlib_version="0.4.30+cuda12")
    hosts = [HostSpec("main", "10.0.0.2", gpus=0), HostSpec("a1", "10.0.0.3")]
    requests = _requests(learner={"device": "gpu"})
    with pytest.raises(ConfigError) as error:
        _plan({**SERVERS_ON_MAIN, "actor": "a1"}, hosts, requests=requests, jax_build=cuda)
    assert str(error.value).startswith("host main: resources.learner.device='gpu': no GPU was")
    # Known GPUs: ids are checked.
    hosts[0] = HostSpec("main", "10.0.0.2", gpus=2)
    requests = _requests(learner={"device": "gpu", "gpus": [3]})
    with pytest.raises(
        ConfigError,
        match=re.escape("host main: GPU 3 is not on this machine (resources.learner.gpus=[3])"),
    ):
        _plan({**SERVERS_ON_MAIN, "actor": "a1"}, hosts, requests=requests, jax_build=cuda)
    requests = _requests(learner={"device": "gpu", "gpus": [1], "gpu_memory": 0.5})
    plan = _plan({**SERVERS_ON_MAIN, "actor": "a1"}, hosts, requests=requests, jax_build=cuda)
    assert plan.placement.groups["learner"].env["CUDA_VISIBLE_DEVICES"] == "1"
    # Unknown GPUs: a gpu group gets what it asks for, with a notice; gpu_if_available the CPU.
    hosts[0] = HostSpec("main", "10.0.0.2")
    plan = _plan(
        {**SERVERS_ON_MAIN, "actor": "a1"},
        hosts,
        requests=_requests(learner={"device": "gpu", "gpus": 2}),
        jax_build=cuda,
    )
    assert plan.placement.groups["learner"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert any("planning as if it had 2 identical GPU(s)" in n for n in plan.notices)
    plan = _plan(
        {**SERVERS_ON_MAIN, "actor": "a1"},
        hosts,
        requests=_requests(learner={"device": "gpu_if_available"}),
        jax_build=cuda,
    )
    assert plan.placement.groups["learner"].device == "cpu"
    assert any("set hosts.machines.main.gpus" in n for n in plan.notices)


# --- config ----------------------------------------------------------------------------------


def _config(**machines: dict):
    config = experiment_defaults()
    config.hosts = hosts_defaults()
    config.num_actors = 2
    for name, settings in machines.items():
        config.hosts.machines[name] = machine(**settings)
    for group, host in SERVERS_ON_MAIN.items():
        config.hosts.place[group] = host
    config.hosts.place.actor = ",".join(n for n in machines if n != "main") or "main"
    return config


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.hosts.update({"base_prot": 1}), "hosts.base_prot is not a known config key:"),
        (
            lambda c: c.hosts.update({"base_port": 80}),
            "hosts.base_port must be a port in 1024-65535, got 80; "
            "e.g. --config.hosts.base_port=27000 (the default)",
        ),
        (
            lambda c: c.hosts.update({"poll_seconds": float("nan")}),
            "hosts.poll_seconds must be a number > 0, got nan; "
            "e.g. --config.hosts.poll_seconds=0.5 (the default)",
        ),
        (
            lambda c: setattr(c.hosts.machines, "main", ConfigDict({**machine(), "gpus": "2"})),
            "hosts.machines.main.gpus must be an integer, got '2'; e.g. "
            "--config.hosts.machines.main.gpus=-1 (the default)",
        ),
        (
            lambda c: c.hosts.machines.main.update({"gpus": -2}),
            "hosts.machines.main.gpus must be an integer >= 0, or -1 (unknown), got -2; e.g. "
            "machine(..., gpus=8)",
        ),
        (
            lambda c: setattr(c.hosts, "place", ConfigDict({**c.hosts.place, "actor": 3})),
            "hosts.place.actor must be a string",
        ),
        (
            lambda c: c.hosts.kubernetes.update({"image_pull_policy": "always"}),
            "hosts.kubernetes.image_pull_policy must be Always or IfNotPresent or Never, got "
            "'always'; e.g. --config.hosts.kubernetes.image_pull_policy='IfNotPresent'",
        ),
        (
            lambda c: c.hosts.update({"heartbeat_timeout_seconds": 1.0}),
            "hosts.heartbeat_timeout_seconds must be more than 4 x hosts.poll_seconds",
        ),
        (  # the fix it gives holds (the default, 60, would not)
            lambda c: c.hosts.update({"poll_seconds": 20.0}),
            "(80), got 60.0; e.g. --config.hosts.heartbeat_timeout_seconds=160, or a smaller "
            "hosts.poll_seconds",
        ),
        # Each rendered into the job's files as given before: "#SBATCH --time=forever" failed
        # at sbatch, "#SBATCH garbage" was a comment sbatch ignored, a bad namespace failed at
        # kubectl, and "nodeSelector: {garbage: ''}" left the pods pending for good.
        (
            lambda c: c.hosts.slurm.update({"time": "forever"}),
            "hosts.slurm.time must be a SLURM time (minutes, HH:MM:SS, D-HH:MM:SS, UNLIMITED)",
        ),
        (
            lambda c: c.hosts.slurm.update({"extra_sbatch": "--mem=0;garbage"}),
            "hosts.slurm.extra_sbatch must be sbatch options separated by ';', each starting",
        ),
        (
            lambda c: c.hosts.slurm.update({"partition": "gpu;rm -rf"}),
            "hosts.slurm.partition must be a name (no spaces, ';' or '#')",
        ),
        (
            lambda c: c.hosts.kubernetes.update({"namespace": "Bad_NS"}),
            "hosts.kubernetes.namespace must be a Kubernetes namespace name",
        ),
        (
            lambda c: c.hosts.machines.main.update({"node_selector": "gpu"}),
            "hosts.machines.main.node_selector must be node labels as key=value",
        ),
        # Each went into the scripts, #SBATCH --nodelist or the manifests as given, to fail
        # on the cluster; a None or a string machine was a traceback or a garbled line.
        (
            lambda c: c.hosts.machines.main.update({"node_selector": "pool=cpu nodes"}),
            "hosts.machines.main.node_selector must be node labels as key=value",
        ),
        *[
            (
                lambda c, a=address: c.hosts.machines.main.update({"address": a}),
                "hosts.machines.main.address must be a private-network IP address or host name "
                f"(no scheme, no port), or '', got {address!r}",
            )
            for address in ("10.0.0.3:22", "http://10.0.0.3", "10.0.0.300", "0.0.0.0")
        ],
        (
            lambda c: c.hosts.kubernetes.update({"volume_claim": "Shared_PVC"}),
            "hosts.kubernetes.volume_claim must be a Kubernetes object name",
        ),
        (
            lambda c: c.hosts.kubernetes.update({"image": "bad image:1"}),
            "hosts.kubernetes.image must be a container image reference (no spaces)",
        ),
        (
            lambda c: setattr(c.hosts.machines, "cpu3", None),
            "hosts.machines.cpu3 must be a machine(...) entry, got None; e.g. "
            'config.hosts.machines.cpu3 = machine(address="10.0.0.5")',
        ),
        (
            lambda c: setattr(c.hosts.machines, "cpu3", "10.0.0.5"),
            "hosts.machines.cpu3 must be a machine(...) entry, got '10.0.0.5'",
        ),
        (
            lambda c: setattr(c.hosts.machines, "cpu3", {"address": "10.0.0.5"}),
            "hosts.machines.cpu3.gpus is missing; start from magi_lp.cluster.config.machine(...)",
        ),
        (
            lambda c: setattr(c.hosts, "slurm", None),
            "hosts.slurm must be a section, got None",
        ),
    ],
)
def test_bad_hosts_keys_are_refused_by_name(change, message):
    config = _config(main={"address": "10.0.0.2"})
    change(config)
    with pytest.raises(ConfigError) as error:
        validate_hosts_config(config)
    assert message in str(error.value)


def test_machine_refuses_unknown_settings():
    with pytest.raises(ConfigError, match="machine setting 'gpu' is unknown"):
        machine(gpu=1)


def test_engines_refuse_what_they_cannot_run():
    config = _config(main={}, a1={"address": "10.0.0.3"})
    plan = cluster.plan_hosts(config, "hosts", jax_build=CPU_JAX)
    with pytest.raises(
        ConfigError, match=re.escape("hosts.machines.main.address is empty: --launcher hosts")
    ):
        cluster.make_cluster_job(config, plan, "hosts", name="x", workdir="/w")
    plan = cluster.plan_hosts(config, "kubernetes", jax_build=CPU_JAX)
    with pytest.raises(ConfigError, match=re.escape("hosts.kubernetes.image is empty")):
        cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir="/w")
    config.hosts.kubernetes.image = "img"
    config.hosts.kubernetes.volume_claim = "claim"
    with pytest.raises(
        ConfigError, match=re.escape("--workdir /w is not inside hosts.kubernetes.volume_mount")
    ):
        cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir="/w")
    with pytest.raises(ConfigError, match="must be an absolute path"):
        cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir="shared/w")
    # SLURM's CPU steps run with --exact: past the machine's CPUs a step waited for ever.
    crowded = _config(main={"cpus": 2})
    slurm_plan = cluster.plan_hosts(crowded, "slurm", jax_build=CPU_JAX)
    with pytest.raises(ConfigError, match=r"^machine main: its srun steps ask for \d+ CPUs \("):
        cluster.make_cluster_job(crowded, slurm_plan, "slurm", name="x", workdir="/w")
    crowded.hosts.machines.main.cpus = 16
    slurm_plan = cluster.plan_hosts(crowded, "slurm", jax_build=CPU_JAX)
    cluster.make_cluster_job(crowded, slurm_plan, "slurm", name="x", workdir="/w")
    # A pod's name is a DNS label: Kubernetes refused a longer Job at apply.
    rack = _config(main={}, **{"actors-on-the-second-rack-node-a": {}, "rack-b": {}})
    rack.hosts.kubernetes.update({"image": "img", "volume_claim": "claim"})
    rack_plan = cluster.plan_hosts(rack, "kubernetes", jax_build=CPU_JAX)
    with pytest.raises(ConfigError) as long_name:
        cluster.make_cluster_job(rack, rack_plan, "kubernetes", name="n" * 40, workdir="/shared/w")
    assert "characters): Kubernetes takes at most 63: <hosts.name>-<launch group>-<index>; " in (
        str(long_name.value)
    )
    # The volume at the root holds every workdir (it refused them all); a sibling is outside.
    for mount, workdir, inside in [
        ("/", "/w", True),
        ("/w/", "/w/run", True),
        ("/w", "/wx", False),
    ]:
        config.hosts.kubernetes.volume_mount = mount
        if inside:
            cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir=workdir)
        else:
            with pytest.raises(ConfigError, match=r"is not inside hosts\.kubernetes\.volume_mount"):
                cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir=workdir)


def test_kubernetes_refuses_gpus_shared_between_pods_and_renumbers_them():
    config = _config(main={"gpus": 2})
    config.num_actors = 2
    config.resources.actor.device = "gpu"
    config.resources.actor.gpu_memory = 0.4
    config.hosts.kubernetes.image = "img"
    config.hosts.kubernetes.volume_claim = "claim"
    cuda = cluster.golden_jax_build()
    plan = cluster.plan_hosts(config, "kubernetes", jax_build=cuda)
    with pytest.raises(ConfigError, match="GPU 0 would be shared by actor/0, actor/1"):
        cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir="/shared/w")
    config.resources.actor.gpu_distribution = "round_robin"
    plan = cluster.plan_hosts(config, "kubernetes", jax_build=cuda)
    job = cluster.make_cluster_job(config, plan, "kubernetes", name="x", workdir="/shared/w")
    # Each pod sees its one GPU as GPU 0.
    assert {g.launch_group: g.env["CUDA_VISIBLE_DEVICES"] for g in job.groups if g.gpus} == {
        "actor_gpu0": "0",
        "actor_gpu1": "0",
    }


# --- golden files ------------------------------------------------------------------------------


def test_golden_files_are_what_the_generator_writes():
    generated = cluster.golden_files(ROOT)
    on_disk = {str(p.relative_to(GOLDEN)): p.read_text() for p in GOLDEN.rglob("*") if p.is_file()}
    assert sorted(on_disk) == sorted(generated), "run: python -m magi_lp.cluster --golden"
    for name, text in generated.items():
        assert on_disk[name] == text, f"{name} differs; python -m magi_lp.cluster --golden"


def _golden_job(launcher: str):
    config = cluster.load_config_file(str(ROOT / cluster.GOLDEN_CONFIG), launcher)
    plan = cluster.plan_hosts(config, launcher, jax_build=cluster.golden_jax_build())
    return cluster.make_cluster_job(
        config,
        plan,
        launcher,
        name="drq-reacher",
        workdir=cluster.GOLDEN_WORKDIR,
        python=cluster.GOLDEN_PYTHON,
        project_dir=cluster.GOLDEN_PROJECT,
    )


@pytest.mark.parametrize("engine", ["slurm", "ray-slurm"])
def test_a_slurm_job_names_the_paths_its_machines_lack_here(tmp_path, engine):
    """A Ray-stack job given the Launchpad venv's Python failed at every step: no `ray`
    beside it. SLURM's machines share the submit host's filesystem as a rule."""
    from magi_lp.cluster.engines import not_on_the_submit_host

    job = cluster.golden_job(ROOT, cluster.golden_engines()[engine])
    runtime = "ray" if engine == "ray-slurm" else "launchpad"
    lines = not_on_the_submit_host(job, runtime)  # the golden paths are nowhere here
    assert [line.split(" /")[0] for line in lines] == [
        "hosts.python",
        "hosts.project_dir",
        *(["the `ray` beside hosts.python"] if runtime == "ray" else []),
    ]
    assert all("is not on this machine" in line for line in lines)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    here = dataclasses.replace(
        job.paths, python=str(tmp_path / "bin" / "python"), project_dir=str(ROOT)
    )
    missing = not_on_the_submit_host(dataclasses.replace(job, paths=here), runtime)
    if runtime == "ray":
        (line,) = missing
        assert line.startswith(f"the `ray` beside hosts.python {tmp_path}/bin/ray is not on")
    else:
        assert missing == []


def test_the_ray_plan_shows_each_machines_ray_ports_not_launchpads():
    """On the Ray stack's SLURM job the ports column showed Launchpad's base port for every
    group; Ray's servers and workers take a block per machine (`ray_ports`)."""
    engine = cluster.golden_engines()["ray-slurm"]
    job = cluster.golden_job(ROOT, engine)
    columns = engine.ports_of_host(job)
    assert set(columns) == {host.name for host in job.hosts if job.groups_on(host.name)}
    for host in job.hosts:
        if host.name in columns:
            block = ray_ports(host.base_port, machine_nodes(job, host.name))
            assert columns[host.name] == f"{block.base}-{block.last} (Ray's)"
    config = cluster.load_config_file(str(ROOT / cluster.GOLDEN_CONFIG), "slurm")
    plan = cluster.plan_hosts(config, engine, jax_build=cluster.golden_jax_build("ray"))
    table = plan.format_table(columns)
    assert all(columns[row.split()[0]] in row for row in table.splitlines()[2:-1] if row[:1] != " ")
    launchpad = cluster.golden_engines()["slurm"]  # its nodes' own ports: the plan's
    assert launchpad.ports_of_host(cluster.golden_job(ROOT, launchpad)) == {}


def test_golden_manifests_pass_the_kubernetes_schemas():
    from kubernetes_validate import utils as kubernetes_validate

    documents = [
        d for d in yaml.safe_load_all((GOLDEN / "kubernetes/drq-reacher.yaml").read_text())
    ]
    assert [d["kind"] for d in documents] == ["Service", "NetworkPolicy"] + ["Job"] * 7
    for version in ("1.28.0", kubernetes_validate.latest_version()):
        for document in documents:
            # strict: an unknown or misspelt field is an error, not ignored.
            kubernetes_validate.validate(document, version, strict=True)
    bad = yaml.safe_load_all((GOLDEN / "kubernetes/drq-reacher.yaml").read_text())
    job = next(d for d in bad if d["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)


def test_golden_manifests_name_pods_where_the_program_looks_for_them():
    job = _golden_job("kubernetes")
    documents = list(yaml.safe_load_all((GOLDEN / "kubernetes/drq-reacher.yaml").read_text()))
    service = documents[0]
    jobs = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Job"}
    for group in job.groups:
        spec = jobs[job.job_name(group.launch_group)]["spec"]
        assert spec["completionMode"] == "Indexed"
        assert spec["completions"] == spec["parallelism"] == len(group.nodes)
        pod = spec["template"]["spec"]
        # Indexed Job pods are named <job>-<index>; with subdomain = the headless Service,
        # <job>-<index>.<service> resolves: the address each node was pickled with.
        assert pod["subdomain"] == service["metadata"]["name"]
        assert service["spec"]["clusterIP"] == "None"
        assert spec["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
        for node in group.nodes:
            assert job.address_of(node).host == (
                f"{job.job_name(group.launch_group)}-{node.task}.{service['metadata']['name']}"
            )
        container = pod["containers"][0]
        assert container["command"][-2:] == ["--task_var", "JOB_COMPLETION_INDEX"]
        assert {e["name"]: e["value"] for e in container["env"]}.items() >= group.env.items()
        limits = container.get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu", 0) == group.gpus
    assert jobs["drq-reacher-learner"]["spec"]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ] == {"nvidia.com/gpu": 1}


def test_golden_scripts_are_valid_bash_and_start_every_node_once():
    for path in [GOLDEN / "slurm/drq-reacher.sbatch", *(GOLDEN / "hosts").glob("*.sh")]:
        subprocess.run(["bash", "-n", str(path)], check=True)
        assert cluster_module.SECURITY_WARNING.split(".")[0][:60] in path.read_text()
    hosts = _golden_job("hosts")
    started = []
    for script in sorted((GOLDEN / "hosts").glob("*.sh")):
        lines = [line for line in script.read_text().splitlines() if line.startswith("start ")]
        started += [line.split()[1] for line in lines]
        host = script.stem.removeprefix("host-")
        planned = [n for g in hosts.groups_on(host) for n in g.nodes]
        for node, line in zip(planned, lines, strict=True):
            assert f"--task {node.task} " in line
    assert sorted(started) == sorted(n.name for n in hosts.nodes)
    sbatch = (GOLDEN / "slurm/drq-reacher.sbatch").read_text()
    assert sbatch.count("#SBATCH hetjob") == 2
    assert "#SBATCH --gres=gpu:1" in sbatch
    steps = [line for line in sbatch.splitlines() if line.startswith("step ")]
    assert len(steps) == len(_golden_job("slurm").groups)
    learner = next(line for line in steps if line.startswith("step 'learner on main'"))
    assert "--het-group=2" in learner and "--gres=gpu:1 --overlap" in learner


def test_slurm_script_runs_each_step_with_its_env_and_reports_failures(tmp_path):
    """The generated batch script, run by bash with stand-ins for srun and scontrol that
    record each step (as srun would run it, task by task) and fail one step."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "node-$2"\n')
    (bin_dir / "srun").write_text(
        "#!/bin/bash\n"
        "while [[ $1 == --* ]]; do shift; done\n"
        # After srun's options: env VAR=... python -m magi_lp.cluster.host_node ...
        'echo "$@" >> "$RECORD"\n'
        'for v in "$@"; do\n'
        "  [[ $v == --group ]] && grab=1 && continue; [[ $grab ]] && g=$v && break\n"
        "done\n"
        "[[ $g == replay ]] && exit 7\n"
        "exit 0\n"
    )
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    job = _golden_job("slurm")
    job = dataclasses.replace(
        job,
        paths=dataclasses.replace(
            job.paths, project_dir=str(tmp_path), log_dir=str(tmp_path / "logs")
        ),
        settings={**job.settings, "setup": ""},
    )
    script = tmp_path / "job.sbatch"
    script.write_text(cluster.render(job)["drq-reacher.sbatch"])
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD=str(tmp_path / "record"))
    env.update({f"SLURM_JOB_NODELIST_HET_GROUP_{i}": f"group{i}" for i in range(3)})
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "magi_lp: step replay on main failed: exit code 7" in result.stderr
    assert "magi_lp: all 7 steps ended; exit code 1" in result.stderr
    record = (tmp_path / "record").read_text().splitlines()
    assert len(record) == 7
    learner = next(line for line in record if "--group learner" in line)
    assert "CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cuda,cpu" in learner
    assert "--task_var SLURM_PROCID" in learner


# --- the stop board ------------------------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _board(clock, **settings):
    tiers = {"actor/0": 0, "actor/1": 0, "learner/0": 1, "replay/0": 2}
    stop = StopSettings(poll_seconds=0.5, notice_seconds=10.0, heartbeat_timeout_seconds=30.0)
    lines: list[str] = []
    board = StopBoard(
        tiers, dataclasses.replace(stop, **settings), report=lines.append, clock=clock
    )
    return board, lines


def _poll_all(board, clock, nodes, seconds):
    told = {}
    end = clock.now + seconds
    while clock.now < end:
        for node in nodes:
            if board.poll(node):
                told.setdefault(node, clock.now)
        board.check()
        clock.now += 0.5
    return told


def test_stop_board_tells_nodes_in_tiers_once_the_earlier_ones_left():
    clock = _Clock()
    board, lines = _board(clock)
    nodes = ["actor/0", "actor/1", "learner/0", "replay/0"]
    assert _poll_all(board, clock, nodes, 5) == {}
    board.begin_stop("limit reached")
    told = _poll_all(board, clock, nodes, 3)  # actors told, but they keep running
    assert sorted(told) == ["actor/0", "actor/1"]
    told.update(_poll_all(board, clock, ["learner/0", "replay/0"], 3))  # actors left
    assert "learner/0" in told and "replay/0" not in told
    told.update(_poll_all(board, clock, ["replay/0"], 3))  # learner left
    assert "replay/0" in told
    _poll_all(board, clock, [], 3)
    assert board.done and not board.failed
    assert lines[-1].startswith("all 4 nodes ended")
    assert lines[-1].endswith("; exit code 0")


def test_a_node_that_says_it_left_releases_the_next_tier_at_once():
    """Silence takes over a second to read as gone; a node that ended says so (`left`)."""
    clock = _Clock()
    board, _ = _board(clock)
    nodes = ["actor/0", "actor/1", "learner/0", "replay/0"]
    _poll_all(board, clock, nodes, 2)
    board.begin_stop("limit reached")
    assert board.poll("actor/0") and board.poll("actor/1") and not board.poll("learner/0")
    board.left("actor/0")
    board.left("actor/1")
    board.left("someone/else")  # not of this program: ignored
    board.check()  # no time has passed: the actors' word is enough
    assert board.poll("learner/0") and not board.poll("replay/0")
    board.left("learner/0")
    board.check()
    assert board.poll("replay/0")
    board.left("replay/0")
    board.check()
    assert board.done and not board.failed


def test_a_node_that_fails_before_the_stop_stops_the_program_at_once():
    """Its exception used to wait out heartbeat_timeout_seconds (60 s) as a silent node."""
    clock = _Clock()
    board, lines = _board(clock)
    _poll_all(board, clock, ["actor/0", "actor/1", "learner/0", "replay/0"], 2)
    board.left("actor/1", 1)
    assert board.stopping
    assert lines[0] == "node actor/1 failed (exit code 1) before the program was stopped"
    assert lines[1].startswith("node actor/1 died: stopping 3 nodes in 3 stages")
    assert board.poll("actor/0") and not board.poll("learner/0")
    for node in ("actor/0", "learner/0", "replay/0"):
        board.left(node)
    assert board.done and board.failed and board.cause == "node actor/1 died"


def test_a_node_that_finishes_before_the_stop_is_reported_and_the_program_goes_on():
    """As on one machine (`stop_machine`): an exit code 0 is not a death."""
    clock = _Clock()
    board, lines = _board(clock)
    _poll_all(board, clock, ["actor/0", "actor/1", "learner/0", "replay/0"], 2)
    board.left("actor/1", 0)
    assert lines == ["node actor/1 finished (exit code 0)"] and not board.stopping
    _poll_all(board, clock, ["actor/0", "learner/0", "replay/0"], 2)
    board.begin_stop("limit reached")
    assert "stopping 3 nodes" in lines[1]
    for node in ("actor/0", "learner/0", "replay/0"):
        board.left(node)
    assert board.done and not board.failed


def test_a_node_that_fails_at_its_stop_fails_it():
    clock = _Clock()
    board, lines = _board(clock)
    board.begin_stop("limit reached")
    board.left("actor/0", 1)
    assert "node actor/0 failed (exit code 1) while the program stopped" in lines
    for node in ("actor/1", "learner/0", "replay/0"):
        board.left(node)
    assert board.failed and board.cause == "actor/0 failed while stopping; see above"


def test_stop_board_moves_on_after_the_notice_and_reports_a_dead_node():
    clock = _Clock()
    board, lines = _board(clock, heartbeat_timeout_seconds=5.0)
    _poll_all(board, clock, ["actor/0", "actor/1", "learner/0", "replay/0"], 2)
    _poll_all(board, clock, ["actor/0", "learner/0", "replay/0"], 6)  # actor/1 went silent
    assert board.stopping
    assert "node actor/1 stopped answering the coordinator" in lines[0]
    # actor/0 never leaves: after the notice (its own exit, which did not come) the learner
    # is told anyway.
    told = _poll_all(board, clock, ["actor/0", "learner/0", "replay/0"], 13)
    assert "learner/0" in told
    assert any(
        line.startswith("nodes still running after 10 s: actor/0; their own notice makes them")
        for line in lines
    )
    assert any("actor/0 still running" in line and "going on without" in line for line in lines)
    _poll_all(board, clock, [], 3)
    assert board.done and board.failed and board.cause == "node actor/1 died"


def test_a_node_that_exits_at_its_notice_is_a_fault_of_the_stop():
    clock = _Clock()
    board, lines = _board(clock)
    _poll_all(board, clock, ["actor/0", "actor/1", "learner/0", "replay/0"], 1)
    board.begin_stop("limit reached")
    board.left("actor/0")
    _poll_all(board, clock, ["actor/1", "learner/0", "replay/0"], 10.5)
    _poll_all(board, clock, ["learner/0", "replay/0"], 2)  # actor/1 exited at its notice
    for node in ("learner/0", "replay/0"):
        board.left(node)
    assert board.done and board.failed
    assert board.cause == "actor/1 made to exit after the 10 s notice"
    assert [line for line in lines if "actor/1" in line] == [
        "nodes still running after 10 s: actor/1; their own notice makes them exit now (a fault: "
        "a node should end by itself; see the end of its log)",
        lines[-1],
    ]


def test_stop_board_reports_a_node_that_never_came():
    clock = _Clock()
    board, lines = _board(clock, start_timeout_seconds=4.0)
    _poll_all(board, clock, ["actor/0", "actor/1", "learner/0"], 5)
    assert board.stopping
    assert "node replay/0 has not reached the coordinator 4 s after it started" in lines[0]
    for node in ("actor/0", "actor/1", "learner/0"):
        board.left(node)
    assert board.failed and lines[-1].endswith("exit code 1 (node replay/0 died)")


def test_lp_stop_in_the_coordinator_runs_the_tiered_stop(monkeypatch):
    from magi_lp.cluster import stop_board

    board, lines = _board(_Clock())
    monkeypatch.setattr(stop_board, "_BOARD", board)
    monkeypatch.setattr(stop_board, "_THIS_NODE", "coordinator/0")
    monkeypatch.setattr(board, "wait_done", lambda timeout=None: True)
    stop_board.ProgramStopper(AddressRef("127.0.0.2"), 27005)()
    assert board.stopping and not board.failed
    assert lines[0].startswith("lp.stop() in coordinator/0: stopping 4 nodes in 3 stages")


def test_node_runner_refuses_a_missing_job_in_one_line(tmp_path):
    arguments = ["--job", str(tmp_path), "--group", "x", "--task", "0"]
    result = subprocess.run(
        [sys.executable, "-m", "magi_lp.cluster.host_node", *arguments],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: magi_lp.cluster.host_node: cannot read")
    assert result.stderr.strip().endswith("prepare the job first")


def test_addresses_resolve_at_run_time():
    assert AddressRef("10.0.0.2").resolve(27000) == "10.0.0.2:27000"
    assert AddressRef("fd00::2").resolve(27000) == "[fd00::2]:27000"
    ref = AddressRef(host_var="MAGI_LP_HOST_MAIN")
    assert ref.resolve(27000, {"MAGI_LP_HOST_MAIN": "node-7"}) == "node-7:27000"
    with pytest.raises(RuntimeError, match="MAGI_LP_HOST_MAIN is not set"):
        ref.resolve(27000, {})


# --- the entry point ---------------------------------------------------------------------------


def _lp_main(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(ROOT / "projects/drq_v2/lp_main.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_the_plan_the_warning_and_the_script(tmp_path):
    result = _lp_main(
        "--config",
        "configs/cluster_example.py:slurm",
        f"--workdir={tmp_path}/run",
        "--launcher=slurm",
        "--dry_run",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "actor@cpu2      8 (actor 8-15)     27000-27007  cpu" in out
    assert "!" * 100 + "\n" + cluster_module.SECURITY_WARNING in out
    assert "===== drq-reacher.sbatch =====" in out
    assert "#SBATCH hetjob" in out
    assert not (tmp_path / "run" / "cluster").exists()


@pytest.mark.integration  # runs lp_main.py --render, an entry point
def test_render_writes_the_files_and_bad_input_is_one_line(tmp_path):
    result = _lp_main(
        "--config",
        "configs/cluster_example.py:hosts",
        f"--workdir={tmp_path}/run",
        "--launcher=hosts",
        f"--render={tmp_path}/out",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "host-cpu1.sh",
        "host-cpu2.sh",
        "host-main.sh",
    ]
    assert "SECURITY" in result.stderr
    result = _lp_main(
        "--config",
        "configs/cluster_example.py:hosts",
        f"--workdir={tmp_path}/run",
        "--launcher=hosts",
        "--config.hosts.place.actor=cpu1,cpu3",
        "--dry_run",
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: hosts.place.actor='cpu1,cpu3' names host 'cpu3', which is not in hosts.machines: "
        "the hosts are cpu1, cpu2, main; did you mean cpu2?"
    )
    result = _lp_main(
        "--config",
        "configs/cluster_example.py",
        f"--workdir={tmp_path}/run",
        f"--render={tmp_path}",
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --render writes cluster files; add --launcher hosts|slurm|kubernetes"
    )
    # A --render that would write nothing, or cannot write, and a workdir that cannot be
    # made for the job's files: one line each, before the plan (no SECURITY line first).
    (tmp_path / "a_file").write_text("")
    for args, says in [
        (["--render="], "error: --render is empty; name the folder to write the files to"),
        (
            [f"--render={tmp_path}/out", "--dry_run"],
            "error: --render with --dry_run: the dry run prints the files and writes nothing; "
            "give one of the two",
        ),
        (
            [f"--render={tmp_path}/a_file/out"],
            f"error: --render {tmp_path}/a_file/out cannot be created: {tmp_path}/a_file is a "
            "file, not a folder; pick a path you can write to",
        ),
        (
            ["--config.isolation=required", "--dry_run"],
            "error: isolation='required' with --launcher hosts: the nodes run on other "
            "machines, which no network namespace here can isolate; their network's rules "
            "apply (docs/cluster.md); --config.isolation=auto (or 'off'), or run on this "
            "machine alone",
        ),
        (
            [f"--workdir={tmp_path}/a_file/run"],
            f"error: --workdir {tmp_path}/a_file/run cannot be created: {tmp_path}/a_file is a "
            "file, not a folder; pick a path you can write to",
        ),
    ]:
        base = ["--config", "configs/cluster_example.py:hosts", f"--workdir={tmp_path}/run"]
        result = _lp_main(*base, "--launcher=hosts", *args)
        assert (result.returncode, result.stderr.strip()) == (2, says), result.stderr[-2000:]


# --- a small program on two loopback hosts --------------------------------------------------


def _run_toy(scenario: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    subprocess.run(
        [sys.executable, str(ROOT / "tests/multihost_toys.py"), scenario, str(tmp_path)],
        env=env,
        check=True,
        timeout=60,
    )
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests/multihost_driver.py"),
            str(tmp_path / "scripts"),
            "host-h1.sh",
            "host-h2.sh",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, tmp_path / "nodes"


@pytest.mark.integration
def test_toy_program_on_two_hosts_stops_through_the_coordinator(tmp_path):
    result, logs = _run_toy("normal", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "host-h1.sh: exit code 0" in result.stdout
    assert "host-h2.sh: exit code 0" in result.stdout
    coordinator = (logs / "coordinator/0").read_text()
    assert "told in the order worker < server" in coordinator
    assert "all 3 nodes ended" in coordinator
    for node in ("worker/0", "worker/1", "server/0", "coordinator/0"):
        assert f"node {node} exits with code 0" in (logs / node).read_text()


@pytest.mark.integration
def test_a_node_whose_python_fails_stops_the_program_at_once_by_name(tmp_path):
    """Its node runner tells the coordinator as it leaves: the stop does not wait for its
    silence (heartbeat_timeout_seconds)."""
    result, logs = _run_toy("raise", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "magi_lp host h2: node worker/1 failed: exit code 1" in result.stderr
    coordinator = (logs / "coordinator/0").read_text()
    assert "node worker/1 failed (exit code 1) before the program was stopped" in coordinator, (
        coordinator[-3000:]
    )
    assert "node worker/1 died: stopping 2 nodes" in coordinator
    assert "stopped answering" not in coordinator
    assert "RuntimeError: worker 1 fails on purpose" in (logs / "worker/1").read_text()
    assert "node coordinator/0 exits with code 1" in coordinator
    assert "node worker/0 exits with code 0" in (logs / "worker/0").read_text()


@pytest.mark.integration
def test_a_dead_node_is_reported_by_name_and_stops_the_program(tmp_path):
    result, logs = _run_toy("crash", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    # The host script (the engine) names the node and its exit code ...
    assert "magi_lp host h2: node worker/1 failed: exit code 3" in result.stderr
    # ... the coordinator noticed it, stopped the others and exits 1.
    coordinator = (logs / "coordinator/0").read_text()
    assert "node worker/1 stopped answering the coordinator" in coordinator
    assert "node coordinator/0 exits with code 1" in coordinator
    assert "magi_lp host h1: node coordinator/0 failed: exit code 1" in result.stderr
    assert "node worker/0 exits with code 0" in (logs / "worker/0").read_text()
    assert "node server/0 exits with code 0" in (logs / "server/0").read_text()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("slurm.time", "90"),
        ("slurm.time", "1-12:00:00"),
        ("slurm.time", "UNLIMITED"),
        ("slurm.time", "infinite"),
        ("slurm.time", "-1"),
        ("slurm.extra_sbatch", "--mem=0; --mail-type=END"),
        ("slurm.partition", "gpu,debug"),
        ("kubernetes.namespace", "team-a"),
        ("machines.main.node_selector", "gpu=h100, zone=a"),
    ],
)
def test_good_job_settings_pass(key, value):
    config = _config(main={"address": "10.0.0.2"})
    section, _, name = key.rpartition(".")
    node = config.hosts
    for part in section.split("."):
        node = node[part]
    node[name] = value
    validate_hosts_config(config)


def test_the_golden_command_refuses_a_root_without_the_project(tmp_path, capsys):
    from magi_lp.cluster.main import main

    with pytest.raises(SystemExit) as stop:
        main(["--golden", "--root", str(tmp_path)])
    assert stop.value.code == 2
    assert "no configs/cluster_example.py there; pass the project folder" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
