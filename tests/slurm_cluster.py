"""The SLURM cluster the tests start: a session fixture over scripts/slurm_cluster.py.

`slurm_cluster` installs slurm-wlm and munge once where they are missing (root and apt-get;
one line says so), starts munged, slurmctld and three slurmd (n1-n3 at 10.254.0.1-3) in a
network namespace of their own with everything in a temp folder, waits until sinfo shows the
nodes idle, and at the end of the session cancels any job, stops every process it started
and every one left in the namespace (by PID), and removes the folder, whatever happened. Where
it cannot run (not root, no apt-get, no namespaces) the tests that use it skip with the reason
in one line.

Helpers meet the cluster as a user does: `submit` runs an entry point with `--launcher slurm`
(which calls sbatch), `wait_for_end` polls squeue, `job_state` reads `scontrol show job`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from scripts.slurm_cluster import SlurmCluster, Unavailable, ensure_installed

ROOT = Path(__file__).resolve().parents[1]


_SUBMITTED: list[tuple[SlurmCluster, str]] = []  # (cluster, job id) of this test's submits


@pytest.fixture(autouse=True)
def no_job_outlives_its_test() -> Iterator[None]:
    """Cancels, at a test's end, the jobs it submitted that still run: a test that failed
    after its submit (an assertion before its own scancel) left its job holding the
    cluster, and every later test of the session waited behind it and failed too (seen:
    one failed assertion, four more failures). Import it into a module that submits."""
    _SUBMITTED.clear()
    yield
    while _SUBMITTED:
        cluster, job_id = _SUBMITTED.pop()
        if cluster.run("squeue", "-h", "-j", job_id, check=False).strip():
            cluster.run("scancel", job_id, check=False)
            wait_for_end(cluster, job_id, 90)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running three-node SLURM cluster (see the module docstring)."""
    try:
        ensure_installed(say=lambda line: print(f"\nslurm fixture: {line}", file=sys.stderr))
        cluster = SlurmCluster.start()
    except Unavailable as error:
        pytest.skip(f"no SLURM cluster here: {error}")
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"SIGKILLed at the cluster's stop: {left}"


def submit(
    cluster: SlurmCluster,
    entry_point: str,
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,  # on top of this process's environment
    timeout: float = 180,
) -> tuple[subprocess.CompletedProcess, str]:
    """Runs `python <entry_point> --launcher=slurm <args>` in the cluster (it prepares the
    job and sbatches it); returns the result and the job id ("" if none was submitted)."""
    child_env = cluster.env({**os.environ, **(env or {})})
    child_env["PYTHONPATH"] = str(ROOT)
    child_env.setdefault("MUJOCO_GL", "egl")
    result = subprocess.run(
        cluster.command([sys.executable, str(ROOT / entry_point), "--launcher=slurm", *args]),
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    found = re.search(r"submitted batch job (\d+)", result.stderr)
    if found:
        _SUBMITTED.append((cluster, found.group(1)))
    return result, found.group(1) if found else ""


def job_state(cluster: SlurmCluster, job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) of the job ("COMPLETED", "0:0")."""
    info = cluster.job_info(job_id)
    return info.get("JobState", "?"), info.get("ExitCode", "?")


def wait_for_end(
    cluster: SlurmCluster,
    job_id: str,
    timeout: float,
    while_running: Callable[[], object] | None = None,
) -> float:
    """Waits until squeue no longer lists the job, calling `while_running` at each poll
    while it is listed (a test's look at what the job makes); returns when
    (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while cluster.run("squeue", "-h", "-j", job_id, check=False).strip():
        if while_running is not None:
            while_running()
        if time.monotonic() > deadline:
            cluster.run("scancel", job_id, check=False)
            pytest.fail(f"job {job_id} still running after {timeout:.0f} s; cancelled it")
        time.sleep(0.25)
    return time.monotonic()


def wait_until_nothing_left(cluster: SlurmCluster, timeout: float = 15) -> list[str]:
    """Waits until no process of a job is left in the cluster; returns those still there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = cluster.job_processes()
        if not left:
            return []
        time.sleep(0.2)
    return [_cmdline(pid) for pid in cluster.job_processes()]


def steps(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """Step name -> step id of a running job (`squeue -s`)."""
    out = cluster.run("squeue", "-h", "-s", "-o", "%i %j", check=False)
    found = {}
    het_ids = {job_id, *_het_components(cluster, job_id)}
    for line in out.splitlines():
        step_id, _, name = line.strip().partition(" ")
        if step_id.split(".")[0] in het_ids:
            found[name.strip()] = step_id
    return found


def _het_components(cluster: SlurmCluster, job_id: str) -> list[str]:
    out = cluster.run("scontrol", "-o", "show", "job", job_id, check=False)
    return re.findall(r"(?:^|\n)JobId=(\d+)", out)


def _cmdline(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:160]
    except OSError:
        return str(pid)


def actor_rows(workdir: Path) -> dict[str, list[dict[str, int]]]:
    """Each actor's logged episodes (`actor_steps` at the episode's end, `episode_length`)."""
    from tests.e2e_utils import read_csv

    rows = {}
    for label in ("actor_0", "actor_1"):
        path = workdir / "logs" / label / "logs.csv"
        rows[label] = [
            {key: int(float(row[key])) for key in ("actor_steps", "episode_length")}
            for row in (read_csv(path) if path.is_file() else [])
        ]
    return rows


def assert_resumed_to_the_limit(
    workdir: Path, rows_before: dict[str, int], count_before: int, limit: int
) -> None:
    """A resumed run's new episodes counted on from `count_before` (from zero, the first
    would count from 0), repeated no step, and the run stopped at `limit` (within what the 2
    actors take between two reports to the counter)."""
    from magi_lp.runtime.nodes import DISTRIBUTED_COUNT_EVERY
    from tests.e2e_utils import checkpoint_counts

    new_rows = [
        row
        for label, rows in actor_rows(workdir).items()
        for row in rows[rows_before.get(label, 0) :]
    ]
    assert new_rows, "the resumed run logged no episode"
    assert min(r["actor_steps"] - r["episode_length"] for r in new_rows) >= count_before
    assert limit <= checkpoint_counts(workdir)["actor_steps"] < limit + 2 * DISTRIBUTED_COUNT_EVERY
