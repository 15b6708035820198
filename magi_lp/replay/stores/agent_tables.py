"""An agent's own Reverb tables (TD3): its builder makes the tables, adders and dataset.

For an agent whose builder gives no `frame_replay`: the toolkit hands its three replay
methods (`make_replay_tables`, `make_adder`, `make_dataset_iterator`) the Reverb server and
client of the replay node (or of the single-process runner).
"""

from __future__ import annotations

from typing import Any

from magi_lp.replay.store import LearnerReplay, ReplayStore, StopFn, never, reverb_client_of


class AgentTables(ReplayStore):
    """The agent's own Reverb tables."""

    name = "the agent's own Reverb tables"

    def make_tables(self, environment_spec: Any) -> list:
        return self.builder.make_replay_tables(environment_spec)

    def make_adder(
        self, environment_spec: Any, replay: Any, writer: int, should_stop: StopFn = never
    ) -> Any:
        del writer, should_stop  # Acme's adders neither know writers nor give up writes
        return self.builder.make_adder(reverb_client_of(replay), environment_spec)

    def make_learner_replay(
        self, environment_spec: Any, replay_client: Any, key: Any
    ) -> LearnerReplay:
        del environment_spec, key
        return LearnerReplay(self.builder.make_dataset_iterator(replay_client), replay_client)
