"""A state agent's n-step transitions in host memory, without Reverb: in one process, or
served by the replay node.

Where Reverb is not installed (Python 3.12 and current JAX) an agent whose builder gives
`transition_replay` (TD3) learns from `magi_lp.replay.transition_replay`: the batches Acme's
`NStepTransitionAdder` and `make_reverb_dataset` give. In one process the actor writes into
it and the learner samples it directly; on the 'served' transport the replay node holds it
as a `magi_lp.replay.transition_table.TransitionTable` (the minimum size, the replay ratio's
limiter, short waits), the actors' adders insert through its handle and the learner samples
through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from magi_lp import console
from magi_lp.replay.store import HeldLearnerReplay, LearnerReplay, ReplayStore, StopFn, never


class HostLearnerReplay(HeldLearnerReplay):
    """The host replay on the learner's side, in one process (`held`, also `host`)."""

    def __init__(self, host: Any):
        super().__init__(_batches(host), host)
        self.host = host

    def has_items(self) -> bool:
        return self.host.ready(self.host.spec.batch_size)


def _batches(host: Any) -> Iterator[Any]:
    """Batches of the host replay, forever (the runner samples only once it holds data)."""
    while True:
        yield host.sample()


class ServedLearnerReplay(LearnerReplay):
    """The learner's side of a served `TransitionTable`, through `table` (the handle of the
    replay node's table): its batches (`TransitionSampler`), its numbers, and its checkpoint
    (`checkpoint.replay`: the learner saves the table beside its own checkpoint, as it saves a
    store it holds)."""

    saves = True

    def __init__(self, table: Any):
        from magi_lp.replay.transition_table import TransitionSampler

        super().__init__(TransitionSampler(table))
        self.table = table

    def info(self) -> dict[str, Any]:
        info = self.table.info()
        return {
            "replay_size": info["size"],
            "replay_inserted": info["inserted"],  # transitions
            "replay_sampled": info["sampled_batches"] * info["batch_size"],
        }

    def has_items(self) -> bool:
        return self.table.info()["size"] > 0

    def save(self) -> Any:
        return self.table.save()

    def restore(self, saved: Any) -> None:
        self.table.restore(saved)
        info = self.table.info()
        console.say(
            f"replay restored: {info['size']} transitions "
            f"({info['inserted']} inserted, {info['sampled_batches']} batches sampled)",
            source="checkpoint",
        )

    def close(self) -> None:
        """Ends the learner's wait for a batch (the table is the replay node's to close)."""
        self.iterator.close()


class HostTransitions(ReplayStore):
    """n-step transitions in host memory: the learner's own in one process, the replay
    node's served table between processes (transport 'served')."""

    name = "host transitions"

    uses_reverb = False
    saved_by = "replay"

    def _seed(self) -> int:
        return int(self.config.get("seed", 0))

    def make_server(self, environment_spec: Any) -> Any:
        """The served table (`TransitionTable`), or None (one process)."""
        if not self.served:
            return None
        from magi_lp.replay.transition_table import TransitionTable

        return TransitionTable(
            self.builder.transition_replay(environment_spec),
            environment_spec,
            self.builder.replay_schedule(),
            seed=self._seed(),
        )

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        del writer  # transitions carry no writer: each adder completes its own
        if isinstance(replay, HostLearnerReplay):  # one process: one writer, never blocked
            from magi_lp.replay.transition_replay import TransitionAdder

            return TransitionAdder(replay.host, replay.host.spec.n_step, replay.host.spec.discount)
        from magi_lp.replay.transition_table import ServedTransitionAdder

        spec = self.builder.transition_replay(environment_spec)
        return ServedTransitionAdder(replay, spec.n_step, spec.discount, should_stop=should_stop)

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> LearnerReplay:
        if self.served:
            return ServedLearnerReplay(replay_client)
        from magi_lp.replay.transition_replay import TransitionReplay

        seed = 0
        if key is not None:
            import jax

            seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        spec = self.builder.transition_replay(environment_spec)
        return HostLearnerReplay(TransitionReplay(spec, environment_spec, seed=seed))
