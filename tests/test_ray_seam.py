"""What the Ray engine reads from Ray's words (magi_lp/engines/ray_seam.py), on Ray 2.60's text."""

from __future__ import annotations

from pathlib import Path

from magi_lp.engines import ray_seam
from magi_lp.launch.exit_report import NodeExit, format_exit_report

# ray.exceptions.ActorDiedError's text when the GCS marked the actor's node dead (Ray 2.60:
# BASE_ERROR_MSG, the context lines, then gcs_actor_manager's message).
NODE_DIED = (
    "The actor experienced an error before finishing this task.\n"
    "\tclass_name: _NodeActor\n\tactor_id: 3f2a\n\tpid: 4242\n\tname: actor_0\n"
    "\tnamespace: magi_lp_ab12\n\tip: 10.254.0.2\n"
    "The actor died because its node has died. Node Id: 9c1e\n"
    "\tthe actor's node was terminated unexpectedly: health check failed"
)
UNAVAILABLE = (
    "The actor ff8a71c22686067cc7a51d3301000000 is unavailable: The actor is temporarily "
    "unavailable: RpcError: RPC error: Socket closed rpc_code: 14. The task may or may not "
    "have been executed on the actor."
)  # seen by the driver when the raylet of the actor's machine was SIGKILLed (SLURM test)
WORKER_DIED = (
    "The actor experienced an error before finishing this task.\n"
    "\tclass_name: _NodeActor\n\tactor_id: 3f2a\n\tpid: 4242\n\tip: 127.0.0.1\n"
    "The actor is dead because its worker process has died. Worker exit type: "
    "UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a connection "
    "error code 2. End of file."
)


def test_a_dead_machine_is_named_and_a_dead_process_is_not_blamed_on_it(tmp_path: Path):
    cause = ray_seam.lost_machine(RuntimeError(NODE_DIED), "10.254.0.2")
    assert cause is not None and "the machine it ran on (10.254.0.2) died" in cause
    lost = ray_seam.lost_machine(RuntimeError(UNAVAILABLE), "10.254.0.2")
    assert lost is not None and "(10.254.0.2)" in lost and "gone" in lost
    assert ray_seam.lost_machine(RuntimeError(WORKER_DIED), "127.0.0.1") is None

    log = tmp_path / "log"
    log.write_text("training\n")
    report = format_exit_report(NodeExit("actor", 0, 4242, -9, log, cause))
    assert f"cause: {cause}" in report and "another process killed it" not in report


# The texts Ray 2.60 gave here (tests/test_ray_faults.py's toys, and a Ray whose memory
# monitor's threshold was set to 1% of the machine): a worker SIGKILLed or SIGSEGVed, and one
# Ray's memory monitor killed (`ray.exceptions.OutOfMemoryError`, not a RayActorError).
WORKER_KILLED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: A\n"
    "\tactor_id: 8441df4de4d78fe7fe9afc8d01000000\n\tpid: 9603\n"
    "\tnamespace: 620937d6-a8c1-44ca-b4c0-1f203960b7d6\n\tip: 127.0.0.1\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
    "Some common causes include: (1) the process was killed by the OOM killer due to high "
    "memory usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly due "
    "to SIGSEGV or another unexpected error. If the process was killed by the kernel OOM killer "
    "(verifiable by checking for OOM in dmesg of the OOMing node), consider enabling resource "
    "isolation via --enable-resource-isolation to prevent node deaths by resource contention "
    "and significant loss of progress by uninformed kernel OOM killing."
)
MEMORY_MONITOR = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
    "127.0.0.1, ID: 59743aa462d8eadd8dadc12f3f8da41474b2f93b83bd18c74f97b6f0) was 1.55GB used "
    "/ 23.54GB limit (0.065844)\nOOM kill reason: Memory usage 1658130432B exceeded threshold "
    "of 252761936B (1.0% of 25276194816B limit)\nObject store memory usage: [- objects "
    "spillable: 0\n]\nRay killed 1 worker(s) based on the killing policy\nConsidered workers: "
    "[\nSelected to kill: (Actor(d0770a444ce08f3ad2495c2901000000): job ID=01000000, task "
    "name=A.__init__, required resources={}, pid=9992, actual memory used=0.04GB)\n]\n"
    "Refer to the documentation on how to address the out of memory issue: "
    "https://docs.ray.io/en/latest/ray-observability/user-guides/debug-apps/debug-memory.html."
)


class OutOfMemoryError(Exception):
    """Ray's ray.exceptions.OutOfMemoryError, by name (this module imports no Ray)."""


def test_rays_memory_monitor_is_named_with_its_numbers():
    import signal

    code, cause = ray_seam.death_of(OutOfMemoryError(MEMORY_MONITOR), "127.0.0.1")
    assert code == -signal.SIGKILL
    assert cause == (
        "killed by Ray's memory monitor: the machine ran low on memory (its machine "
        "(127.0.0.1) had 1.55GB used / 23.54GB limit; Memory usage 1658130432B exceeded "
        "threshold of 252761936B (1.0% of 25276194816B limit)); give the run more memory, or "
        "raise RAY_memory_usage_threshold (0.95 of the machine's memory by default)"
    )


def test_a_workers_death_names_no_cause_but_its_logs_fatal_signal():
    """Ray's text lists the OOM killer, `ray stop --force` and SIGSEGV as possible causes of
    any worker's death: none is named from it (the kernel's log, or the node's own, says)."""
    import signal

    assert ray_seam.death_of(RuntimeError(WORKER_KILLED), "127.0.0.1") == (-signal.SIGKILL, None)
    segfault = ["Fatal Python error: Segmentation fault", "", "Current thread 0x7f (most recent)"]
    assert ray_seam.death_of(RuntimeError(WORKER_KILLED), "127.0.0.1", segfault) == (
        -signal.SIGSEGV,
        None,
    )
    aborted = ["Fatal Python error: Aborted"]
    assert ray_seam.death_of(RuntimeError(WORKER_KILLED), "", aborted)[0] == -signal.SIGABRT
    machine = ray_seam.death_of(RuntimeError(NODE_DIED), "10.254.0.2", segfault)
    assert machine[0] == -signal.SIGKILL and "(10.254.0.2) died" in machine[1]
