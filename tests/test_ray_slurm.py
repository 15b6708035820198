"""`--launcher slurm|kubernetes` on the current stack: a Ray cluster inside a real SLURM job,
and the KubeRay RayJob (magi_lp/cluster/ray_slurm.py, kuberay.py, ray_node.py, engines.py).

Where Launchpad does not install, `--launcher slurm` writes a batch script that starts one Ray
cluster across the job's machines (`ray start --head`, then `ray start --address` per machine
through srun, each offering its machine's custom resource) and runs the entry point again as
the driver with `--launcher ray`. The SLURM tests meet it as a user does, on the three-node
SLURM 22.05 cluster of tests/slurm_cluster.py (one cluster for the session; skipped in one
line where it cannot start): the entry point submits, then squeue, scancel, `scontrol show
job` and the job's output. The program is TD3 at test sizes (tests/slurm_config.py:td3) and
the tiny DrQ-v2, on three machines: learner; replay + counter + coordinator (the Ray head);
two actors + evaluator. After every job nothing may be left running on any machine, no Ray
temp folder, nothing in HOME, and the job's token in no file.

The RayJob is checked against KubeRay's CRD schema (tests/kuberay/, with its source); no
Kubernetes API server runs here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from magi_lp.cluster import main as cluster
from magi_lp.cluster.engines import cluster_engine, slurm_fit
from magi_lp.cluster.ray_cluster import driver_argv
from magi_lp.engines.base import HOST_SHARE, host_resource
from magi_lp.errors import ConfigError
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from projects.drq_v2 import tiny
from tests.e2e_utils import MARK_VAR, TD3_TINY, checkpoint_counts, read_csv
from tests.slurm_cluster import (
    actor_rows,
    assert_resumed_to_the_limit,
    job_state,
    no_job_outlives_its_test,  # noqa: F401  (autouse: a failed test's job is cancelled)
    slurm_cluster,  # noqa: F401  (the fixture)
    steps,
    submit,
    wait_for_end,
    wait_until_nothing_left,
)
from tests.slurm_config import BASE_PORT

pytest.importorskip("ray", reason="Ray on SLURM is the current stack's (.venv312)")

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / cluster.GOLDEN_DIR
SCHEMA = ROOT / "tests/kuberay/ray.io_rayjobs_v1.schema.json"
TD3 = ["--config=tests/slurm_config.py:td3", "--config.env.action_repeat=4", *TD3_TINY]
DRQ = ["--config=tests/slurm_config.py", *tiny.flags(), "--config.logging.time_delta=0.0"]
MACHINES = ("learner", "server", "acting")
PORTS = range(BASE_PORT, BASE_PORT + 100 * len(MACHINES))
"""The job's ports: each machine's block of 100 from tests/slurm_config.py."""


# --- what is generated (no cluster) ----------------------------------------------------------


def test_the_golden_ray_files_are_what_the_generator_writes():
    generated = cluster.golden_files(ROOT)
    for folder in ("ray-slurm", "ray-kubernetes"):
        names = [n for n in generated if n.startswith(f"{folder}/")]
        assert names, folder
        for name in names:
            assert (GOLDEN / name).read_text() == generated[name], (
                f"{name} differs; python -m magi_lp.cluster --golden"
            )


def test_the_ray_batch_script_starts_one_cluster_and_the_driver():
    script = (GOLDEN / "ray-slurm/drq-reacher.sbatch").read_text()
    subprocess.run(["bash", "-n", "-c", script], check=True)
    # One component per machine; the head on the coordinator's machine (component 0).
    assert script.count("#SBATCH hetjob") == 2
    steps_ = [line for line in script.splitlines() if line.startswith("ray_step ")]
    assert [s.split()[1] for s in steps_] == ["main", "cpu1", "cpu2"]
    starts = [line for line in script.splitlines() if line.startswith('  -- "$RAY" start')]
    assert "--head" in starts[0] and "--port=27000" in starts[0]
    assert all('"--address=$RAY_HEAD"' in s for s in starts[1:])
    for machine, start in zip(("main", "cpu1", "cpu2"), starts, strict=True):
        assert f"'--resources={{\"{host_resource(machine)}\": 1}}'" in start
        # Every port Ray opens is fixed, inside the machine's range.
        ports = [int(p) for p in re.findall(r"-port=(\d+)", start)]
        assert ports and all(27000 <= p < 27100 for p in ports), start
    assert "--gres=gpu:1" in steps_[0] and "--num-gpus=1" in starts[0]
    # The token is made in the job, into the environment only.
    assert "export RAY_AUTH_MODE=token" in script
    assert "RAY_AUTH_TOKEN=$(" in script
    driver = next(line for line in script.splitlines() if line.endswith(" &") and "lp_main" in line)
    assert driver.endswith("--workdir=/shared/runs/cluster_example --launcher=ray &")
    assert "--config=/shared/magi_lp/configs/cluster_example.py:slurm" in driver
    assert "--render" not in driver


def test_the_driver_is_the_submitting_command_with_launcher_ray():
    command = (
        "projects/td3/lp_main.py --config configs/x.py:td3 --launcher slurm "
        "--workdir=runs/w --config.max_actor_steps=5 --dry_run --render out"
    )
    assert driver_argv(command, "/abs/w", "/repo") == [
        "/repo/projects/td3/lp_main.py",
        "--config=/repo/configs/x.py:td3",
        "--config.max_actor_steps=5",
        "--workdir=/abs/w",
        "--launcher=ray",
    ]


def test_the_driver_asks_each_launch_group_for_its_machine():
    config = cluster.load_config_file(str(ROOT / "tests/slurm_config.py"), "td3")
    placement, resources = cluster.joined_cluster_plan(config)
    where = {"learner": "learner", "replay": "server", "counter": "server"}
    where |= {"coordinator": "server", "actor": "acting", "evaluator": "acting"}
    assert resources == {g: {host_resource(h): HOST_SHARE} for g, h in where.items()}
    assert set(placement.groups) == set(where)


def test_a_ray_engine_refuses_what_it_cannot_run():
    config = cluster.load_config_file(str(ROOT / "tests/slurm_config.py"), "td3")
    with pytest.raises(ConfigError, match=r"^--launcher hosts: it starts Launchpad nodes"):
        cluster_engine("hosts", "ray")
    # Two machines at one address (this machine) need Ray port ranges of their own.
    config.hosts.machines.server.base_port = BASE_PORT + 10
    for name in ("learner", "server"):
        config.hosts.machines[name].address = "127.0.0.1"
    engine = cluster_engine("slurm", "ray")
    plan = cluster.plan_hosts(config, engine)
    with pytest.raises(ConfigError, match="share an address and their Ray ports"):
        cluster.make_cluster_job(config, plan, engine, name="x", workdir="/w", command="e.py")


@pytest.mark.parametrize("launcher", ["slurm", "kubernetes"])
def test_a_colocated_replay_is_refused_before_the_job_whose_driver_would_refuse_it(
    launcher, tmp_path
):
    """The job's driver runs `--launcher ray`, which refuses it: the job was queued to fail."""
    args = [f"--config=configs/cluster_example.py:{launcher}", f"--launcher={launcher}"]
    args += ["--config.colocate_learner_and_replay=True", f"--workdir={tmp_path}/run"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "projects/drq_v2/lp_main.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: colocate_learner_and_replay must be False with --launcher {launcher} on this "
        "stack, whose job runs it with --launcher ray (the replay is a node of its own there), "
        "got True; --config.colocate_learner_and_replay=False"
    )
    assert not (tmp_path / "run").exists()


