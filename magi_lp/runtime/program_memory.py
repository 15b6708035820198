"""What a node's compiled programs need, read from XLA: the short-lived process of the reckoning.

`python -m magi_lp.runtime.program_memory REQUEST RESULT` is started by
`magi_lp.runtime.memory_reckoning` before anything else starts. It unpickles the experiment
and what to compile, builds the pieces through the builder protocol (so any agent is
reckoned, not one: `make_learner` with an iterator that is never read, `make_policy`), compiles
without running:

- the learner's update (`JaxLearner.compiled_update`) for a batch of the agent's replay
  spec (`frame_replay` or `transition_replay`) at the batch each learner device gets;
- an actor's policy step: `select_action` vmapped over `envs_per_actor` environments, as
  `BatchedActor` calls it (or as is for one, as `GenericActor` does);

and writes XLA's memory analysis of each (`Compiled.memory_analysis()`: argument, output,
alias, temporary and generated-code bytes) with the bytes of the learner's state, a batch and
the policy's parameters, as JSON. Nothing runs on the device but the parameters' init.
"""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any


def _nbytes(tree: Any) -> int:
    import jax
    import numpy as np

    return int(
        sum(
            int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(tree)
        )
    )


def _shapes(tree: Any) -> Any:
    import jax

    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _analysis(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    if isinstance(stats, (list, tuple)):  # some jax versions: one per device
        stats = stats[0]
    names = ("argument", "output", "alias", "temp", "generated_code")
    return {name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0) for name in names}


def learner_batch_shape(builder: Any, environment_spec: Any, batch_size: int) -> Any:
    """One learner batch of `batch_size` as `jax.ShapeDtypeStruct`s, from the agent's replay
    spec: a `FrameTransition` for a pixel agent, an Acme `Transition` for a state agent.

    Raises:
      ValueError: the builder gives neither spec (its batches are its own Reverb dataset's).
    """
    import jax
    import numpy as np

    frame = builder.frame_replay(environment_spec)
    if frame is not None:
        from magi_lp.replay.frame_store import transition_shape

        return transition_shape(frame, batch_size)
    transition = builder.transition_replay(environment_spec)
    if transition is None:
        raise ValueError(
            f"{type(builder).__name__} gives neither frame_replay nor transition_replay, so "
            "its learner's batch is unknown before its Reverb dataset exists"
        )
    from magi_lp.acme_api import types

    def batched(spec: Any) -> Any:
        return jax.ShapeDtypeStruct((batch_size, *spec.shape), np.dtype(spec.dtype))

    scalar = jax.ShapeDtypeStruct((batch_size,), np.float32)
    observations = jax.tree_util.tree_map(batched, environment_spec.observations)
    return types.Transition(
        observation=observations,
        action=jax.tree_util.tree_map(batched, environment_spec.actions),
        reward=scalar,
        discount=scalar,
        next_observation=observations,
        extras=(),
    )


def make_quiet_learner(
    builder: Any, networks: Any, environment_spec: Any, dataset: Any = (), seed: int = 0
) -> Any:
    """The agent's learner over `dataset` (default: none, for a learner never stepped), with
    no logger and a counter of its own: what a measurement builds outside a program."""
    import jax

    from magi_lp.acme_api import counting, loggers

    return builder.make_learner(
        random_key=jax.random.PRNGKey(seed),
        networks=networks,
        dataset=iter(dataset),
        environment_spec=environment_spec,
        logger=loggers.NoOpLogger(),
        counter=counting.Counter(),
    )


def measure(experiment: Any, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Compiles each requested group's program; returns its memory analysis and sizes.

    Args:
      experiment: the run's `Experiment`.
      requests: group -> {"batch_size": int} for the learner (the batch one device gets),
        {"envs": int, "evaluation": bool} for an actor or evaluator.
    """
    import jax

    from magi_lp.agent.builder import POLICY_VARIABLES
    from magi_lp.agent.learner import MAX_UPDATES_IN_FLIGHT, JaxLearner

    builder = experiment.builder
    environment_spec = experiment.get_environment_spec()
    networks = experiment.network_factory(environment_spec)
    # Every program needs the learner: actors act with the parameters it serves.
    learner = make_quiet_learner(builder, networks, environment_spec)
    if not isinstance(learner, JaxLearner):
        raise ValueError(
            f"{type(builder).__name__}.make_learner gives a {type(learner).__name__}, not a "
            "magi_lp JaxLearner, so its update cannot be compiled apart"
        )
    backend = jax.default_backend()
    out: dict[str, Any] = {"backend": backend, "jax": jax.__version__, "groups": {}}
    for group, request in requests.items():
        if group == "learner":
            batch = learner_batch_shape(builder, environment_spec, int(request["batch_size"]))
            compiled = learner.compiled_update(batch)
            out["groups"][group] = {
                "analysis": _analysis(compiled),
                "state": _nbytes(learner.state),
                "batch": _nbytes(batch),
                "updates_in_flight": MAX_UPDATES_IN_FLIGHT,
                "prefetch": int(learner.prefetch_depth),
            }
        else:
            envs = int(request["envs"])
            policy = builder.make_policy(networks, environment_spec, bool(request["evaluation"]))
            params = _shapes(learner.get_variables([POLICY_VARIABLES])[0])
            keys = jax.ShapeDtypeStruct((envs, 2), jax.numpy.uint32)
            observation = _shapes(
                jax.tree_util.tree_map(
                    lambda spec: spec.generate_value(), environment_spec.observations
                )
            )
            if envs > 1:  # as BatchedActor calls it
                state = jax.eval_shape(jax.vmap(policy.init), keys)
                observation = jax.tree_util.tree_map(
                    lambda s, k=envs: jax.ShapeDtypeStruct((k, *s.shape), s.dtype), observation
                )
                step = jax.jit(jax.vmap(policy.select_action, in_axes=(None, 0, 0)))
            else:  # as GenericActor calls it
                state = jax.eval_shape(policy.init, jax.ShapeDtypeStruct((2,), jax.numpy.uint32))
                step = jax.jit(policy.select_action)
            compiled = step.lower(params, observation, state).compile()
            out["groups"][group] = {"analysis": _analysis(compiled), "params": _nbytes(params)}
    return out


def main(argv: list[str]) -> int:
    """REQUEST (a pickle of (experiment, requests)) -> RESULT (JSON of `measure`)."""
    from magi_lp.runtime.node_devices import prepare_node_process

    # As in a node: TensorFlow (imported with the project) kept off the GPU, CUDA checked.
    prepare_node_process()
    request_path, result_path = argv[1:3]
    with open(request_path, "rb") as f:
        experiment, requests = pickle.load(f)
    result = measure(experiment, requests)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
