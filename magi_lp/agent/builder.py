"""The builder protocol: the seam between the toolkit and an agent project.

An agent is a builder + networks + configs, in the spirit of Acme's `ActorLearnerBuilder`.
The runners (`program.build_program` for Launchpad, `local_runner.run_local` for one process)
never know which agent they run: they only call the methods below, in the process where each
piece lives. Everything a builder returns must be constructible inside a freshly spawned node
process, so builders hold plain configs and build heavy objects lazily in these methods.

Acme 0.4.0's JAX builder module cannot be imported with any installable jaxlib (see STACK.md),
so the protocol is restated here using only Acme's framework-neutral types.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import jax
import reverb
from acme import adders, core, specs
from acme.utils import counting, loggers

Networks = TypeVar("Networks")
Policy = TypeVar("Policy")
Sample = TypeVar("Sample")

PRNGKey = jax.Array
LoggerFactory = Callable[..., loggers.Logger]


class Learner(core.Learner):
    """A learner the runners can drive, checkpoint and serve parameters from.

    On top of Acme's `core.Learner` (`step()` and `get_variables(names)`), a magi_lp learner
    exposes its complete training state as a pytree, so that the toolkit (not the agent) owns
    checkpointing: `save()` returns a pytree of arrays (parameters, optimizer state, step
    counters), and `restore(state)` puts such a pytree back.
    """

    @abc.abstractmethod
    def save(self) -> Any:
        """Returns the full training state as a pytree of arrays."""

    @abc.abstractmethod
    def restore(self, state: Any) -> None:
        """Replaces the training state with one returned by `save()`."""


class VariableSource(Protocol):
    """Anything actors can pull parameters from: a learner, or a Courier handle to one."""

    def get_variables(self, names: Sequence[str]) -> list[Any]:
        """Returns the current values of the named variable collections."""


@dataclasses.dataclass(frozen=True)
class ReplaySchedule:
    """When the learner may update, in actor (agent) steps.

    Both runners honour the same schedule: the distributed program through the replay
    table's rate limiter (see `rate_limiter()`), the single-process runner by interleaving
    one learner step every `actor_steps_per_update` actor steps once the replay holds
    `min_replay_size` items. Stating it once keeps the two modes' replay ratios equal.

    Attributes:
      min_replay_size: items in replay before the first learner step.
      actor_steps_per_update: actor steps per learner step (DrQ-v2: 2).
      batch_size: items per learner step; with the above it fixes samples per insert.
      error_buffer_factor: how far the distributed rate limiter may drift from the exact
        ratio, in learner steps' worth of samples, before it blocks one side.
    """

    min_replay_size: int
    actor_steps_per_update: float
    batch_size: int
    error_buffer_factor: float = 100.0

    @property
    def samples_per_insert(self) -> float:
        """Samples drawn per item inserted when the schedule is exact."""
        return self.batch_size / self.actor_steps_per_update

    def rate_limiter(self) -> reverb.rate_limiters.RateLimiter:
        """A Reverb rate limiter that enforces this schedule across processes."""
        error_buffer = max(self.error_buffer_factor * self.batch_size, self.samples_per_insert)
        return reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=self.samples_per_insert,
            min_size_to_sample=self.min_replay_size,
            error_buffer=error_buffer,
        )

    def updates_due(self, actor_steps: int) -> int:
        """Learner steps the single-process runner owes after `actor_steps` actor steps."""
        if actor_steps < self.min_replay_size:
            return 0
        elapsed = actor_steps - self.min_replay_size
        return int(elapsed // self.actor_steps_per_update) + 1


class AgentBuilder(abc.ABC, Generic[Networks, Policy, Sample]):
    """Builds every piece of one agent; implemented once per agent project.

    Each method is called in the process that will own the piece: replay tables in the
    replay node, the learner and its dataset in the learner node, actors in actor nodes.
    """

    @abc.abstractmethod
    def replay_schedule(self) -> ReplaySchedule:
        """When learning starts and how often the learner steps per actor step."""

    @abc.abstractmethod
    def make_replay_tables(
        self,
        environment_spec: specs.EnvironmentSpec,
        *,
        rate_limited: bool,
    ) -> list[reverb.Table]:
        """Creates the Reverb tables the adder writes to and the dataset reads from.

        Args:
          environment_spec: specs of observations, actions, rewards and discounts.
          rate_limited: True in the distributed program, where the table's rate limiter
            must enforce `replay_schedule()` between independent actor and learner
            processes. False in the single-process runner, which interleaves acting and
            learning itself and must never block on the table.
        """

    @abc.abstractmethod
    def make_adder(
        self, replay_client: reverb.Client, environment_spec: specs.EnvironmentSpec
    ) -> adders.Adder:
        """Creates the adder an actor uses to write experience to replay."""

    @abc.abstractmethod
    def make_dataset_iterator(self, replay_client: reverb.Client) -> Iterator[Sample]:
        """Creates the iterator of training batches the learner consumes."""

    @abc.abstractmethod
    def make_learner(
        self,
        random_key: PRNGKey,
        networks: Networks,
        dataset: Iterator[Sample],
        environment_spec: specs.EnvironmentSpec,
        logger: loggers.Logger,
        counter: counting.Counter | None = None,
    ) -> Learner:
        """Creates the learner.

        Args:
          random_key: the learner's own key (parameter init, noise).
          networks: the agent's networks from the experiment's network factory.
          dataset: training batches from `make_dataset_iterator`.
          environment_spec: specs of the environment.
          logger: where the learner writes its metrics.
          counter: counts learner steps; shared with the program's counter node.
        """

    @abc.abstractmethod
    def make_policy(
        self, networks: Networks, environment_spec: specs.EnvironmentSpec, evaluation: bool
    ) -> Policy:
        """Creates the acting policy; `evaluation=True` turns exploration off."""

    @abc.abstractmethod
    def make_actor(
        self,
        random_key: PRNGKey,
        policy: Policy,
        environment_spec: specs.EnvironmentSpec,
        variable_source: VariableSource,
        adder: adders.Adder | None = None,
    ) -> core.Actor:
        """Creates an actor that acts with `policy`, pulling parameters from `variable_source`.

        Evaluators get `adder=None`: they never write to replay.
        """
