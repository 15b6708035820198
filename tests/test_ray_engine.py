"""The distributed program on Ray (`lp_main.py --launcher ray`), end to end, on the current stack.

Each test runs a real entry point with a real embedded Ray (its GCS, raylet and one worker
process per node), TD3 at test sizes (episodes of 100 steps, updates of ~2 ms) and DrQ-v2 at
projects/drq_v2/tiny.py's. Every process the run starts inherits a marker variable (Ray's
processes inherit the driver's environment), so leftovers are found by it. HOME is a folder of
the test's own: nothing may appear there (Ray >= 2.59 would write `~/.ray/auth_token`).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from magi_lp.launch import processes
from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
from projects.drq_v2 import tiny
from tests.e2e_utils import (
    MARK_VAR,
    REPO,
    TD3_TINY,
    BackgroundRun,
    assert_no_leftovers,
    checkpoint_counts,
    column,
    read_csv,
)

pytest.importorskip("ray", reason="Ray is the current stack's engine (.venv312)")
pytestmark = pytest.mark.integration

TD3 = ["projects/td3/lp_main.py", "--config", "configs/td3_cartpole.py", *TD3_TINY]
TD3_TWO_ACTORS = [*TD3, "--config.num_actors=2", "--config.num_evaluators=1"]
# Up to the limit, the actors report every DISTRIBUTED_COUNT_EVERY steps each.
SLACK = 2 * DISTRIBUTED_COUNT_EVERY


class Run(BackgroundRun):
    """`python <entry point> --launcher ray ...` in its own session, HOME and marker."""

    def __init__(
        self, tmp_path: Path, argv: list[str], name: str = "run", ray_address: str | None = None
    ):
        self.workdir = tmp_path / "workdir"
        self.home = tmp_path / "home"
        self.home.mkdir(exist_ok=True)
        self.log = tmp_path / f"{name}.log"
        self.mark = uuid.uuid4().hex
        env = dict(os.environ, HOME=str(self.home), PYTHONUNBUFFERED="1", **{MARK_VAR: self.mark})
        env.pop("RAY_ADDRESS", None)
        if ray_address is not None:
            env["RAY_ADDRESS"] = ray_address
            # Where `auto` looks for a running cluster: none of the machine's.
            env["RAY_TMPDIR"] = str(tmp_path)
        env.setdefault("MUJOCO_GL", "egl")
        script, *flags = argv
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / script),
                    *flags,
                    "--launcher",
                    "ray",
                    f"--workdir={self.workdir}",
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def engine_flags(self) -> list[str]:
        return ["--launcher", "ray", f"--workdir={self.workdir}"]

    def kill_everything(self) -> list[str]:
        killed = processes.kill_marked(MARK_VAR, self.mark)
        self.process.kill()
        return killed

    def wait_for(self, condition, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(
                    f"exited ({self.process.returncode}) before {what}:\n{self.output()[-5000:]}"
                )
            if time.monotonic() > deadline:
                processes.kill_marked(MARK_VAR, self.mark)
                pytest.fail(f"no {what} within {timeout} s:\n{self.output()[-5000:]}")
            time.sleep(0.5)

    def node_process(self, group: str, index: int) -> psutil.Process:
        """The node's process: the one of this run whose stdout is the node's log."""
        log = str(self.workdir / "nodes" / group / str(index))
        for proc in processes.processes_marked(MARK_VAR, self.mark):
            try:
                if os.readlink(f"/proc/{proc.pid}/fd/1") == log:
                    return proc
            except OSError:
                continue
        raise AssertionError(f"no process writes {log}")

    def assert_clean(self) -> None:
        assert_no_leftovers(self.mark)
        assert not any(self.home.iterdir()), f"files in HOME: {list(self.home.rglob('*'))}"


def _stop_seconds(output: str) -> float:
    match = re.search(
        r"all \d+ nodes ended ([\d.]+) s after the stop began(?: \(stages: [^)]*\))?; exit code 0$",
        output,
        re.M,
    )
    assert match, output[-3000:]
    return float(match.group(1))


@pytest.mark.timeout(900)
def test_td3_on_ray_trains_to_its_limit_and_a_relaunch_resumes_without_repeating(tmp_path):
    first = Run(tmp_path, [*TD3_TWO_ACTORS, "--config.max_actor_steps=600"], "first")
    assert first.wait(420) == 0, first.output()[-5000:]
    output = first.output()
    assert "started 7 nodes on Ray" in output, output[-3000:]
    assert "the coordinator reached max_actor_steps" in output
    assert "killing them" not in output
    counts = checkpoint_counts(first.workdir)
    assert 600 <= counts["actor_steps"] < 600 + SLACK, counts
    learner = read_csv(first.workdir / "logs/learner/logs.csv")
    assert column(learner, "critic_loss") and all(
        map(math.isfinite, column(learner, "critic_loss"))
    )
    assert column(read_csv(first.workdir / "logs/evaluator_0/logs.csv"), "episode_return")
    # Its evaluation at the limit was whole and recorded: a relaunch as it was is finished.
    record = json.loads((first.workdir / "logs/evaluator_0/final_evaluation.json").read_text())
    assert record["actor_steps"] >= 600 == record["max_actor_steps"], record
    assert "done: the run in" in output and "was evaluated there" in output, output[-3000:]
    # Each node's output is its own log, as under Launchpad.
    for group, index in [("learner", 0), ("actor", 1), ("replay", 0), ("counter", 0)]:
        assert (first.workdir / "nodes" / group / str(index)).is_file(), (group, index)
    first.assert_clean()
    learner_steps = counts["learner_steps"]

    second = Run(tmp_path, [*TD3_TWO_ACTORS, "--config.max_actor_steps=1200"], "second")
    assert second.wait(420) == 0, second.output()[-5000:]
    resumed = checkpoint_counts(second.workdir)
    assert f"resuming from the workdir's newest checkpoint: learner step {learner_steps}," in (
        second.output()
    ), second.output()[-3000:]
    # Counting went on from the first run's counts (restored with the learner's checkpoint),
    # not from 0, and stopped at the new limit.
    assert 1200 <= resumed["actor_steps"] < 1200 + SLACK, resumed
    assert resumed["learner_steps"] > learner_steps
    steps = column(read_csv(second.workdir / "logs/learner/logs.csv"), "learner_steps")
    after = [s for s in steps if s > learner_steps]
    assert after, "no learner rows after the resume"
    # No learner step counted twice: the learner's log rows keep increasing.
    assert steps == sorted(steps), "learner steps went back after the resume"
    # The first launch's node logs are kept beside the second's, and the launcher's lines of
    # both launches are in the workdir, dated, as under Launchpad.
    nodes = second.workdir / "nodes"
    assert "resuming from checkpoint" not in (nodes / "learner/0.1").read_text()
    assert "resuming from checkpoint" in (nodes / "learner/0").read_text()
    launcher_log = (nodes / "launcher.log").read_text()
    assert launcher_log.count("started 7 nodes on Ray") == 2, launcher_log
    assert "logs of the earlier launch kept as" in launcher_log, launcher_log
    assert launcher_log.count(f"workdir: {second.workdir}") == 2, launcher_log
    assert "resuming from the workdir's newest checkpoint" in launcher_log, launcher_log
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", launcher_log, re.M), launcher_log
    second.assert_clean()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["ctrl-c"])
def test_a_stop_signal_ends_the_ray_run_in_tiers_with_a_final_save(tmp_path, sig):
    run = Run(tmp_path, [*TD3, "--config.max_actor_steps=1000000"])
    learner_log = run.workdir / "logs/learner/logs.csv"
    run.wait_for(lambda: learner_log.exists() and read_csv(learner_log), "learner step")
    # The plan's env is in each node's process, as Launchpad's PythonProcess(env=) gives it.
    actor_env = run.node_process("actor", 0).environ()
    assert actor_env["CUDA_VISIBLE_DEVICES"] == "" and actor_env["JAX_PLATFORMS"] == "cpu"
    assert actor_env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    # The run's token is in its processes' environment, never in a file.
    assert actor_env["RAY_AUTH_MODE"] == "token" and len(actor_env["RAY_AUTH_TOKEN"]) >= 32
    os.kill(run.process.pid, sig)
    assert run.wait(60) == 0, run.output()[-5000:]
    output = run.output()
    assert f"received {signal.Signals(sig).name}" in output
    assert "killing them" not in output
    print(f"{signal.Signals(sig).name}: nodes ended {_stop_seconds(output):.1f} s after the stop")
    counts = checkpoint_counts(run.workdir)
    assert counts["learner_steps"] >= 1, counts  # the learner's final save holds its steps
    run.assert_clean()


@pytest.mark.timeout(600)
def test_a_dead_gcs_is_named_and_the_run_stops_in_tiers_with_a_final_save(tmp_path):
    """SIGKILL of the embedded Ray's GCS (as `ray stop` run on the machine does): the driver
    names it within a poll and stops the nodes in tiers, which still reach each other, so the
    learner saves; exit 1. Before, the nodes went on for 60 s, then the driver's Ray client
    gave up with a C++ error and exited without the final save."""
    run = Run(tmp_path, [*TD3, "--config.max_actor_steps=1000000"])
    learner_log = run.workdir / "logs/learner/logs.csv"
    run.wait_for(lambda: learner_log.exists() and read_csv(learner_log), "learner step")
    marked = processes.processes_marked(MARK_VAR, run.mark)
    (gcs,) = [p for p in marked if p.name() == "gcs_server"]
    gcs.kill()
    assert run.wait(60) == 1, run.output()[-5000:]
    output = run.output()
    died = f"Ray's gcs_server (pid {gcs.pid}) died"
    assert re.search(rf"{re.escape(died)}: stopping \d+ nodes in 3 stages", output), output[-3000:]
    assert f"exit code 1 ({died})" in output
    logged = column(read_csv(learner_log), "learner_steps")
    assert checkpoint_counts(run.workdir)["learner_steps"] >= max(logged)  # the final save
    run.assert_clean()


def _relaunched_past(tmp_path: Path, argv: list[str], counts: dict, name: str) -> Run:
    """`argv` relaunched in the same workdir with no limit, once its learner has logged a
    row beyond the saved `counts` it resumed from: a learner step and counted actor steps
    past them. (The learner's first steps come from the restored replay, before any actor has
    reported a step: a stop then saves the actors' counts unchanged, as a fresh-clone run on a
    busy machine saw.)"""
    run = Run(tmp_path, [*argv, "--config.max_actor_steps=1000000"], name)
    learner_steps, actor_steps = counts["learner_steps"], counts["actor_steps"]

    def past() -> bool:
        log = run.workdir / "logs/learner/logs.csv"
        rows = read_csv(log) if log.exists() else []
        return any(
            float(row.get("learner_steps") or 0) > learner_steps
            and float(row.get("actor_steps") or 0) > actor_steps
            for row in rows
        )

    run.wait_for(
        past,
        f"a learner row past {learner_steps} learner and {actor_steps} actor steps (the resume)",
        timeout=360,
    )
    return run


def _kill_actor_1(run: Run) -> float:
    """SIGKILLs actor 1's process; the run must name it and end with exit code 1. Returns
    the seconds from the kill to the driver's exit."""
    victim = run.node_process("actor", 1)
    killed_at = time.monotonic()
    victim.kill()
    assert run.wait(120) == 1, run.output()[-5000:]
    ended_after = time.monotonic() - killed_at
    assert re.search(
        r"node actor/1 \(group 'actor', pid \d+\) died: killed by signal SIGKILL", run.output()
    ), run.output()[-3000:]
    return ended_after


