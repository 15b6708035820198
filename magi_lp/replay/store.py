"""The store protocol: what every replay store makes, in the process that owns each piece.

A store is one class (`ReplayStore`), the way an agent is one `AgentBuilder`: the replay
node's part (Reverb tables, or the object the engine serves), each actor's adder, the
learner's batches (a `LearnerReplay`, with the store's checkpoint and status numbers) and the
bytes it takes on the learner's device. The program graph (`magi_lp.runtime.program`) and the
single-process runner (`magi_lp.runtime.single_process`) get one resolved store
(`magi_lp.replay.stores.resolve_store`) and call these methods; neither asks which store it
is. Implementations import their heavy modules (JAX, Reverb, TensorFlow) inside the methods,
so the list of stores loads in the entry points before anything heavy.

The replay transport (`TRANSPORTS`) is the engine's: how the replay node's part reaches the
actors and the learner in a distributed program.

- 'reverb' (Launchpad): the replay node runs a Reverb server with `make_tables`'s tables;
  adders and the learner get a Reverb client.
- 'served' (an engine without Reverb, e.g. Ray): the replay node holds the object
  `make_server` returns and serves its public methods as remote calls (thread-safe, each
  waiting at most a short timeout, `close()` ending every wait); adders and the learner get
  a handle whose methods call them (the device store's `magi_lp.replay.served_queue.StepQueue`,
  the host transitions' `magi_lp.replay.transition_table.TransitionTable`).

One process uses no transport: the actor writes where the learner samples.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from magi_lp import console

StopFn = Callable[[], bool]

TRANSPORTS = ("reverb", "served")
"""The replay transports an engine can give (`ReplayStore.transport`); 'reverb' by default."""


def never() -> bool:
    """A program that is never stopping (a run in one thread, a benchmark)."""
    return False


class LearnerReplay:
    """The learner's side of a store: its batches, and what goes with them.

    This base serves a store the Reverb server holds (nothing to save with the learner's
    checkpoint; the probe asks Reverb for its numbers). Stores the toolkit holds itself use
    `HeldLearnerReplay`.

    Attributes:
      iterator: the learner's batches.
      client: the Reverb client (None where the store uses no Reverb).
    """

    saves = False
    """Whether `checkpoint.replay` has something to save (a store the toolkit holds)."""

    def __init__(self, iterator: Iterator[Any], client: Any = None):
        self.iterator = iterator
        self.client = client

    def info(self) -> dict[str, Any]:
        """The store's numbers for the status view (empty: the probe asks Reverb)."""
        return {}

    def has_items(self) -> bool:
        """Whether a batch can be sampled without waiting for data (one process)."""
        tables = self.client.server_info().values()
        return all(table.current_size > 0 for table in tables)

    def holding_writes(self) -> contextlib.AbstractContextManager[Any]:
        """Writes wait until the block ends: a checkpoint of `save()` is written inside it."""
        return contextlib.nullcontext()

    def save(self) -> Any:
        """The store's checkpoint state (`checkpoint.replay`)."""
        raise NotImplementedError(f"{type(self).__name__} is saved by Reverb, not the learner")

    def restore(self, saved: Any) -> None:
        """Takes a saved store back."""
        raise NotImplementedError(f"{type(self).__name__} is restored by Reverb, not the learner")

    def start(self) -> None:
        """Starts taking actors' steps (after a restore: they go into the restored store)."""

    def take_the_rest(self) -> int:
        """At a stop, with the writers gone: takes in the steps still on their way to the
        store, so its final checkpoint holds every step the actors counted (the device
        store's step queue). Returns how many; the drain is closed after it."""
        return 0

    def close(self) -> None:
        """Ends the learner's waits (a prompt stop)."""


class HeldLearnerReplay(LearnerReplay):
    """The learner's side of a store the toolkit holds itself (`held`: the device frame store
    or the host transition replay): saved with the learner's checkpoint, its numbers in the
    status view.

    `held` has `size`, `inserted`, `sampled_batches`, `spec.batch_size`, `save()` and
    `restore(saved)`, and may have `holding_writes()` (a context in which its writes wait).
    """

    saves = True

    def __init__(self, iterator: Iterator[Any], held: Any, client: Any = None):
        super().__init__(iterator, client)
        self.held = held

    def info(self) -> dict[str, Any]:
        return {
            "replay_size": self.held.size,
            "replay_inserted": self.held.inserted,  # transitions
            "replay_sampled": self.held.sampled_batches * self.held.spec.batch_size,
        }

    def holding_writes(self) -> contextlib.AbstractContextManager[Any]:
        hold = getattr(self.held, "holding_writes", None)
        return contextlib.nullcontext() if hold is None else hold()

    def save(self) -> Any:
        return self.held.save()

    def restore(self, saved: Any) -> None:
        self.held.restore(saved)
        console.say(
            f"replay restored: {self.held.size} transitions "
            f"({self.held.inserted} inserted, {self.held.sampled_batches} batches sampled)",
            source="checkpoint",
        )


