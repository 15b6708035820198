"""TD3 with a builder that gives only `transition_replay` (none of the three Reverb methods),
as a new state agent written from the docs may: `python tests/state_only_entry.py one|many
--config ...` runs it through `single_process_main` or `distributed_main`."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from magi_lp import AgentBuilder, distributed_main, single_process_main
from projects.td3.config import validate_config


def make_experiment(config):
    from projects.td3.builder import TD3Builder
    from projects.td3.experiment import make_experiment as make

    class StateOnlyBuilder(TD3Builder):
        make_replay_tables = AgentBuilder.make_replay_tables
        make_adder = AgentBuilder.make_adder
        make_dataset_iterator = AgentBuilder.make_dataset_iterator

    experiment = make(config)
    return dataclasses.replace(experiment, builder=StateOnlyBuilder(config.agent))


if __name__ == "__main__":
    main = single_process_main if sys.argv.pop(1) == "one" else distributed_main
    main(make_experiment, validate_config=validate_config)
