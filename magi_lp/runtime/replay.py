"""The replay of a program, made by the toolkit for the agent: tables, adders, batches.

An agent whose builder gives a `frame_replay` spec (DrQ-v2) never chooses its store; the
config does (`replay.store`, resolved before anything starts by
`magi_lp.runtime.replay_plan`):

- 'device': the frames live on the learner's device(s) (`magi_lp.agent.frame_store`). In a
  distributed program the replay node holds only a Reverb queue of steps
  (`magi_lp.agent.frame_queue`): actors write each step once, a thread of the learner drains
  it into the store, and the learner enforces the replay ratio (`RatioGate`). In one process
  the actor writes into the store directly: no Reverb, no TensorFlow.
- 'reverb': the Reverb frame replay (`magi_lp.agent.frame_replay`), sampled by the learner's
  CPU, rate-limited by the table.

Any other agent (TD3) makes its own Reverb tables, adders and dataset through its builder,
and every function here hands those through; in one process where Reverb is not installed
(or `replay.store`='device'), an agent whose builder gives `transition_replay` learns from
the toolkit's host-memory n-step replay instead (`magi_lp.agent.transition_replay`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import jax

from magi_lp import console
from magi_lp.agent.frame_store import (
    DeviceFrameStore,
    DeviceReplayIterator,
    FrameReplaySpec,
    StoreAdder,
)
from magi_lp.agent.replay_schedule import RatioGate
from magi_lp.agent.transition_replay import TransitionAdder, TransitionReplay
from magi_lp.runtime.experiment import Experiment

FRAME_TABLE = "frames"
"""The Reverb frame replay's table (store 'reverb')."""

STEP_QUEUE = "steps"
"""The Reverb queue that carries actors' steps to the learner's device store (store 'device')."""


def frame_spec(experiment: Experiment, environment_spec: Any) -> FrameReplaySpec | None:
    """The agent's frame replay spec, or None for an agent with its own tables."""
    return experiment.builder.frame_replay(environment_spec)


def store_kind(config: Any) -> str:
    """'device' or 'reverb': `replay.store` as the launcher resolved it.

    An unresolved 'auto' (a runner called without the entry points' planning, as tests do)
    means Reverb where it is installed, the device store where it is not.
    """
    store = config.get("replay", {}).get("store", "auto")
    if store == "auto":
        return "reverb" if importlib.util.find_spec("reverb") is not None else "device"
    return store


def host_replay_spec(experiment: Experiment, environment_spec: Any) -> Any:
    """The host replay a state agent learns from in one process without Reverb, or None."""
    if frame_spec(experiment, environment_spec) is not None:
        return None
    if store_kind(experiment.config) != "device":
        return None
    return experiment.builder.transition_replay(environment_spec)


def uses_reverb(
    experiment: Experiment, environment_spec: Any, single_process: bool = False
) -> bool:
    """Whether the replay needs a Reverb server: every store but the device store (and, in
    one process, a state agent's host replay)."""
    spec = frame_spec(experiment, environment_spec)
    if spec is None:
        return not (single_process and host_replay_spec(experiment, environment_spec))
    return store_kind(experiment.config) == "reverb"


def num_writers(config: Any, single_process: bool = False) -> int:
    """Adders writing at once: every environment of every actor."""
    actors = 1 if single_process else int(config.num_actors)
    return actors * int(config.envs_per_actor)


def make_replay_tables(experiment: Experiment, environment_spec: Any) -> list:
    """The replay node's Reverb tables (in the replay node's process)."""
    spec = frame_spec(experiment, environment_spec)
    if spec is None:
        return experiment.builder.make_replay_tables(environment_spec)
    config = experiment.config
    if store_kind(config) == "device":
        from magi_lp.agent.frame_queue import make_step_queue_table

        return [make_step_queue_table(STEP_QUEUE, int(config.replay.queue_steps))]
    from magi_lp.agent.frame_replay import make_frame_replay_table

    return [
        make_frame_replay_table(
            FRAME_TABLE,
            spec.capacity,
            frame_shape=spec.frame_shape,
            action_spec=environment_spec.actions,
            frame_stack=spec.frame_stack,
            n_step=spec.n_step,
            rate_limiter=experiment.builder.replay_schedule().rate_limiter(),
        )
    ]