def test_more_hosts_than_the_partition_has_nodes_is_refused_before_sbatch():
    config = cluster.load_config_file(str(ROOT / "tests/slurm_config.py"), "td3+spare")
    engine = cluster_engine("slurm", "ray")
    job = cluster.make_cluster_job(
        config, cluster.plan_hosts(config, engine), engine, name="x", workdir="/w", command="e.py"
    )
    nodes = [("n1", "debug*"), ("n2", "debug*"), ("n3", "debug*"), ("big", "other")]
    assert "the plan has 4 hosts" in slurm_fit(job, nodes)
    assert "the default partition debug has 3 node(s)" in slurm_fit(job, nodes)
    assert slurm_fit(job, [*nodes[:3], ("n4", "debug*")]) == ""
    assert slurm_fit(job, None) == ""  # no sinfo: sbatch decides


def _strict(schema):
    """The schema with unknown fields refused (kubectl's strict validation): every object that
    lists its properties and keeps no unknown fields gets additionalProperties: false."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def test_the_rayjob_passes_kuberays_crd_schema():
    import jsonschema

    vendored = json.loads(SCHEMA.read_text())
    assert vendored["_source"]["commit"] == "feeaf72facab4881ba2b179248bb67315634e229"
    validator = jsonschema.Draft7Validator(_strict(vendored["openAPIV3Schema"]))
    text = (GOLDEN / "ray-kubernetes/drq-reacher.yaml").read_text()
    documents = [d for d in yaml.safe_load_all(text) if d]
    assert [(d["apiVersion"], d["kind"]) for d in documents] == [("ray.io/v1", "RayJob")]
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(documents[0])]
    assert not errors, errors
    bad = copy.deepcopy(documents[0])
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 1  # misspelt
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(documents[0])
    bad["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "password"
    assert list(validator.iter_errors(bad))


def test_the_rayjob_has_a_worker_group_per_machine_with_its_resources():
    job = cluster.golden_job(ROOT, cluster_engine("kubernetes", "ray"))
    rayjob = yaml.safe_load((GOLDEN / "ray-kubernetes/drq-reacher.yaml").read_text())
    spec = rayjob["spec"]
    assert spec["entrypoint"].endswith("--launcher=ray") and "--render" not in spec["entrypoint"]
    cluster_spec = spec["rayClusterSpec"]
    assert cluster_spec["authOptions"] == {"mode": "token"}
    assert cluster_spec["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    groups = {g["groupName"]: g for g in cluster_spec["workerGroupSpecs"]}
    assert sorted(groups) == sorted(h.name for h in job.hosts)
    for host in job.hosts:
        group = groups[host.name]
        assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 1
        offered = json.loads(json.loads(group["rayStartParams"]["resources"]))
        assert offered == {host_resource(host.name): 1}
        assert group["rayStartParams"]["num-gpus"] == str(host.gpus or 0)
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        assert container["resources"]["requests"]["cpu"] == str(host.cpus)
        assert container["resources"].get("limits", {}).get("nvidia.com/gpu", 0) == host.gpus
        assert pod["nodeSelector"] == dict([host.node_selector.split("=")])
        annotations = group["template"]["metadata"]["annotations"]
        for launch_group in job.groups_on(host.name):
            key = "magi-lp/env." + launch_group.launch_group.replace("@", ".at.")
            assert annotations[key].split() == [f"{k}={v}" for k, v in launch_group.env.items()]
    learner = groups["main"]["template"]["metadata"]["annotations"]["magi-lp/env.learner"]
    assert "CUDA_VISIBLE_DEVICES=0" in learner.split()  # the machine's numbering
    # A stop of the job waits for the driver's stop in tiers (3 stages, each up to the
    # notice) before Ray Jobs SIGKILLs it: 3 s by default, which cut the learner's final save.
    # Ray 2.60's JobSupervisor reads the variable from its environment, the job's runtime env.
    stop_wait = int(yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"])
    assert stop_wait >= 3 * job.stop.notice_seconds + 10, stop_wait
    head_pod = cluster_spec["headGroupSpec"]["template"]["spec"]
    assert head_pod["terminationGracePeriodSeconds"] >= stop_wait  # the pods outlast it


# --- on the SLURM cluster ----------------------------------------------------------------------


def _submit(cluster_, workdir: Path, args: list[str], home: Path, entry="projects/td3/lp_main.py"):
    home.mkdir(parents=True, exist_ok=True)
    result, job_id = submit(
        cluster_, entry, [f"--workdir={workdir}", *args], env={MARK_VAR: uuid.uuid4().hex}
    )
    assert job_id, result.stdout[-2000:] + result.stderr[-3000:]
    return result, job_id


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own for the submitting command and so the job: Ray >= 2.59
    would write ~/.ray/auth_token there."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


def _output(workdir: Path, job_id: str) -> str:
    return (workdir / "nodes" / f"slurm-{job_id}.out").read_text()


def _wait_for(condition, timeout: float, what: str, cluster_, job_id: str, workdir: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not cluster_.run("squeue", "-h", "-j", job_id, check=False).strip():
            output = _output(workdir, job_id)[-5000:]
            pytest.fail(
                f"job {job_id} ended before {what}: {job_state(cluster_, job_id)}\n{output}"
            )
        if time.monotonic() > deadline:
            cluster_.run("scancel", job_id, check=False)
            pytest.fail(f"no {what} after {timeout:.0f} s; cancelled job {job_id}")
        time.sleep(0.5)


def _training(workdir: Path, rows: int = 3):
    learner = workdir / "logs/learner/logs.csv"
    return lambda: learner.is_file() and len(read_csv(learner)) >= rows


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _niceness(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except ProcessLookupError:
        return None


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def _ray_processes(cluster_, job_id: str, name: str) -> list[int]:
    """The job's processes whose command line runs `name` (gcs_server, raylet)."""
    return [
        p
        for p in cluster_.job_processes()
        if name in _cmdline(p) and f"magi_lp_ray.{job_id}." in _cmdline(p)
    ]


