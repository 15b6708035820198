"""The learner and the acting loops every runner builds from the experiment.

`make_learner_runner` and `make_acting_loop` build a learner and an actor (or evaluator)
the same way in both runners: the single-process runner (`magi_lp.runtime.single_process`)
calls them directly, and the node classes (`magi_lp.runtime.nodes`) call them inside their
own process. `resume_point` says where a relaunch resumes, for seeding. No engine is named
here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from magi_lp.acme_api import counting, specs
from magi_lp.agent import contract
from magi_lp.agent.actor import BatchedActor, GenericActor
from magi_lp.agent.builder import POLICY_VARIABLES
from magi_lp.agent.device_check import DeviceCheck
from magi_lp.agent.learner import JaxLearner
from magi_lp.agent.variable_client import VariableClient
from magi_lp.console import say
from magi_lp.replay.store import LearnerReplay, ReplayStore
from magi_lp.runtime import seeding
from magi_lp.runtime.acting_loop import ActingLoop
from magi_lp.runtime.checkpoint_metadata import run_identity, saved_metadata
from magi_lp.runtime.checkpointing import Checkpointer
from magi_lp.runtime.control_nodes import counter_parent
from magi_lp.runtime.experiment import Experiment
from magi_lp.runtime.learner_runner import LEARNER_STEPS, LearnerRunner, ReplayCheckpoint
from magi_lp.runtime.workdir import Workdir

StopFn = Callable[[], bool]


def resume_point(experiment: Experiment, workdir: str) -> int:
    """Where a launch of `workdir` resumes, for seeding (`magi_lp.runtime.seeding`): the actor
    steps saved with its newest learner checkpoint; 0 for a new run or one that saves no
    checkpoints. Each node reads it from the workdir when it is built (before the learner
    restores), so all of a launch's nodes agree, and a resubmitted job reads it anew."""
    if not experiment.config.checkpoint.enabled:
        return 0
    counts = saved_metadata(Workdir(workdir).learner_checkpoints).get("counts", {})
    return max(0, int(counts.get("actor_steps", 0)))


def make_learner_runner(
    experiment: Experiment,
    environment_spec: specs.EnvironmentSpec,
    replay: LearnerReplay,
    counter: Any,
    workdir: str,
    logger_factory: Callable[..., Any],
) -> LearnerRunner:
    """The agent's learner, restored from the workdir's latest checkpoint if there is one.

    `replay` is the learner's side of the replay (`ReplayStore.make_learner_replay`).
    `counter` is the program's counter (a Courier handle, or the in-process counter): the
    learner counts under the prefix "learner", and checkpoints save and restore its counts.
    With `checkpoint.replay` a device store is saved beside each learner checkpoint and
    restored with it.
    """
    config = experiment.config
    builder = experiment.builder
    logger = logger_factory("learner", steps_key=LEARNER_STEPS)
    parent = counter_parent(counter)  # its counts and the restored ones, numbered as one
    learner = builder.make_learner(
        random_key=seeding.node_key(config.seed, "learner"),
        networks=experiment.network_factory(environment_spec),
        dataset=replay.iterator,
        environment_spec=environment_spec,
        logger=logger,
        counter=counting.Counter(parent, prefix="learner", time_delta=0.0),
    )
    contract.check_learner(builder, learner)
    if config.debug.check_devices and isinstance(learner, JaxLearner):
        learner.check_devices("learner")
    enabled = config.checkpoint.enabled
    folders = Workdir(workdir)
    checkpointer = Checkpointer(folders.learner_checkpoints) if enabled else None
    replay_checkpoint = None
    if enabled and config.checkpoint.get("replay", False) and replay.saves:
        replay_checkpoint = ReplayCheckpoint(
            Checkpointer(folders.replay_store_checkpoints, max_to_keep=1),
            replay.save,
            replay.restore,
            replay.holding_writes,
            replay.take_the_rest,
            restore_target=getattr(replay, "restore_target", None),
        )
    return LearnerRunner(
        learner,
        checkpointer,
        checkpoint_minutes=config.checkpoint.every_minutes,
        get_counts=counter.get_counts,
        restore_counts=lambda counts: parent.increment(**counts),
        closeables=[logger, replay],
        replay=replay_checkpoint,
        identity=run_identity(config),
    )