def _learner_steps(workdir: Path) -> list[int]:
    log = workdir / "logs/learner/logs.csv"
    return column(read_csv(log), "learner_steps") if log.exists() else []


@pytest.mark.timeout(1200)
def test_drq_v2_on_ray_trains_to_its_limit_resumes_and_stops_on_ctrl_c_and_a_killed_node(
    tmp_path,
):
    """DrQ-v2's whole life on Ray, one run after another in one workdir: to its frame limit;
    relaunched, it goes on from the saved counts and Ctrl-C ends it with a final save;
    relaunched again, an actor's SIGKILL is named and ends the run."""
    drq = [
        "projects/drq_v2/lp_main.py",
        f"--config={REPO / 'configs/reacher_hard_distributed.py'}",
        *tiny.flags({"debug.check_devices": True}),
        "--config.num_actors=2",
    ]
    # The default time filter (1 s): evaluators keep every row, so the evaluation at the
    # limit is logged even when the one before it came less than a second earlier.
    first = Run(tmp_path, [*drq, "--config.max_actor_steps=300"], "first")
    assert first.wait(480) == 0, first.output()[-5000:]
    output = first.output()
    # The frames reached the learner's device store through the served step queue.
    assert "replay: device store" in output, output[-3000:]
    assert "killing them" not in output
    counts = checkpoint_counts(first.workdir)
    assert 300 <= counts["actor_steps"] < 300 + SLACK, counts
    assert counts["learner_steps"] >= 1, counts
    # The run ended after its evaluation at the limit (the coordinator waits for it).
    evaluated_at = column(read_csv(first.workdir / "logs/evaluator_0/logs.csv"), "actor_steps")
    assert evaluated_at and max(evaluated_at) >= 300, evaluated_at
    first.assert_clean()

    second = _relaunched_past(tmp_path, drq, counts, "second")
    os.kill(second.process.pid, signal.SIGINT)
    assert second.wait(60) == 0, second.output()[-5000:]
    output = second.output()
    assert "received SIGINT" in output and "killing them" not in output, output[-3000:]
    print(f"DrQ-v2, Ctrl-C: nodes ended {_stop_seconds(output):.1f} s after the stop")
    resumed = checkpoint_counts(second.workdir)
    assert resumed["actor_steps"] > counts["actor_steps"], (counts, resumed)
    assert resumed["learner_steps"] > counts["learner_steps"], (counts, resumed)
    steps = _learner_steps(second.workdir)
    assert steps == sorted(steps), "learner steps went back after the resume"
    second.assert_clean()

    third = _relaunched_past(tmp_path, drq, resumed, "third")
    ended_after = _kill_actor_1(third)
    print(f"DrQ-v2, SIGKILL of actor 1: the driver exited {ended_after:.1f} s later")
    third.assert_clean()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("flag", "address", "says"),
    [
        (
            "--config.colocate_learner_and_replay=True",
            None,
            "colocate_learner_and_replay must be False",
        ),
        ("--config.num_actors=0", None, "num_actors"),
        # Ray's client retried this for minutes, with the workdir already made.
        ("--config.seed=1", "127.0.0.1:1", "RAY_ADDRESS=127.0.0.1:1: nothing answers at"),
        # No cluster on this machine for `auto`: refused by ray.init before, workdir made.
        ("--config.seed=1", "auto", "RAY_ADDRESS=auto: Could not find any running Ray instance"),
    ],
)
def test_bad_input_is_refused_before_ray_starts(tmp_path, flag, address, says):
    if address == "auto":
        # `auto` connects to any Ray cluster whose gcs_server runs here (Ray greps ps), as
        # another job's on a busy CI machine would be: then there is nothing to refuse.
        running = [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "gcs_server"]
        if running:
            pytest.skip(f"a Ray cluster runs on this machine (gcs_server {running})")
    run = Run(tmp_path, [*TD3, flag], ray_address=address)
    code = run.wait(240)
    output = run.output()
    assert code == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], output[-3000:]
    assert "Traceback" not in output
    said = "\n".join(line for line in output.splitlines() if not line.startswith("error:"))
    assert "started" not in said and "Ray" not in said.replace("--launcher ray", "")
    assert not run.workdir.exists(), "a refused run made its workdir"
    run.assert_clean()


