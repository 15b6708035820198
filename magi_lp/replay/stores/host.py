"""A state agent's n-step transitions in host memory, in one process without Reverb.

Where Reverb is not installed (Python 3.12 and current JAX) an agent whose builder gives
`transition_replay` (TD3) learns from `magi_lp.replay.transition_replay`: the batches Acme's
`NStepTransitionAdder` and `make_reverb_dataset` give.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from magi_lp.replay.store import HeldLearnerReplay, ReplayStore, StopFn, never


class HostLearnerReplay(HeldLearnerReplay):
    """The host replay on the learner's side (`held`, also `host`)."""

    def __init__(self, host: Any):
        super().__init__(_batches(host), host)
        self.host = host

    def has_items(self) -> bool:
        return self.host.ready(self.host.spec.batch_size)


def _batches(host: Any) -> Iterator[Any]:
    """Batches of the host replay, forever (the runner samples only once it holds data)."""
    while True:
        yield host.sample()


class HostTransitions(ReplayStore):
    """n-step transitions in host memory (one process only)."""

    name = "host transitions"

    uses_reverb = False

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        del environment_spec, writer, should_stop  # one writer, never blocked
        from magi_lp.replay.transition_replay import TransitionAdder

        return TransitionAdder(replay.host, replay.host.spec.n_step, replay.host.spec.discount)

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> HostLearnerReplay:
        del replay_client
        from magi_lp.replay.transition_replay import TransitionReplay

        seed = 0
        if key is not None:
            import jax

            seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        spec = self.builder.transition_replay(environment_spec)
        return HostLearnerReplay(TransitionReplay(spec, environment_spec, seed=seed))
