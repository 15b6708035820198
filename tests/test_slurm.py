"""`lp_main.py --launcher slurm` on a real SLURM 22.05 cluster of three nodes on this machine.

The cluster is tests/slurm_cluster.py's fixture (scripts/slurm_cluster.py: munged, slurmctld,
slurmd n1-n3 in a network namespace of their own). Each test meets SLURM as a cluster user
does: the entry point prepares the program and submits it with sbatch, then squeue, scancel
and `scontrol show job` (state and exit code) and the job's output file. The program is the
tiny DrQ-v2 of projects/drq_v2/tiny.py (TD3's tiny settings for the TD3 run) on three hosts
(tests/slurm_config.py): learner; replay + counter + coordinator; two actors + evaluator.
After every job nothing of it may be left running on any node.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from magi_lp.launch import run_folders
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

pytestmark = pytest.mark.integration

DRQ = ["--config=tests/slurm_config.py", *tiny.flags(), "--config.variable_update_period=10"]
DRQ += ["--config.logging.time_delta=0.0"]
TD3 = ["--config=tests/slurm_config.py:td3", "--config.env.action_repeat=4", *TD3_TINY]


def _submit(
    cluster,
    workdir: Path,
    args: list[str],
    entry: str = "projects/drq_v2/lp_main.py",
    env: dict[str, str] | None = None,
):
    result, job_id = submit(
        cluster,
        entry,
        [f"--workdir={workdir}", *args],
        env={MARK_VAR: uuid.uuid4().hex, **(env or {})},
    )
    assert job_id, result.stdout[-2000:] + result.stderr[-3000:]
    return result, job_id


def _output(workdir: Path, job_id: str) -> str:
    return (workdir / "nodes" / f"slurm-{job_id}.out").read_text()


def _actor_steps(workdir: Path) -> int:
    return sum(
        int(float(row["episode_length"]))
        for label in ("actor_0", "actor_1")
        if (workdir / "logs" / label / "logs.csv").is_file()
        for row in read_csv(workdir / "logs" / label / "logs.csv")
    )


def _actor_rows(workdir: Path) -> list[dict[str, int]]:
    return [row for rows in actor_rows(workdir).values() for row in rows]


def _checkpoints(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints/learner"
    return (
        sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.exists() else []
    )


def _wait_for(condition, timeout: float, what: str, cluster, job_id: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not cluster.run("squeue", "-h", "-j", job_id, check=False).strip():
            pytest.fail(f"job {job_id} ended before {what}: {job_state(cluster, job_id)}")
        if time.monotonic() > deadline:
            cluster.run("scancel", job_id, check=False)
            pytest.fail(f"no {what} after {timeout:.0f} s; cancelled job {job_id}")
        time.sleep(0.5)


def _completed_at_its_limit(cluster, workdir: Path, job_id: str) -> None:
    """The job ends COMPLETED with every step's exit code 0, stopped by the coordinator at
    the step limit."""
    wait_for_end(cluster, job_id, 240)
    state, code = job_state(cluster, job_id)
    output = _output(workdir, job_id)
    assert (state, code) == ("COMPLETED", "0:0"), output[-3000:]
    assert "magi_lp: all 6 steps ended; exit code 0" in output
    assert "lp.stop() in coordinator/0: stopping 6 nodes" in output


def _assert_nothing_left(cluster) -> None:
    left = wait_until_nothing_left(cluster)
    assert not left, f"left running in the cluster: {left}"


@pytest.mark.timeout(420)
def test_scancel_stops_cleanly_and_a_resubmission_resumes_to_completion(slurm_cluster, tmp_path):  # noqa: F811
    cluster, workdir = slurm_cluster, tmp_path / "run"
    result, job_id = _submit(cluster, workdir, [*DRQ, "--config.max_actor_steps=100000"])
    assert f"stop it with scancel {job_id}" in result.stderr
    assert (workdir / "cluster/slurm-drq.sbatch").is_file()
    # Training: the learner has logged updates and the actors whole episodes.
    learner_csv = workdir / "logs/learner/logs.csv"
    _wait_for(
        lambda: learner_csv.is_file() and len(read_csv(learner_csv)) >= 5 and _actor_steps(workdir),
        240,
        "learner updates",
        cluster,
        job_id,
    )
    names = steps(cluster, job_id)
    assert {"learner", "replay", "counter", "coordinator", "actor", "evaluator"} <= set(names)

    cancelled = time.monotonic()
    cluster.run("scancel", job_id)
    ended = wait_for_end(cluster, job_id, 60)
    stop_seconds = ended - cancelled
    state, _ = job_state(cluster, job_id)
    assert state == "CANCELLED"
    output = _output(workdir, job_id)
    assert f"JOB {job_id} ON n" in output and "CANCELLED AT" in output
    assert "magi_lp: SIGTERM: the job is being stopped" in output
    assert "magi_lp: all 6 steps ended; exit code 0" in output, output[-3000:]
    coordinator = (workdir / "nodes/coordinator/0").read_text()
    # Whichever node got its SIGTERM first started the tiered stop.
    assert re.search(r"SIGTERM.*: stopping 6 nodes", coordinator), coordinator[-2000:]
    assert "all 6 nodes ended" in coordinator and "exits with code 0" in coordinator
    assert "failed" not in output  # every step (srun) ended with exit code 0
    for log in ("learner/0", "replay/0", "counter/0", "actor/0", "actor/1", "evaluator/0"):
        text = (workdir / "nodes" / log).read_text()
        assert "still running" not in text and "Traceback" not in text, f"{log}: {text[-1500:]}"
    learner_log = (workdir / "nodes/learner/0").read_text()
    assert "counts could not be read" not in learner_log  # the counter outlived the final save
    saved = _checkpoints(workdir)
    assert saved, "no learner checkpoint at the cancel"
    _assert_nothing_left(cluster)
    # The counter's count (actor_steps in the actors' rows; steps of an episode cut by the
    # stop are counted at the stop, so the checkpoint holds at least this).
    count_before = max(row["actor_steps"] for row in _actor_rows(workdir))
    rows_before = {label: len(rows) for label, rows in actor_rows(workdir).items()}
    learner_rows_before = len(read_csv(learner_csv))

    # The same command again, with a limit a little higher: it resumes and completes.
    # Room for the steps counted at the stop beyond the logged ones (cut episodes).
    limit = count_before + 250
    result, job_id = _submit(cluster, workdir, [*DRQ, f"--config.max_actor_steps={limit}"])
    _completed_at_its_limit(cluster, workdir, job_id)
    assert_resumed_to_the_limit(workdir, rows_before, count_before, limit)
    # Each node kept the first job's log beside its own (they were overwritten before).
    assert (workdir / "nodes/learner/0.1").read_text() == learner_log
    for log in ("replay/0", "counter/0", "actor/0", "actor/1", "evaluator/0", "coordinator/0"):
        assert "starting" in (workdir / "nodes" / f"{log}.1").read_text(), log
        assert "starting" in (workdir / "nodes" / log).read_text(), log
    resumed = read_csv(learner_csv)[learner_rows_before:]
    assert all(int(float(r["learner_steps"])) > saved[-1] for r in resumed)
    assert _checkpoints(workdir)[-1] >= saved[-1]
    assert read_csv(workdir / "logs/evaluator_0/logs.csv"), "no evaluation"
    _assert_nothing_left(cluster)
    print(f"slurm: scancel to the last node's end {stop_seconds:.1f} s")


@pytest.mark.timeout(300)
def test_a_killed_step_ends_the_job_and_the_output_names_the_dead_node(slurm_cluster, tmp_path):  # noqa: F811
    cluster, workdir = slurm_cluster, tmp_path / "run"
    _, job_id = _submit(
        cluster,
        workdir,
        [*DRQ, "--config.max_actor_steps=100000", "--config.hosts.heartbeat_timeout_seconds=12"],
    )
    _wait_for(lambda: _actor_steps(workdir) > 0, 240, "actor episodes", cluster, job_id)
    actors = steps(cluster, job_id)["actor"]
    killed = time.monotonic()
    cluster.run("scancel", "--signal=KILL", actors)
    ended = wait_for_end(cluster, job_id, 120)
    state, code = job_state(cluster, job_id)
    output = _output(workdir, job_id)
    assert (state, code) == ("FAILED", "1:0"), output[-3000:]
    assert "magi_lp: step actor on acting failed" in output
    assert "presumed dead" in output
    assert "node actor/" in output  # the coordinator's verdict names the node
    assert "magi_lp: all 6 steps ended; exit code 1" in output
    # The other steps stopped cleanly; the coordinator exits 1 to say the program failed.
    failed = re.findall(r"magi_lp: step (\S+) on \S+ failed", output)
    assert sorted(failed) == ["actor", "coordinator"], output[-3000:]
    assert "the program stopped because of a failure: node actor/" in output
    assert "exits with code 1" in (workdir / "nodes/coordinator/0").read_text()
    _assert_nothing_left(cluster)
    print(f"slurm: step killed to the job's end {ended - killed:.1f} s")


@pytest.mark.timeout(180)
def test_a_job_the_cluster_cannot_run_is_refused_in_one_line(slurm_cluster, tmp_path):  # noqa: F811
    result, job_id = submit(
        slurm_cluster,
        "projects/drq_v2/lp_main.py",
        [f"--workdir={tmp_path / 'run'}", *DRQ, "--config.hosts.machines.learner.gpus=1"],
    )
    assert result.returncode == 1 and not job_id
    refusal = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(refusal) == 1, result.stderr[-2000:]
    assert refusal[0].startswith("error: SLURM refused the job: sbatch: error:")
    assert not slurm_cluster.run("squeue", "-h").strip()


@pytest.mark.timeout(300)
def test_td3_runs_through_the_cluster_to_its_step_limit(slurm_cluster, tmp_path):  # noqa: F811
    cluster, workdir = slurm_cluster, tmp_path / "run"
    # The job's own temp dir (its nodes inherit TMPDIR through sbatch and srun): the host's
    # /tmp also holds the folders of whatever else runs meanwhile (`make test` runs the
    # current stack's leg beside this one, whose runs' folders this test once counted).
    temp = tmp_path / "host_tmp"
    temp.mkdir()
    _, job_id = _submit(
        cluster,
        workdir,
        [*TD3, "--config.max_actor_steps=500"],
        entry="projects/td3/lp_main.py",
        env={"TMPDIR": str(temp)},
    )
    made: set[str] = set()  # the nodes' private folders, seen there while the job runs
    wait_for_end(
        cluster,
        job_id,
        240,
        while_running=lambda: made.update(
            p.name for p in temp.glob(f"{run_folders.RUN_TMP_PREFIX}*")
        ),
    )
    assert len(made) >= 3, f"the nodes made their folders elsewhere than TMPDIR: {made}"
    _completed_at_its_limit(cluster, workdir, job_id)
    # The nodes' TensorFlow wrote its autograph files into each node's private temp folder,
    # which went with the node (os._exit skips TF's own removal; 12 were left before), and
    # so did the folders themselves: each node that left with os._exit took its own (5 were
    # left, one per node that leaves from inside its run).
    left = sorted(p.relative_to(temp) for p in temp.rglob("*"))
    assert not left, f"the job left in its temp dir: {left}"
    # Within what the 2 actors take between two reports to the counter.
    assert 500 <= checkpoint_counts(workdir)["actor_steps"] < 500 + 2 * DISTRIBUTED_COUNT_EVERY
    assert read_csv(workdir / "logs/learner/logs.csv"), "the learner logged no update"
    assert _checkpoints(workdir), "no learner checkpoint"
    _assert_nothing_left(cluster)
