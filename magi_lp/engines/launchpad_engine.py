"""`--launcher local`: the program graph as a Launchpad program, launched on this machine.

Each node becomes an `lp.CourierNode` (the replay an `lp.ReverbNode`, `ReplayNode` below) in
its plan's launch group, so Launchpad's `PythonProcess(env=)` gives it its group's env; a
`Ref` becomes the node's Courier handle (a Reverb client for the replay). The launch itself
(processes, stop in stages, nothing left behind) is `magi_lp.launch.launcher`. The several
hosts path (`magi_lp.cluster`) turns the graph into a program with `to_program` too.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import launchpad as lp
import reverb

from magi_lp.console import say
from magi_lp.engines.base import Launch, saves_at_stop, stop_tier
from magi_lp.engines.launchpad_lifetime import LaunchpadLifetime, leave_node_process
from magi_lp.launch.node_lifetime import hold_exit
from magi_lp.runtime.graph import NodeSpec, ProgramGraph, ReplaySpec
from magi_lp.runtime.node_devices import prepare_node_process
from magi_lp.runtime.program import replay_checkpointer
from magi_lp.runtime.workdir import Workdir

# Nodes give up on a learner or counter that does not answer within this time instead of
# hanging forever (Courier clients have no deadline by default); the launcher notices a dead
# node and stops the program long before.
_RPC_TIMEOUT_S = 120.0


def _replay_tables(replay: ReplaySpec) -> list:
    prepare_node_process()
    # The frame replay, the device store's step queue, or the builder's own tables.
    return replay.store.make_tables(replay.environment_spec)


class ReplayNode(lp.ReverbNode):
    """Launchpad's Reverb node, checkpointing at the stop and ending its own process.

    `lp.ReverbNode.run` returns at the stop, and then its process waits on Reverb's and
    TensorFlow's threads until the launcher's SIGKILL (10 s; on a busy machine a SIGTERM'd
    replay was killed so in the test suite). The stop order puts the replay last, after the
    actors and the learner's final save, so what it holds then is final: with
    `checkpoint_at_stop` (`checkpoint.reverb`) it writes its checkpoint (every kind of stop:
    Ctrl-C, SIGTERM, `max_actor_steps`, a node's death), which the next launch's server loads,
    then stops its server and leaves at once. A replay colocated with the learner shares the
    learner's process, which leaves right after its final save: the learner checkpoints it
    then (`LearnerNode`), and the coordinator before the stop at the limit.
    """

    def __init__(
        self, *args: Any, own_process: bool = True, checkpoint_at_stop: bool = False, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self._own_process = own_process
        self._checkpoint_at_stop = checkpoint_at_stop

    def run(self) -> None:
        """`lp.ReverbNode.run`, saying what a checkpoint restored, then the stop."""
        from launchpad import address as lp_address

        checkpointer = None if self._checkpoint_ctor is None else self._checkpoint_ctor()
        server = reverb.Server(
            tables=self._priority_tables_fn(),
            port=lp_address.get_port_from_address(self._address.resolve()),
            checkpointer=checkpointer,
        )
        self._server = server
        restored = _table_sizes(server)
        if sum(restored.values()):
            say(f"replay restored: {_describe_sizes(restored)}", source="replay")
        lp.wait_for_stop()
        if self._checkpoint_at_stop:
            with hold_exit("the replay checkpoint"):
                start = time.monotonic()
                try:
                    path = server.localhost_client().checkpoint()
                    say(
                        f"replay checkpoint written to {path} in "
                        f"{time.monotonic() - start:.1f} s: "
                        f"{_describe_sizes(_table_sizes(server))}",
                        source="replay",
                    )
                except Exception as error:  # the run is over; say so and leave
                    say(f"replay checkpoint failed: {error}", source="replay")
        if not self._own_process:
            return
        # Clients of a stopped server get CANCELLED at once instead of a reset later.
        stopper = threading.Thread(target=server.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=1.0)
        leave_node_process()


def _table_sizes(server: reverb.Server) -> dict[str, int]:
    try:
        info = server.localhost_client().server_info(timeout=5)
    except Exception:  # only for the log
        return {}
    return {name: int(table.current_size) for name, table in info.items()}


def _describe_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{size} items in table {name!r}" for name, size in sorted(sizes.items()))


def _replay_node(node: NodeSpec) -> ReplayNode:
    replay = node.replay
    assert replay is not None
    return ReplayNode(
        functools.partial(_replay_tables, replay),
        checkpoint_ctor=functools.partial(replay_checkpointer, replay.workdir),
        own_process=node.colocate_with is None,
        checkpoint_at_stop=replay.checkpoint_at_stop,
    )


def to_program(graph: ProgramGraph) -> lp.Program:
    """The Launchpad program of `graph`: a node per `NodeSpec` in its launch group."""
    return _program_and_handles(graph)[0]


def _program_and_handles(graph: ProgramGraph) -> tuple[lp.Program, dict[str, Any]]:
    program = lp.Program(graph.name)
    lifetime = LaunchpadLifetime()
    handles: dict[str, Any] = {}
    # Nodes that share another's process (a replay beside the learner), by that node's name:
    # they come first in the graph (their handles are taken), and go in with their host.
    guests: dict[str, list[Any]] = {}
    for node in graph.nodes:
        if node.role == "replay":
            made = _replay_node(node)
        else:
            args, kwargs = node.resolved(handles.__getitem__)
            made = lp.CourierNode(node.make, *args, lifetime=lifetime, **kwargs)
        handle = made.create_handle()
        if isinstance(made, lp.CourierNode):
            handle.set_client_kwargs(call_timeout=_RPC_TIMEOUT_S)
        handles[node.name] = handle
        if node.colocate_with is not None:
            guests.setdefault(node.colocate_with, []).append(made)
            continue
        _add(program, node.group, made, guests.pop(node.name, []))
    if guests:
        raise ValueError(f"nodes colocated with nodes the graph lacks: {sorted(guests)}")
    return program, handles


def _add(program: lp.Program, group: str, node: Any, guests: list[Any] | None) -> None:
    with program.group(group):
        if guests:
            program.add_node(lp.MultiThreadingColocation([node, *guests]))
        else:
            program.add_node(node)


def _courier_client(handle: Any) -> Any:
    import courier

    from magi_lp.runtime.probe import CALL_TIMEOUT_S

    return courier.Client(handle._address.resolve(), call_timeout=CALL_TIMEOUT_S)


def run(launch: Launch) -> int:
    """Launches the graph as local processes and supervises it until it ends."""
    from magi_lp.launch.launcher import launch as launch_program
    from magi_lp.runtime.probe import ProgramProbe, make_status_monitor

    graph = launch.graph
    program, handles = _program_and_handles(graph)
    own = [node for node in graph.nodes if node.colocate_with is None]
    tiers = sorted({stop_tier(node.role) for node in own})
    # Tier 0 is implied: a launch group named in no stage stops first.
    stages = [{n.group for n in own if stop_tier(n.role) == tier} for tier in tiers if tier]
    replay = graph.node("replay_0")
    served_apart = replay.colocate_with is None
    probe = ProgramProbe(
        functools.partial(_courier_client, handles["counter_0"]),
        handles["replay_0"].dereference if served_apart else None,
        launch.workdir,
        functools.partial(_courier_client, handles["learner_0"]) if served_apart else None,
    )
    return launch_program(
        program,
        launch.plan.envs(),
        log_dir=Workdir(launch.workdir).nodes,
        termination_notice_secs=launch.termination_notice_secs,
        # The order of every program (magi_lp.runtime.config.STOP_TIERS says why).
        stop_stages=stages,
        saves_at_stop={n.group for n in own if saves_at_stop(n.role)},
        status=make_status_monitor(
            probe, launch.plan, launch.experiment, launch.workdir, plain_every_s=launch.status_every
        ),
    )
