"""A node's lifetime under Launchpad (`magi_lp.runtime.graph.NodeLifetime`): no Reverb here.

Every node's constructor gets the engine's lifetime object, so the node's process unpickles
its class: kept apart from `magi_lp.engines.launchpad_engine` (which imports Reverb, and
with it TensorFlow), it lets the nodes that never touch the replay start without either: the
counter, the evaluators, and the coordinator unless it checkpoints a replay in the learner's
process.
"""

from __future__ import annotations

import launchpad as lp

from magi_lp.launch import node_lifetime


class LaunchpadLifetime:
    """A node's lifetime under Launchpad: its stop event, `lp.stop()`, and its process."""

    def stopping(self) -> bool:
        return lp.wait_for_stop(0)

    def wait_for_stop(self, seconds: float) -> bool:
        return lp.wait_for_stop(seconds)

    def stop_program(self) -> None:
        node_lifetime.note_stop_request()  # the launcher says why, not "received SIGTERM"
        lp.stop()

    def leave(self, code: int = 0) -> None:
        leave_node_process(code)


def leave_node_process(code: int = 0) -> None:
    """Ends a node's process once its work is done and saved (multi-processing launches).

    A learner blocked in Reverb's sampler, or an adder flushing to a replay server that is
    already gone, keeps TensorFlow/Reverb threads alive that hold the process until
    Launchpad's 10 s kill; the checkpoint is written and logs are flushed per row, so there
    is nothing left to wait for. In a threaded launch (Launchpad's `test_mt`) the node is a
    thread of a shared process, which must live on.
    """
    from launchpad import context

    if context.get_context().launch_type is context.LaunchType.LOCAL_MULTI_PROCESSING:
        node_lifetime.leave_process(code)
    if code:
        raise SystemExit(code)
