"""The distributed program: a Launchpad graph that reads as the list of its nodes.

`build_program` follows Acme's `make_distributed_experiment`, adding the counter, the replay,
the learner (the replay inside the learner's process when `colocate_learner_and_replay`), the
actors, the evaluators and the coordinator, in that order: the counter first, because
`add_node` returns the handle the learner and every later node are built with (the replay's
handle comes from its node before it is added). Each goes to the launch group the placement
plan assigns, so every node runs with its own resource spec's environment.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import launchpad as lp
import reverb

from magi_lp.acme_api import specs
from magi_lp.console import say
from magi_lp.placement.plan import PlacementPlan
from magi_lp.replay.store import ReplayStore
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.node_devices import prepare_node_process
from magi_lp.runtime.nodes import (
    ActorNode,
    CoordinatorNode,
    EvaluatorNode,
    LearnerNode,
    new_counter,
)

# Nodes give up on a learner or counter that does not answer within this time instead of
# hanging forever (Courier clients have no deadline by default); the launcher notices a dead
# node and stops the program long before.
_RPC_TIMEOUT_S = 120.0


def _replay_tables(store: ReplayStore, environment_spec: specs.EnvironmentSpec) -> list:
    prepare_node_process()
    # The frame replay, the device store's step queue, or the builder's own tables.
    return store.make_tables(environment_spec)


class ReplayNode(lp.ReverbNode):
    """Launchpad's Reverb node, checkpointing at the stop and ending its own process.

    `lp.ReverbNode.run` returns at the stop, and then its process waits on Reverb's and
    TensorFlow's threads until the launcher's SIGKILL (10 s; on a busy machine a SIGTERM'd
    replay was killed so in the test suite). The stop order puts the replay last, after the
    actors and the learner's final save, so what it holds then is final: with
    `checkpoint_at_stop` (`checkpoint.reverb`) it writes its checkpoint (every kind of stop:
    Ctrl-C, SIGTERM, `max_actor_steps`, a node's death), which the next launch's server loads,
    then stops its server and leaves at once. A replay colocated with the learner shares the
    learner's process and leaves it to the learner (the coordinator checkpoints it then).
    """

    def __init__(
        self, *args: Any, own_process: bool = True, checkpoint_at_stop: bool = False, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self._own_process = own_process
        self._checkpoint_at_stop = checkpoint_at_stop

    def run(self) -> None:
        """`lp.ReverbNode.run`, saying what a checkpoint restored, then the stop."""
        import launchpad as lp
        from launchpad import address as lp_address

        from magi_lp.launch.node_lifetime import hold_exit
        from magi_lp.runtime.nodes import leave_node_process

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


def replay_checkpointer(workdir: str) -> reverb.checkpointers.DefaultCheckpointer:
    """Reverb's checkpointer for the replay, in `<workdir>/checkpoints/replay`."""
    return reverb.checkpointers.DefaultCheckpointer(path=str(Path(workdir) / "checkpoints/replay"))


def build_program(
    experiment: Experiment,
    plan: PlacementPlan,
    *,
    workdir: str,
    logger_factory: Any,
    name: str = "magi_lp",
) -> lp.Program:
    """Assembles the Launchpad program for `experiment` under `plan`.

    Args:
      experiment: builder, factories and config.
      plan: the validated placement plan; decides each node's launch group (and so its env).
      workdir: where checkpoints and logs go.
      logger_factory: picklable `(label, steps_key=None) -> Logger`, called inside nodes.
      name: the program's name.
    """
    config = experiment.config
    environment_spec = experiment.get_environment_spec()
    store = resolve_store(experiment.builder, config)  # every node uses this one
    program = lp.Program(name)

    # Always give Reverb a checkpoint folder in the workdir: without one it makes a temp
    # folder of its own that outlives the run. It is written only when `checkpoint.reverb`
    # is on (by the replay itself at its stop, or, sharing the learner's process, at the
    # coordinator's request), and read back on relaunch.
    colocated = bool(config.colocate_learner_and_replay)
    replay_node = ReplayNode(
        functools.partial(_replay_tables, store, environment_spec),
        checkpoint_ctor=functools.partial(replay_checkpointer, workdir),
        own_process=not colocated,
        checkpoint_at_stop=bool(config.checkpoint.reverb) and not colocated,
    )

    with program.group(plan.launch_group("counter", 0)):
        counter = program.add_node(lp.CourierNode(new_counter))
    counter.set_client_kwargs(call_timeout=_RPC_TIMEOUT_S)

    learner_node = lp.CourierNode(
        LearnerNode,
        experiment,
        store,
        environment_spec,
        replay_node.create_handle(),
        counter,
        workdir,
        logger_factory,
    )
    learner = learner_node.create_handle()
    if config.colocate_learner_and_replay:
        # One process, one env: the learner group's spec applies to both.
        with program.group(plan.launch_group("learner", 0)):
            program.add_node(lp.MultiThreadingColocation([learner_node, replay_node]))
        replay = replay_node.create_handle()
    else:
        with program.group(plan.launch_group("replay", 0)):
            replay = program.add_node(replay_node)
        with program.group(plan.launch_group("learner", 0)):
            program.add_node(learner_node)
    learner.set_client_kwargs(call_timeout=_RPC_TIMEOUT_S)

    for index in range(config.num_actors):
        with program.group(plan.launch_group("actor", index)):
            program.add_node(
                lp.CourierNode(
                    ActorNode,
                    experiment,
                    store,
                    environment_spec,
                    index,
                    replay,
                    learner,
                    counter,
                    logger_factory,
                )
            )

    for index in range(config.num_evaluators):
        with program.group(plan.launch_group("evaluator", index)):
            program.add_node(
                lp.CourierNode(
                    EvaluatorNode,
                    experiment,
                    environment_spec,
                    index,
                    learner,
                    counter,
                    logger_factory,
                )
            )

    with program.group(plan.launch_group("coordinator", 0)):
        program.add_node(
            lp.CourierNode(
                CoordinatorNode,
                counter,
                replay,
                config.max_actor_steps,
                checkpoint_replay=bool(config.checkpoint.reverb) and colocated,
            )
        )
    return program
