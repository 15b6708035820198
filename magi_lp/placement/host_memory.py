"""Host memory: what each node group of a program holds in RAM, and how many nodes each has.

Shared by the capacity warnings (`magi_lp.runtime.config`) and the replay's plan
(`magi_lp.replay.plan`), which counts the other nodes' memory against a device store on a
CPU learner. Plain numbers over the config: no ML framework, no Launchpad.
"""

from __future__ import annotations

from typing import Any

# Resident memory of one node after start-up (TensorFlow, JAX, Reverb and dm_control loaded),
# GiB, rounded up from the status view's RSS column (status.csv) of a tiny DrQ-v2 run on the
# 2-core CPU machine: counter, replay and coordinator 0.53-0.55, actors and evaluator 0.79,
# a tiny learner 0.83. A learner's networks and the replay's data come on top.
NODE_RSS_GIB: dict[str, float] = {
    "replay": 0.6,
    "counter": 0.6,
    "learner": 1.0,
    "actor": 0.8,
    "evaluator": 0.8,
    "coordinator": 0.6,
}


def node_counts(config: Any) -> dict[str, int]:
    """How many nodes each node group of the program has, in program order."""
    return {
        "replay": 1,
        "counter": 1,
        "learner": 1,
        "actor": int(config.num_actors),
        "evaluator": int(config.num_evaluators),
        "coordinator": 1,
    }