class ReplayStore(abc.ABC):
    """One replay store: every piece of it, made in the process that owns the piece.

    Constructed once per run from the agent's builder and the experiment config (picklable:
    the engine ships it to every node that calls it). `single_process`: the runner interleaves
    acting and learning in one thread, so nothing may block on a rate limit. `transport`: the
    engine's replay transport (`TRANSPORTS`; ignored in one process).
    """

    name: str = ""
    """The store's `replay.store` value (agents' own stores: a description)."""

    uses_reverb: bool = True
    """Whether a Reverb server holds (part of) it: the replay node, or one in-process."""

    saved_by: str = "reverb"
    """The `checkpoint.<key>` that saves its data: 'reverb' (the Reverb server's own
    checkpoint) or 'replay' (the learner saves it beside its checkpoints)."""

    def __init__(
        self,
        builder: Any,
        config: Any,
        *,
        single_process: bool = False,
        transport: str = "reverb",
    ):
        self.builder = builder
        self.config = config
        self.single_process = single_process
        self.transport = transport

    @property
    def served(self) -> bool:
        """Whether the engine serves the replay node's part (`make_server`): a distributed
        program on the 'served' transport."""
        return self.transport == "served" and not self.single_process

    @property
    def writers(self) -> int:
        """Adders writing at once: every environment of every actor."""
        actors = 1 if self.single_process else int(self.config.num_actors)
        return actors * int(self.config.envs_per_actor)

    def make_tables(self, environment_spec: Any) -> list:
        """The Reverb tables of the replay node (or of the single-process runner's server);
        transport 'reverb' only."""
        del environment_spec
        return []

    def make_server(self, environment_spec: Any) -> Any:
        """What the replay node holds and the engine serves (transport 'served'), or None:
        nothing to serve.

        Made in the replay node's process. Its public methods are the remote calls: each is
        thread-safe and waits at most a short timeout, `info()` gives its numbers,
        `close()` ends every wait (at the stop), and `save()` / `restore(saved)` checkpoint
        what it holds. The actors' adders and the learner get a handle calling them
        (`make_adder`'s `replay`, `make_learner_replay`'s `replay_client`).
        """
        del environment_spec
        return None

    @abc.abstractmethod
    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        """Writer `writer`'s adder (actor index x envs_per_actor + environment index).

        Args:
          replay: a Reverb client (a distributed program on transport 'reverb'), the handle
            of `make_server`'s object (transport 'served'), or this store's `LearnerReplay`
            (one process: the actor writes where the learner samples).
          should_stop: whether the program is stopping: an adder then gives up a write the
            replay holds back (`magi_lp.replay.spec.WriteAbandonedError`) instead of blocking.
        """

    def make_adders(
        self,
        environment_spec: Any,
        replay: Any,
        writers: Sequence[int],
        should_stop: StopFn = never,
    ) -> list[Any]:
        """One actor's adders, one per environment (`writers`: their `make_adder` indices).
        A store may have them share what carries their writes (the device store's served
        sender: one call for the actor's k environments); by default `make_adder` each."""
        return [self.make_adder(environment_spec, replay, w, should_stop) for w in writers]

    @abc.abstractmethod
    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> LearnerReplay:
        """The learner's side. `replay_client`: the Reverb client (transport 'reverb'), the
        handle of `make_server`'s object (transport 'served'), or None (one process without
        Reverb); `key`: a JAX key for a store that samples on the device."""

    def nbytes(self, shards: int = 1) -> int:
        """Bytes the store takes on the learner's device(s) (0: it lives elsewhere)."""
        del shards
        return 0


def reverb_client_of(replay: Any) -> Any:
    """The Reverb client behind `replay` (a client, or a `LearnerReplay` in one process)."""
    return replay.client if isinstance(replay, LearnerReplay) else replay