def make_acting_loop(
    experiment: Experiment,
    environment_spec: specs.EnvironmentSpec,
    index: int,
    store: ReplayStore | None,
    replay: Any,
    variable_source: Any,
    counter: Any,
    logger_factory: Callable[..., Any],
    *,
    evaluation: bool = False,
    observers: Sequence[Any] = (),
    should_stop: StopFn = lambda: False,
    count_every: int = 1,
    counts_follow_sends: Callable[[Mapping[str, Any]], bool] | None = None,
    resumed_at: int = 0,
    actors: int = 1,
) -> ActingLoop:
    """Actor (or evaluator) `index`: its seeded environment(s), policy, adder(s) and loop.

    The actor pulls `POLICY_VARIABLES` from `variable_source` every
    `config.variable_update_period` environment steps without blocking. With
    `config.envs_per_actor` = k > 1 an actor steps k environments (each its own seed, actor
    state and adder) and chooses their actions in one call (a `BatchedActor`).
    Evaluators step one environment, write nothing to replay, make the experiment's
    evaluation observers, and count as "evaluator". With `config.debug.check_devices` every
    policy call checks its arrays' devices. `should_stop` lets the adders give up a write
    the replay holds back once the program stops (`spec.WriteAbandonedError`).
    `store` makes the adders (None for an evaluator); `replay` is what they write to: the
    Reverb client, or in one process the store's `LearnerReplay`.
    `count_every`, `counts_follow_sends`: when the loop counts (`ActingLoop`).
    `resumed_at`: the run's `resume_point`; the environments and the policy's key are seeded
    from it too, so a resumed run does not replay the first launch's episodes and noise, and
    an actor's state goes on from its share of those steps (`ActorCore.resume`: `resumed_at`
    over the run's `actors` and their k environments each, as they step alike), so a step
    schedule (TD3's random first steps) is not started again.
    """
    config = experiment.config
    role = "evaluator" if evaluation else "actor"
    k = 1 if evaluation else int(config.envs_per_actor)
    environments = [
        experiment.environment_factory(
            seeding.node_seed(config.seed, role, index, j, resumed_at), evaluation
        )
        for j in range(k)
    ]
    # One actor's adders together: a store may send their k environments' steps in one call.
    adders = (
        [None]
        if evaluation
        else store.make_adders(
            environment_spec, replay, range(index * k, index * k + k), should_stop
        )
    )
    actor = _make_actor(
        experiment,
        environment_spec,
        index,
        variable_source,
        adders,
        evaluation=evaluation,
        resumed_at=resumed_at,
        actors=actors,
    )
    counter = counting.Counter(counter_parent(counter), prefix=role, time_delta=0.0)
    # An evaluator's rows are its evaluations (one per episode): `logging.time_delta` never
    # drops one, or an evaluation point would average fewer episodes, or vanish.
    logger = logger_factory(
        role, steps_key=f"{role}_steps", instance=index, time_delta=0.0 if evaluation else None
    )
    if evaluation:
        observers = [*observers, *(make() for make in experiment.evaluation_observers)]
    return ActingLoop(
        environments,
        actor,
        counter,
        logger,
        should_update=not evaluation,
        frames_per_step=experiment.frames_per_step,
        observers=observers,
        count_every=count_every,
        counts_follow_sends=counts_follow_sends,
    )


def _make_actor(
    experiment: Experiment,
    environment_spec: specs.EnvironmentSpec,
    index: int,
    variable_source: Any,
    adders: list[Any],
    *,
    evaluation: bool,
    resumed_at: int,
    actors: int,
) -> GenericActor | BatchedActor:
    """The policy of actor (or evaluator) `index` and its variable client, writing through
    `adders` (one per environment; [None] for an evaluator): a `BatchedActor` over k > 1
    environments, else a `GenericActor`."""
    config = experiment.config
    builder = experiment.builder
    role = "evaluator" if evaluation else "actor"
    k = len(adders)
    networks = experiment.network_factory(environment_spec)
    policy = builder.make_policy(networks, environment_spec, evaluation)
    contract.check_policy(builder, policy)
    key = seeding.node_key(config.seed, role, index, resumed_at)
    # The pull period counts environment steps; a batched actor steps k per call.
    variables = VariableClient(
        variable_source,
        POLICY_VARIABLES,
        update_period=max(1, round(config.variable_update_period / k)),
    )
    check = (
        DeviceCheck.for_node(f"{role} {index}", all_devices=False)
        if config.debug.check_devices
        else None
    )
    steps_before = 0 if evaluation else resumed_at // (max(1, actors) * k)
    if k > 1:
        return BatchedActor(
            policy,
            list(jax.random.split(key, k)),
            variables,
            adders,
            device_check=check,
            steps_before=steps_before,
        )
    return GenericActor(
        policy,
        key,
        variables,
        adders[0],
        device_check=check,
        steps_before=steps_before,
    )


def warm_up(loop: ActingLoop, environment_spec: specs.EnvironmentSpec, source: str) -> None:
    """Compiles the actor's policy while its first parameters are fetched (in the background).

    An actor can act only once the learner serves parameters; compiling meanwhile takes the
    compile off the path to the first replay item. Policies whose core gives no
    `params_shape` compile on their first step, as before.
    """
    start = time.monotonic()
    if loop.actor.warm_up(environment_spec.observations.generate_value()):
        say(
            f"policy compiled in {time.monotonic() - start:.1f} s, before its first parameters",
            source=source,
        )
