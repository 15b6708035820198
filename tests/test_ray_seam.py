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