def make_adder(
    experiment: Experiment,
    environment_spec: Any,
    replay: Any,
    writer: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> Any:
    """Writer `writer`'s adder (actor index x envs_per_actor + environment index).

    Args:
      replay: a Reverb client (distributed; both stores), or a `LearnerReplay` whose device
        store the actor writes into directly (one process).
      should_stop: whether the program is stopping: a frame-replay adder then gives up a
        write the replay holds back (`frame_replay.WriteAbandonedError`) instead of blocking.
    """
    spec = frame_spec(experiment, environment_spec)
    if isinstance(replay, LearnerReplay):
        if replay.store is not None:
            return StoreAdder(replay.store, writer)
        if replay.host is not None:
            return TransitionAdder(replay.host, replay.host.spec.n_step, replay.host.spec.discount)
        replay = replay.client
    if spec is None:
        return experiment.builder.make_adder(replay, environment_spec)
    if store_kind(experiment.config) == "device":
        from magi_lp.agent.frame_queue import QueueFrameAdder

        return QueueFrameAdder(replay, STEP_QUEUE, writer, spec, should_stop=should_stop)
    from magi_lp.agent.frame_replay import FrameStackAdder

    writers = num_writers(experiment.config)
    min_size = experiment.builder.replay_schedule().min_replay_size
    return FrameStackAdder(
        replay,
        FRAME_TABLE,
        frame_stack=spec.frame_stack,
        n_step=spec.n_step,
        channels=spec.frame_shape[-1],
        # Sent at once until this adder's share of what learning starts with is in.
        eager_items=-(-min_size // writers),
        should_stop=should_stop,
    )


@dataclasses.dataclass
class LearnerReplay:
    """What the learner samples from, and what goes with it.

    Attributes:
      iterator: the learner's batches.
      client: the Reverb client (None in one process on the device store or host replay).
      store: the device store (None for Reverb stores).
      host: a state agent's host replay (one process without Reverb), else None.
      gate: the replay ratio the learner enforces (device store, distributed only).
      drainer: the thread moving steps from the queue into the store (distributed only).
    """

    iterator: Iterator[Any]
    client: Any = None
    store: DeviceFrameStore | None = None
    gate: RatioGate | None = None
    drainer: Any = None
    host: TransitionReplay | None = None

    @property
    def saves(self) -> bool:
        """Whether `checkpoint.replay` has something to save (a toolkit store)."""
        return self.store is not None or self.host is not None

    def info(self) -> dict[str, Any]:
        """The store's numbers for the status view (empty for Reverb stores, which the
        probe asks Reverb about)."""
        if self.host is not None:
            return {
                "replay_size": self.host.size,
                "replay_inserted": self.host.inserted,
                "replay_sampled": self.host.sampled_batches * self.host.spec.batch_size,
            }
        if self.store is None:
            return {}
        return {
            "replay_size": self.store.size,
            "replay_inserted": self.store.inserted,  # transitions
            "replay_sampled": self.store.sampled_batches * self.store.spec.batch_size,
            "replay_steps_added": self.store.steps_added,  # frames, episode starts included
        }

    def has_items(self) -> bool:
        """Whether a batch can be sampled without waiting for data (one process)."""
        if self.store is not None:
            self.store.flush()
            return self.store.ready()
        if self.host is not None:
            return self.host.ready(self.host.spec.batch_size)
        tables = self.client.server_info().values()
        return all(table.current_size > 0 for table in tables)

    def save(self) -> Any:
        """The store's checkpoint state (`checkpoint.replay`)."""
        if self.host is not None:
            return self.host.save()
        return self.store.save()

    def restore(self, saved: Any) -> None:
        """Takes a saved store back, with the replay ratio's counts."""
        if self.host is not None:
            self.host.restore(saved)
            console.say(
                f"replay restored: {self.host.size} transitions "
                f"({self.host.inserted} inserted, {self.host.sampled_batches} batches sampled)",
                source="checkpoint",
            )
            return
        self.store.restore(saved)
        if self.gate is not None:
            self.gate.restore(self.store.inserted, self.store.sampled_batches)
        console.say(
            f"replay restored: {self.store.size} transitions "
            f"({self.store.inserted} inserted, {self.store.sampled_batches} batches sampled)",
            source="checkpoint",
        )

    def start(self) -> None:
        """Starts taking actors' steps (after a restore: they go into the restored store)."""
        if self.drainer is not None:
            self.drainer.start()

    def close(self) -> None:
        """Stops the drain thread and ends the learner's waits (a prompt stop)."""
        if self.drainer is not None:
            self.drainer.close()
        elif self.gate is not None:
            self.gate.close()


def make_learner_replay(
    experiment: Experiment,
    environment_spec: Any,
    *,
    replay_client: Any = None,
    single_process: bool = False,
    key: jax.Array | None = None,
) -> LearnerReplay:
    """The learner's side of the replay.

    Args:
      experiment: the experiment.
      environment_spec: its environment's spec.
      replay_client: the Reverb client (None: one process on the device store).
      single_process: the single-process runner interleaves by the schedule itself: the
        device store is written by the actor directly and sampled without a gate.
      key: the device store's sampling key.
    """
    config = experiment.config
    builder = experiment.builder
    spec = frame_spec(experiment, environment_spec)
    host_spec = host_replay_spec(experiment, environment_spec) if single_process else None
    if host_spec is not None:
        seed = 0 if key is None else int(jax.random.randint(key, (), 0, 2**31 - 1))
        host = TransitionReplay(host_spec, environment_spec, seed=seed)
        return LearnerReplay(_host_batches(host), host=host)
    if spec is None:
        return LearnerReplay(builder.make_dataset_iterator(replay_client), client=replay_client)
    if store_kind(config) == "reverb":
        from magi_lp.agent.frame_replay import make_frame_replay_dataset

        dataset = make_frame_replay_dataset(
            replay_client.server_address,
            FRAME_TABLE,
            batch_size=spec.batch_size,
            frame_stack=spec.frame_stack,
            n_step=spec.n_step,
            discount=spec.discount,
            stack_on_host=False,
            num_parallel_calls=int(config.agent.get("dataset_num_parallel_calls", 2)),
        )
        return LearnerReplay(dataset, client=replay_client)
    key = jax.random.PRNGKey(0) if key is None else key
    store = DeviceFrameStore(spec, writers=num_writers(config, single_process))
    if single_process or replay_client is None:
        return LearnerReplay(DeviceReplayIterator(store, key), store=store)
    from magi_lp.agent.frame_queue import QueueDrainer, failure_of

    gate = RatioGate(builder.replay_schedule())
    drainer = QueueDrainer(replay_client, STEP_QUEUE, store, gate)
    iterator = DeviceReplayIterator(store, key, gate=gate, failure=failure_of(drainer))
    return LearnerReplay(iterator, client=replay_client, store=store, gate=gate, drainer=drainer)


def _host_batches(host: TransitionReplay) -> Iterator[Any]:
    """Batches of the host replay, forever (the runner samples only once it holds data)."""
    while True:
        yield host.sample()