def test_a_dry_run_refuses_the_cluster_address_the_launch_refuses(tmp_path):
    """It printed a plan for RAY_ADDRESS=not_an_address; the launch then refused it."""
    result = subprocess.run(
        [sys.executable, str(REPO / TD3[0]), *TD3[1:], "--dry_run", f"--workdir={tmp_path}/r"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": "not_an_address"},
    )
    assert result.returncode == 2, result.stdout[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: RAY_ADDRESS=not_an_address: it is not host:port (or auto); e.g. 10.0.0.5:6379; "
        "start the cluster there first, or unset RAY_ADDRESS to start ray on this machine"
    ), result.stderr[-2000:]
    assert "engine:" not in result.stdout


def test_a_joined_cluster_is_never_said_to_be_isolated_and_required_isolation_is_refused(
    tmp_path,
):
    """The dry run printed `isolated: yes` for nodes that would run on RAY_ADDRESS's cluster,
    and `isolation='required'` went on unisolated there. Something answers at the address
    (all the launch's check asks before planning); no Ray cluster is started."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"

        def dry_run(*flags: str) -> subprocess.CompletedProcess:
            argv = [*TD3[1:], "--dry_run", *flags, f"--workdir={tmp_path}/r"]
            return subprocess.run(
                [sys.executable, str(REPO / TD3[0]), *argv],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "RAY_ADDRESS": address},
            )

        planned = dry_run()
        assert planned.returncode == 0, planned.stderr[-2000:]
        assert planned.stdout.strip().splitlines()[-1] == (
            f"network isolation: does not apply: the nodes run on the cluster at {address}, "
            "under its own network rules"
        )
        refused = dry_run("--config.isolation=required")
    assert refused.returncode == 2, refused.stdout[-2000:]
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: isolation='required' with --launcher ray joins the cluster at {address} "
            "(RAY_ADDRESS): the nodes run on other machines"
        )
    ), refused.stderr[-2000:]


def _td3_dry_run_on_ray(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    """TD3's `lp_main.py --launcher ray --dry_run` with `flags`, on this machine's own Ray."""
    return subprocess.run(
        [
            sys.executable,
            str(REPO / TD3[0]),
            *TD3[1:],
            *("--launcher", "ray", "--dry_run", f"--workdir={tmp_path / 'run'}"),
            *flags,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )


def test_isolation_off_on_ray_says_what_it_means_on_ray(tmp_path):
    """The plan said Launchpad's words (Courier and Reverb on all interfaces) for a Ray run."""
    from magi_lp.launch import isolation

    result = _td3_dry_run_on_ray(tmp_path, "--config.isolation=off")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == (
        f"network isolation: isolated: no (isolation=off: {isolation.EXPOSURES['served']})"
    ), result.stdout[-2000:]


def test_a_reverb_checkpoint_on_ray_is_said_to_save_nothing(tmp_path):
    # Ray's replay is served by the toolkit, not Reverb: the flag was taken silently before.
    result = _td3_dry_run_on_ray(tmp_path, "--config.checkpoint.reverb=True")
    assert result.returncode == 0, result.stderr
    assert (
        "notice: checkpoint.reverb=True saves nothing in this run: its replay (host "
        "transitions) is saved by checkpoint.replay=True"
    ) in result.stdout.splitlines(), result.stdout
    assert not (tmp_path / "run").exists()


def _toy_launch(tmp_path: Path):
    """A Launch of ray_toys' nodes (learner, 2 actors, coordinator) with a fake 2-GPU
    inventory (Ray's GPUs are logical here); each node reports into `tmp_path/reports`."""
    import types

    from magi_lp.engines.base import Launch
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.runtime.graph import NodeSpec, ProgramGraph, Ref
    from tests.fake_nvidia import gpu

    sys.path.insert(0, str(REPO / "tests"))
    import ray_toys

    folder = tmp_path / "reports"
    folder.mkdir()
    envs = {
        "learner": {"CUDA_VISIBLE_DEVICES": "1", "JAX_PLATFORMS": "cpu", "TOY_GROUP": "learner"},
        "actor": {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "3", "TOY_GROUP": "actor"},
    }
    nodes = [
        NodeSpec("learner", 0, "learner", ray_toys.Reporter, (str(folder), "learner_0")),
        NodeSpec("actor", 0, "actor", ray_toys.Reporter, (str(folder), "actor_0")),
        NodeSpec("actor", 1, "actor", ray_toys.Reporter, (str(folder), "actor_1")),
        NodeSpec(
            "coordinator",
            0,
            "coordinator",
            ray_toys.Stopper,
            (str(folder), ["learner_0", "actor_0", "actor_1"], Ref("learner_0"), Ref("actor_1")),
        ),
    ]
    plan = types.SimpleNamespace(envs=lambda: envs, inventory=GpuInventory((gpu(0), gpu(1))))
    experiment = types.SimpleNamespace(
        config=types.SimpleNamespace(max_actor_steps=1), frames_per_step=1
    )
    return Launch(ProgramGraph("toys", nodes, store=None), plan, experiment, tmp_path / "work")


def _is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or IPv4's loopback as IPv6 writes it (::ffff:127.0.0.1: Ray's gRPC
    servers)."""
    import ipaddress

    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.timeout(300)
def test_each_node_gets_its_groups_env_and_the_plans_gpus_on_logical_ray_gpus(tmp_path):
    """The Ray engine with a fake 2-GPU inventory (Ray's GPUs are logical here), started from a
    driver that sees no GPU as lp_main's does: each node's process has its launch group's env
    from the plan before Python starts, the plan's GPU ids (Ray does not replace them) and
    Ray's count of its GPUs; handles reach other nodes; Ray's address is loopback."""
    from magi_lp.engines import ray_driver, ray_engine

    launch = _toy_launch(tmp_path)
    folder = tmp_path / "reports"
    home = tmp_path / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.delenv("RAY_ADDRESS", raising=False)
        # lp_main's driver hides every GPU from itself: Ray 2.60's raylet refused num_gpus=2
        # against that empty list until the engine showed it the plan's GPUs for ray.init (the
        # first GPU run, H200, 2026-11-27).
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        code = ray_engine.run(launch)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # the driver's own, back
    assert code == 0
    reports = {p.stem: json.loads(p.read_text()) for p in folder.glob("*_*.json")}
    learner, actor = reports["learner_0"], reports["actor_0"]
    assert learner["env"]["CUDA_VISIBLE_DEVICES"] == "1"  # the plan's id, kept
    assert len(learner["ray_gpu_ids"]) == 1  # Ray counted the one GPU it sees
    assert learner["env"]["TOY_GROUP"] == "learner" and learner["env"]["JAX_PLATFORMS"] == "cpu"
    assert actor["env"]["CUDA_VISIBLE_DEVICES"] == "" and actor["ray_gpu_ids"] == []
    assert actor["env"]["OMP_NUM_THREADS"] == "3"  # the plan's threads, not Ray's default 1
    assert not learner["jax_imported"]  # the env was there before anything imported JAX
    assert len({r["pid"] for r in reports.values()}) == 3  # one process per node
    # The nodes' temp folder is the run's own, in its Ray folder, and went with it.
    node_tmp = Path(learner["tempdir"])
    assert node_tmp.name == ray_driver.NODE_TMP and node_tmp.parent.name.startswith("magi_lp_ray_")
    assert actor["tempdir"] == str(node_tmp) and not node_tmp.parent.exists()
    assert json.loads((folder / "answers.json").read_text()) == ["pong", "pong"]
    # The embedded Ray stays on loopback: Ray swapped 127.0.0.1 for the machine's outward
    # address (192.0.2.2 here), which an isolated run's namespace lacks (ray_seam.loopback_ray).
    assert {r["node_ip"] for r in reports.values()} == {"127.0.0.1"}
    # ... and so does every socket any of its processes listens on (the driver, the GCS, the
    # raylet, Ray's agents and the nodes' workers), read from the processes themselves while
    # the nodes ran, not from an address Ray recorded.
    listening = json.loads((folder / "listening.json").read_text())
    names = {s["name"] for s in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    assert {r["pid"] for r in reports.values()} <= {s["pid"] for s in listening}, listening
    outward = [s for s in listening if not _is_loopback(s["ip"])]
    assert not outward, outward
    for name in ("learner/0", "actor/1", "coordinator/0"):
        assert (tmp_path / "work" / "nodes" / name).is_file(), name
    assert not any(home.iterdir())


@pytest.mark.timeout(300)
def test_a_node_that_cannot_be_made_is_reported_as_dead_and_the_started_ones_stop(tmp_path, capfd):
    """A node whose constructor raises (actor 1 of the toy launch): one dead-node report with
    the error's line and its log's end, no further node started, the ones started stopped in
    tiers, exit 1. Before, Ray's error went out of the launch as the driver's traceback."""
    from magi_lp.engines import ray_engine
    from magi_lp.runtime.graph import NodeSpec

    launch = _toy_launch(tmp_path)
    import ray_toys

    launch.graph.nodes[2] = NodeSpec(
        "actor", 1, "actor", ray_toys.Broken, (str(tmp_path / "reports"), "actor_1")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(tmp_path / "home"))
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        code = ray_engine.run(launch)
    output = capfd.readouterr()
    said = output.out + output.err
    assert code == 1, said
    assert re.search(r"node actor/1 \(group 'actor', pid \d+\) died: exit code 1", said), said
    assert "cause: RuntimeError: the broken node cannot be made" in said
    assert "started 2 of 4 nodes on Ray (learner x1, actor x1)" in said
    assert "every node up" not in said and "Traceback" not in said.split("last 20 lines")[0]
    assert "exit code 1 (node actor/1 died)" in said
    assert "building the broken node" in (tmp_path / "work/nodes/actor/1").read_text()
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "actor_0.json",
        "learner_0.json",
    ]


def _ctrl_c_pressed(
    tmp_path: Path, capfd, learner: str, presses: int, notice_secs: float = 10.0
) -> tuple[int, str]:
    """ray_engine.run of a toy learner_0 (ray_toys.`learner`) and a ray_toys.Stubborn
    actor_0, with `presses` real SIGINTs to this driver once both have reported, a second
    apart; (exit code, what it said)."""
    import dataclasses
    import threading

    from magi_lp.engines import ray_engine
    from magi_lp.runtime.graph import NodeSpec

    launch = dataclasses.replace(_toy_launch(tmp_path), termination_notice_secs=notice_secs)
    import ray_toys

    folder = tmp_path / "reports"
    launch.graph.nodes[:] = [
        NodeSpec("learner", 0, "learner", getattr(ray_toys, learner), (str(folder), "learner_0")),
        NodeSpec("actor", 0, "actor", ray_toys.Stubborn, (str(folder), "actor_0")),
    ]
    ready = [folder / "actor_0.json", folder / "learner_0.json"]

    def press() -> None:
        deadline = time.monotonic() + 120
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)  # the engine's handler records each
            time.sleep(1.0)  # more than an echo apart

    presser = threading.Thread(target=press, daemon=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(tmp_path / "home"))
        patch.delenv("RAY_ADDRESS", raising=False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        presser.start()
        code = ray_engine.run(launch)
    presser.join(10)
    output = capfd.readouterr()
    return code, output.out + output.err


@pytest.mark.timeout(300)
def test_a_node_that_does_not_end_at_the_stop_is_killed_after_the_notice(tmp_path, capfd):
    """One Ctrl-C, an actor that ignores it (as one stuck in a C++ call): after the notice the
    driver kills it, says so and exits 1 naming it; the learner still ends by itself."""
    code, said = _ctrl_c_pressed(tmp_path, capfd, "Reporter", 1, notice_secs=3.0)
    assert code == 1, said
    assert "nodes still running after 3 s: actor_0; killing them" in said, said
    assert "(actor_0 SIGKILLed after the 3 s notice)" in said, said
    assert "its final save is lost" not in said
    stubborn = json.loads((tmp_path / "reports/actor_0.json").read_text())["pid"]
    assert not psutil.pid_exists(stubborn) or psutil.Process(stubborn).status() == "zombie"


def _toys_stopped(tmp_path: Path, capfd, name: str, replacement) -> tuple[int, str]:
    """ray_engine.run of the toy launch with `ray_engine.<name>` replaced (where the test's
    SIGINT comes from), HOME a folder of its own and left empty; (exit code, what it said)."""
    from magi_lp.engines import ray_driver, ray_engine

    launch = _toy_launch(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.delenv("RAY_ADDRESS", raising=False)
        # The driver's own pieces live in ray_driver; the start of Ray in ray_engine.
        patch.setattr(ray_driver if hasattr(ray_driver, name) else ray_engine, name, replacement)
        code = ray_engine.run(launch)
    output = capfd.readouterr()
    assert not any(home.iterdir())
    return code, output.out + output.err


@pytest.mark.timeout(300)
def test_a_ctrl_c_while_ray_starts_stops_ray_and_starts_no_node(tmp_path, capfd):
    """A real SIGINT to this driver while the embedded Ray starts (right after ray.init: the
    window where a Ctrl-C landed in a TD3 run by hand, 2026-11-27): no node starts, and the
    run says so in one line instead of "started 0 nodes", "Ray and every node up" and an
    empty status table written to the workdir."""
    from magi_lp.engines import ray_engine

    start_ray = ray_engine._start_ray

    def start_then_ctrl_c(*args, **kwargs):
        start_ray(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)  # the engine's handler records it

    code, said = _toys_stopped(tmp_path, capfd, "_start_ray", start_then_ctrl_c)
    assert code == 0, said
    assert "received SIGINT while Ray started: no node was started; Ray stopped" in said
    assert "started 0" not in said and "every node up" not in said
    assert not any((tmp_path / "reports").iterdir())  # no node ran
    assert not (tmp_path / "work" / "status.csv").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back


@pytest.mark.timeout(300)
def test_a_ctrl_c_after_the_first_node_stops_the_nodes_started_and_says_how_many(tmp_path, capfd):
    """A real SIGINT to this driver right after the first of the 4 toy nodes started: the
    nodes being made with it (the learner and the two actors need no handle: made together)
    are made, no more are started, the engine says "started 3 of 4", and stops them as any
    stop does."""
    from magi_lp.engines import ray_driver

    class FirstThenCtrlC(ray_driver._NodeProcess):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGINT)  # the engine's handler records it

    code, said = _toys_stopped(tmp_path, capfd, "_NodeProcess", FirstThenCtrlC)
    assert code == 0, said
    assert "started 3 of 4 nodes on Ray (learner x1, actor x2)" in said
    assert "received SIGINT" in said and "every node up" not in said
    reports = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert reports == ["actor_0.json", "actor_1.json", "learner_0.json"]  # no coordinator


_ASK_THE_CLUSTER = """
import sys, ray
from magi_lp.engines import ray_driver, ray_engine, ray_nodes, ray_seam
from magi_lp.errors import ConfigError
ray_seam.use_run_token()  # as the engine does: no ~/.ray/auth_token
ray.init(num_cpus=1, num_gpus=0, resources={"magi_lp_host_main": 1}, include_dashboard=False,
         _temp_dir=sys.argv[1], _node_ip_address="127.0.0.1", configure_logging=False,
         log_to_driver=False)
assert ray_driver._check_the_cluster_has([0, 0], [{"magi_lp_host_main": 0.001}, {}]) == []
print(*ray_driver._check_the_cluster_has([0.5], [{}]))
try:
    ray_driver._check_the_cluster_has([0], [{"magi_lp_host_cpu1": 0.001}])
except ConfigError as error:
    print(error)
ray.shutdown()
"""


def test_nodes_the_cluster_cannot_hold_are_refused_before_any_is_made(tmp_path):
    """A cluster started by hand without a machine's magi_lp_host_<host> resource (or GPUs)
    kept the nodes pending, and the start waited for ever."""
    import shutil

    from magi_lp.engines import ray_paths

    home = tmp_path / "home"
    home.mkdir()
    session = ray_paths.run_temp_folder("ask_ray_")  # Ray's socket paths must stay short
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ASK_THE_CLUSTER, session],
            cwd=REPO,
            env=dict(os.environ, HOME=str(home)),
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(session, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines() == [
        "the Ray cluster has 0 GPU now and the program's nodes ask for 0.5: they wait until it "
        "has them (an autoscaler adds them; a fixed cluster never does)",
        "the Ray cluster has no magi_lp_host_cpu1: the program's nodes ask for 0.001: Ray would "
        "keep them waiting for ever; start that machine with ray start "
        "--resources='{\"magi_lp_host_cpu1\": 1}' (docs/cluster.md), or leave hosts out of the "
        "config to run anywhere",
    ], done.stdout[-2000:]
