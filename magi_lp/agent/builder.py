"""The builder protocol: the seam between the toolkit and an agent project.

An agent is a builder + networks + configs, in the spirit of Acme's `ActorLearnerBuilder`. The
runners (`magi_lp.runtime.program` for Launchpad, `magi_lp.runtime.single_process` for one
process) never know which agent they run: they call the methods below in the process where
each piece lives, and own everything that is the same for every agent (the actor around the
policy, parameter pulls, counting, checkpoints, the replay's blocking in one process). So a
builder holds plain configs and builds heavy objects lazily in these methods.

Acme 0.4.0's JAX builder cannot be imported with any installable jaxlib, so the protocol is
restated here with Acme's framework-neutral types.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import jax

from magi_lp import console
from magi_lp.acme_api import adders, counting, loggers, specs
from magi_lp.agent.actor_core import ActorCore
from magi_lp.agent.learner import Learner
from magi_lp.replay.schedule import ReplaySchedule
from magi_lp.replay.spec import FrameReplaySpec, TransitionReplaySpec

if TYPE_CHECKING:  # Reverb is not installed on the current stack (one process only)
    import reverb

Networks = TypeVar("Networks")
Sample = TypeVar("Sample")

POLICY_VARIABLES = "policy"
"""What actors pull from the learner: `learner.get_variables([POLICY_VARIABLES])[0]` is the
`params` argument of the agent's `ActorCore.select_action`."""


class VariableSource(Protocol):
    """Anything actors can pull parameters from: a learner, or a Courier handle to one."""

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """Returns the current values of the named variable collections."""


class AgentBuilder(abc.ABC, Generic[Networks, Sample]):
    """Builds the agent-specific pieces of one agent; implemented once per agent project.

    Each method is called in the process that will own the piece: replay tables in the
    replay node, the learner and its dataset in the learner node, policies and adders in
    actor nodes.

    A project's own config keys are checked by the entry point, not here: pass the check as
    `distributed_main(make_experiment, validate_config=...)` / `single_process_main(...)`
    (`magi_lp.cli`), which runs it before JAX is imported.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "validate_config" in vars(cls):
            # AgentBuilder.validate_config went (the entry point checks a project's keys
            # before the builder's module, which imports JAX, is loaded), so an override is
            # never called: say so once, where the class is defined.
            console.say(
                f"warning: {cls.__module__}.{cls.__qualname__}.validate_config is never "
                "called (AgentBuilder has no validate_config); pass it to the entry point "
                "instead: distributed_main(make_experiment, validate_config=...) or "
                "single_process_main(make_experiment, validate_config=...) (magi_lp.cli), "
                "which runs it before anything heavy is imported",
                source="builder",
            )

    @abc.abstractmethod
    def replay_schedule(self) -> ReplaySchedule:
        """When learning starts and how often the learner steps per actor step."""

    def frame_replay(
        self, environment_spec: specs.EnvironmentSpec | None
    ) -> FrameReplaySpec | None:
        """For a pixel agent: what it stores, so that the toolkit serves its replay.

        Return a `FrameReplaySpec` (frame shape, frame stack, n-step, discount, capacity,
        batch, action spec) and the toolkit makes the replay: the store `config.replay.store`
        chooses (the device frame store, or the Reverb frame replay), the actors' adders and
        the learner's iterator of `FrameTransition` batches; `make_replay_tables`,
        `make_adder` and `make_dataset_iterator` are then not called. The agent never knows
        which store serves it.

        `environment_spec` is None when the toolkit plans (before any environment exists):
        give what the config knows; the action shape may be left out then (its bytes are a
        rounding error next to the frames'). The default (None) means the agent makes its own
        Reverb tables with the three methods below.
        """
        del environment_spec
        return None

    def transition_replay(
        self, environment_spec: specs.EnvironmentSpec | None
    ) -> TransitionReplaySpec | None:
        """For a state-based agent that also runs where Reverb is not installed: what it
        stores (capacity, batch, n-step, discount).

        The toolkit then serves the agent from a host-memory replay of n-step
        `acme.types.Transition`s (`magi_lp.replay.transition_replay`), the batches Acme's
        `NStepTransitionAdder` and `make_reverb_dataset` give: where Reverb is missing (the
        current stack: Python 3.12, no Launchpad), in one process and in the Ray program's
        replay node; and in one process wherever `replay.store='device'`. Otherwise (a
        Launchpad program) it uses the agent's own tables (the three methods below).
        `environment_spec` is None when the toolkit plans, before any environment exists.
        The default (None): the agent needs Reverb.
        """
        del environment_spec
        return None

    def make_replay_tables(self, environment_spec: specs.EnvironmentSpec) -> list[reverb.Table]:
        """Creates the Reverb tables the adder writes to and the dataset reads from.

        Give each table `self.replay_schedule().rate_limiter()` (or another limiter that
        enforces the schedule between independent processes). The single-process runner
        rebuilds the tables without blocking, since it interleaves acting and learning itself.
        Not called for an agent that gives `frame_replay`.
        """
        raise NotImplementedError(
            f"{type(self).__name__} implements neither frame_replay nor make_replay_tables"
        )

    def make_adder(
        self, replay_client: reverb.Client, environment_spec: specs.EnvironmentSpec
    ) -> adders.Adder:
        """Creates the adder an actor uses to write experience to replay (not called for an
        agent that gives `frame_replay`)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither frame_replay nor make_adder"
        )

    def make_dataset_iterator(self, replay_client: reverb.Client) -> Iterator[Sample]:
        """Creates the iterator of training batches the learner consumes (not called for an
        agent that gives `frame_replay`)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither frame_replay nor make_dataset_iterator"
        )

    @abc.abstractmethod
    def make_learner(
        self,
        random_key: jax.Array,
        networks: Networks,
        dataset: Iterator[Sample],
        environment_spec: specs.EnvironmentSpec,
        logger: loggers.Logger,
        counter: counting.Counter,
    ) -> Learner:
        """Creates the learner.

        Args:
          random_key: the learner's own key (parameter init, noise).
          networks: the agent's networks from the experiment's network factory.
          dataset: training batches: the toolkit's store's (a `frame_replay` or
            `transition_replay` agent), else from `make_dataset_iterator`.
          environment_spec: specs of the environment.
          logger: where the learner writes its metrics.
          counter: counts learner steps; the runners give a counter prefixed "learner", so
            the program sees `learner_steps`.

        The learner must serve `POLICY_VARIABLES`: what the policy's `select_action` takes.
        """

    @abc.abstractmethod
    def make_policy(
        self, networks: Networks, environment_spec: specs.EnvironmentSpec, evaluation: bool
    ) -> ActorCore:
        """Creates the acting policy; `evaluation=True` turns exploration off.

        The toolkit wraps it in a `magi_lp.agent.actor.GenericActor` that pulls
        `POLICY_VARIABLES` every `config.variable_update_period` actor steps.
        """