def _listening(cluster_) -> list[tuple[int, str]]:
    """(port, process) of every TCP port listening in the cluster's network, but SLURM's."""
    out = subprocess.run(
        cluster_.command(["ss", "-ltnpH"]), capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        port = int(fields[3].rpartition(":")[2])
        users = fields[-1] if fields[-1].startswith("users:") else ""
        if not re.search(r'"(slurm\w*|srun|munged)"', users):
            found.append((port, users))
    return found


def _assert_clean(cluster_, workdir: Path, home: Path, job_id: str, token: str = "") -> None:
    left = wait_until_nothing_left(cluster_)
    assert not left, f"left running in the cluster: {left}"
    temp = sorted(Path("/tmp").glob(f"magi_lp_ray.{job_id}*"))
    assert not temp, f"Ray temp folders left: {temp}"
    assert not any(home.iterdir()), f"files in HOME: {list(home.rglob('*'))}"
    if token:
        for path in [*workdir.rglob("*"), *home.rglob("*")]:
            if path.is_file():
                assert token.encode() not in path.read_bytes(), f"the job's token is in {path}"


def _completed(cluster_, workdir: Path, job_id: str, timeout: float = 300) -> str:
    wait_for_end(cluster_, job_id, timeout)
    output = _output(workdir, job_id)
    assert job_state(cluster_, job_id) == ("COMPLETED", "0:0"), output[-4000:]
    # 6 nodes when the driver has seen the coordinator's run() return before its stop request,
    # 7 when the request came first (seen once at load 5): both are the stop at the limit.
    assert re.search(
        r"the coordinator reached max_actor_steps: stopping [67] nodes in 3 stages", output
    ), output[-4000:]
    assert "magi_lp: Ray stopped on all 3 machines; exit code 0" in output
    assert "killing them" not in output
    return output


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_scancel_stops_in_tiers_and_a_resubmission_resumes_to_completion(
    slurm_cluster,  # noqa: F811
    tmp_path,
    home,
):
    cluster_, workdir = slurm_cluster, tmp_path / "run"
    result, job_id = _submit(cluster_, workdir, [*TD3, "--config.max_actor_steps=1000000"], home)
    assert f"stop it with scancel {job_id}" in result.stderr
    script = (workdir / "cluster/slurm-td3.sbatch").read_text()
    assert '"$RAY" start --head' in script and "magi_lp.cluster.ray_node" in script
    _wait_for(_training(workdir), 300, "learner updates", cluster_, job_id, workdir)
    # One Ray node per machine, each an srun step, and the batch script with the driver.
    assert {f"ray@{m}" for m in MACHINES} <= set(steps(cluster_, job_id))
    (gcs,) = _ray_processes(cluster_, job_id, "gcs_server")
    token = _environ(gcs)["RAY_AUTH_TOKEN"]
    assert _environ(gcs)["RAY_AUTH_MODE"] == "token" and len(token) == 64
    assert token not in script
    listening = _listening(cluster_)
    assert listening and all(port in PORTS for port, _ in listening), listening
    # The nodes (Ray's workers) run at the niceness the job's processes start at (0 on a
    # terminal), not Ray's default of 15 above it (a suite run under `nice` starts higher).
    processes = cluster_.job_processes()
    workers = [p for p in processes if _cmdline(p).startswith("ray::")]
    niceness = {p: n for p in workers if (n := _niceness(p)) is not None}
    base = {_niceness(p) for p in processes if "magi_lp.cluster.ray_node" in _cmdline(p)}
    base.discard(None)
    assert len(base) == 1 and base != {15}, base
    assert workers and set(niceness.values()) == base, (niceness, base)

    cancelled = time.monotonic()
    cluster_.run("scancel", job_id)
    stop_seconds = wait_for_end(cluster_, job_id, 90) - cancelled
    output = _output(workdir, job_id)
    assert job_state(cluster_, job_id)[0] == "CANCELLED", output[-4000:]
    assert f"JOB {job_id} ON n" in output and "CANCELLED AT" in output
    assert "magi_lp: SIGTERM: the job is being stopped" in output
    assert "received SIGTERM: stopping 7 nodes in 3 stages" in output, output[-4000:]
    assert re.search(
        r"all 7 nodes ended [\d.]+ s after the stop began( \(stages: .*\))?; exit code 0", output
    )
    assert "magi_lp: Ray stopped on all 3 machines; exit code 0" in output
    assert "killing them" not in output and "Terminated" not in output
    for machine in MACHINES:
        assert f"magi_lp: Ray on {machine}: SIGTERM: Ray stays up" in output
    counts = checkpoint_counts(workdir)  # the learner's final save, with the counter's counts
    assert counts["actor_steps"] > 0 and counts["learner_steps"] >= 1, counts
    _assert_clean(cluster_, workdir, home, job_id, token)
    count_before = counts["actor_steps"]
    rows_before = {label: len(rows) for label, rows in actor_rows(workdir).items()}
    learner_rows_before = len(read_csv(workdir / "logs/learner/logs.csv"))

    limit = count_before + 400  # an episode is 100 steps: each actor ends one or more
    _, job_id = _submit(cluster_, workdir, [*TD3, f"--config.max_actor_steps={limit}"], home)
    _completed(cluster_, workdir, job_id)
    assert_resumed_to_the_limit(workdir, rows_before, count_before, limit)
    resumed = read_csv(workdir / "logs/learner/logs.csv")[learner_rows_before:]
    assert resumed and all(
        int(float(r["learner_steps"])) > counts["learner_steps"] for r in resumed
    )
    _assert_clean(cluster_, workdir, home, job_id)
    print(f"ray on slurm: scancel to the last machine's end {stop_seconds:.1f} s")


def _killed_machine_ends_the_run(cluster_, workdir: Path, home: Path, kill) -> float:
    _, job_id = _submit(cluster_, workdir, [*TD3, "--config.max_actor_steps=1000000"], home)
    _wait_for(_training(workdir), 300, "learner updates", cluster_, job_id, workdir)
    address = re.search(r"acting at ([\d.]+)", _output(workdir, job_id)).group(1)
    killed = time.monotonic()
    kill(job_id, address)
    seconds = wait_for_end(cluster_, job_id, 180) - killed
    output = _output(workdir, job_id)
    assert job_state(cluster_, job_id) == ("FAILED", "1:0"), output[-4000:]
    # The machine, at once and at the end: one line each.
    assert "magi_lp: Ray on machine acting ended while the program ran" in output
    failed = [line for line in output.splitlines() if line.startswith("magi_lp: the run failed")]
    assert len(failed) == 1, output[-4000:]
    assert re.fullmatch(
        r"magi_lp: the run failed: Ray on machine acting died while the program ran \(.+\)",
        failed[0],
    ), failed
    # The driver names the node it lost and stops the others in tiers.
    assert re.search(r"node (actor|evaluator)/\d \(group '\w+', pid \d+\) died", output), output
    # ...and says why: its machine is gone (not "another process killed it").
    assert re.search(rf"cause: .*its machine \({re.escape(address)}\).*gone", output) or (
        f"cause: the machine it ran on ({address}) died" in output
    ), output[-4000:]
    assert "another process killed it" not in output
    assert re.search(
        r"all 7 nodes ended [\d.]+ s after the stop began( \(stages: .*\))?; exit code 1", output
    )
    assert "magi_lp: Ray stopped on all 3 machines; exit code 1" in output
    _assert_clean(cluster_, workdir, home, job_id)
    return seconds


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_a_killed_raylet_ends_the_run_and_names_the_machine(slurm_cluster, tmp_path, home):  # noqa: F811
    def kill(job_id: str, address: str) -> None:
        raylets = [
            p
            for p in _ray_processes(slurm_cluster, job_id, "/raylet ")
            if f"--node_ip_address={address}" in _cmdline(p)
        ]
        assert len(raylets) == 1, raylets
        subprocess.run(["kill", "-KILL", str(raylets[0])], check=True)

    seconds = _killed_machine_ends_the_run(slurm_cluster, tmp_path / "run", home, kill)
    print(f"ray on slurm: raylet SIGKILLed to the job's end {seconds:.1f} s")


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_a_killed_srun_step_ends_the_run_and_names_the_machine(slurm_cluster, tmp_path, home):  # noqa: F811
    def kill(job_id: str, address: str) -> None:
        step = steps(slurm_cluster, job_id)["ray@acting"]
        slurm_cluster.run("scancel", "--signal=KILL", step)

    seconds = _killed_machine_ends_the_run(slurm_cluster, tmp_path / "run", home, kill)
    print(f"ray on slurm: the machine's step SIGKILLed to the job's end {seconds:.1f} s")


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--config.hosts.machines.learner.gpus=1"],
            "error: SLURM refused the job: sbatch: error:",
        ),
        (
            ["--config=tests/slurm_config.py:td3+spare"],
            "error: SLURM cannot run the job: the plan has 4 hosts (acting, learner, server, "
            "spare), each a whole node of its own: the default partition debug has 3 node(s)",
        ),
    ],
    ids=["gpus-it-lacks", "more-machines-than-nodes"],
)
def test_a_job_the_cluster_cannot_run_is_refused_in_one_line(slurm_cluster, tmp_path, args, says):  # noqa: F811
    flags = [*args, *TD3[1:]] if args[0].startswith("--config=") else [*TD3, *args]
    result, job_id = submit(
        slurm_cluster, "projects/td3/lp_main.py", [f"--workdir={tmp_path / 'run'}", *flags]
    )
    assert result.returncode == 1 and not job_id, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(says), result.stderr[-2000:]
    assert not slurm_cluster.run("squeue", "-h").strip()


@pytest.mark.integration
@pytest.mark.timeout(480)
def test_drq_v2_runs_on_ray_in_the_job_to_its_step_limit(slurm_cluster, tmp_path, home):  # noqa: F811
    cluster_, workdir = slurm_cluster, tmp_path / "run"
    _, job_id = _submit(
        cluster_,
        workdir,
        [*DRQ, "--config.max_actor_steps=300"],
        home,
        "projects/drq_v2/lp_main.py",
    )
    output = _completed(cluster_, workdir, job_id, timeout=420)
    assert "replay: device store" in output, output[-3000:]
    counts = checkpoint_counts(workdir)
    assert 300 <= counts["actor_steps"] < 300 + 2 * DISTRIBUTED_COUNT_EVERY, counts
    assert counts["learner_steps"] >= 1, counts
    _assert_clean(cluster_, workdir, home, job_id)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
