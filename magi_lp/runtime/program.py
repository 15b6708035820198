"""The distributed program graph: the list of its nodes, naming no engine.

`build_program` follows Acme's `make_distributed_experiment`: counter, replay, learner,
actors, evaluators, coordinator (the counter first: every other node takes its handle), each
in the launch group the placement plan assigns, so every node runs with its own resource
spec's environment. It returns a `magi_lp.runtime.graph.ProgramGraph`; an engine
(`magi_lp.engines`) launches it.
"""

from __future__ import annotations

from typing import Any

from magi_lp.placement.plan import PlacementPlan
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.control_nodes import CoordinatorNode, CounterNode
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.graph import NodeSpec, ProgramGraph, Ref, ReplaySpec
from magi_lp.runtime.nodes import ActorNode, EvaluatorNode, LearnerNode
from magi_lp.runtime.workdir import Workdir


def replay_checkpointer(workdir: str) -> Any:
    """Reverb's checkpointer for the replay, in `<workdir>/checkpoints/replay`."""
    import reverb

    return reverb.checkpointers.DefaultCheckpointer(path=str(Workdir(workdir).replay_checkpoints))


def build_program(
    experiment: Experiment,
    plan: PlacementPlan,
    *,
    workdir: str,
    logger_factory: Any,
    name: str = "magi_lp",
    transport: str = "reverb",
) -> ProgramGraph:
    """Describes the distributed program for `experiment` under `plan`.

    Args:
      experiment: builder, factories and config.
      plan: the validated placement plan; decides each node's launch group (and so its env).
      workdir: where checkpoints and logs go.
      logger_factory: picklable `(label, steps_key=None, instance=None, *, time_delta=None)
        -> Logger` (`LoggerFactory`), called inside nodes.
      name: the program's name.
      transport: how the engine carries replay ('reverb': a Reverb server in the replay node;
        'served': the store's own server, `ReplayStore.make_server`).
    """
    config = experiment.config
    environment_spec = experiment.get_environment_spec()
    # Every node uses this one store.
    store = resolve_store(experiment.builder, config, transport=transport)
    colocated = bool(config.colocate_learner_and_replay)
    # A replay beside the learner is checkpointed by the coordinator before the stop (a
    # replay node of its own checkpoints itself at its stop).
    checkpoint_replay = bool(config.checkpoint.reverb) and colocated
    counter, replay, learner = Ref("counter_0"), Ref("replay_0"), Ref("learner_0")
    nodes = [NodeSpec("counter", 0, plan.launch_group("counter", 0), CounterNode)]
    # Reverb always gets a checkpoint folder in the workdir (without one it makes a temp
    # folder of its own that outlives the run); it is written only with `checkpoint.reverb`
    # (by the replay at its stop, or, sharing the learner's process, at the coordinator's
    # request) and read back on relaunch.
    replay_spec = ReplaySpec(
        store,
        environment_spec,
        workdir,
        checkpoint_at_stop=bool(config.checkpoint.reverb) and not colocated,
    )
    learner_group = plan.launch_group("learner", 0)
    replay_group = learner_group if colocated else plan.launch_group("replay", 0)
    nodes.append(
        NodeSpec(
            "replay",
            0,
            replay_group,
            replay=replay_spec,
            colocate_with="learner_0" if colocated else None,
        )
    )
    learner_args = (experiment, store, environment_spec, replay, counter, workdir)
    nodes.append(
        NodeSpec("learner", 0, learner_group, LearnerNode, (*learner_args, logger_factory))
    )
    for index in range(config.num_actors):
        args = (experiment, store, environment_spec, index, replay, learner, counter)
        nodes.append(
            NodeSpec(
                "actor",
                index,
                plan.launch_group("actor", index),
                ActorNode,
                (*args, logger_factory),
                {"workdir": workdir},
            )
        )
    for index in range(config.num_evaluators):
        args = (experiment, environment_spec, index, learner, counter, logger_factory)
        group = plan.launch_group("evaluator", index)
        kwargs = {"workdir": workdir, "max_actor_steps": int(config.max_actor_steps)}
        nodes.append(NodeSpec("evaluator", index, group, EvaluatorNode, args, kwargs))
    evaluators = tuple(Ref(f"evaluator_{i}") for i in range(config.num_evaluators))
    nodes.append(
        NodeSpec(
            "coordinator",
            0,
            plan.launch_group("coordinator", 0),
            CoordinatorNode,
            (
                counter,
                replay if checkpoint_replay else None,
                int(config.max_actor_steps),
                evaluators,
            ),
            {"checkpoint_replay": checkpoint_replay},
        )
    )
    return ProgramGraph(name, nodes, store)
