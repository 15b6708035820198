"""magi_lp: Launchpad program graphs for Acme-style JAX agents, with per-node resources.

The public API, for agent projects and configs (`from magi_lp import AgentBuilder, ...`):

    ConfigError                      a user mistake: one line naming the key and the fix
    ResourceSpec, resource_spec      what one node group needs; its config-file form
    experiment_defaults              every toolkit config key with its default
    Experiment                       builder + environment/network factories + config
    Workdir                          a run's folder: where its logs, checkpoints, videos go
    AgentBuilder, ReplaySchedule     what an agent project implements; its replay ratio
    FrameReplaySpec                  what a pixel agent stores (`AgentBuilder.frame_replay`)
    TransitionReplaySpec             what a state agent stores without Reverb
    ActorCore                        acting as pure functions
    Learner, JaxLearner              what the runners drive; the base for a jitted update
    distributed_main                 the body of a project's lp_main.py
    single_process_main              the body of a project's main.py

The layers underneath (docs/architecture.md): `magi_lp.placement` (spec -> per-node env, no
ML framework), `magi_lp.launch` (local processes, isolation), `magi_lp.replay` (what an agent
stores and the stores that hold it), `magi_lp.agent` (the seam an agent implements),
`magi_lp.runtime` (nodes, program graph, runners, logs, checkpoints).
Names load on first use, so `import magi_lp.placement` never pulls in JAX or TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "magi_lp.errors",
    "ResourceSpec": "magi_lp.placement.resources",
    "resource_spec": "magi_lp.placement.resources",
    "experiment_defaults": "magi_lp.runtime.config",
    "Experiment": "magi_lp.runtime.experiment",
    "Workdir": "magi_lp.runtime.workdir",
    "AgentBuilder": "magi_lp.agent.builder",
    "ReplaySchedule": "magi_lp.replay.schedule",
    "FrameReplaySpec": "magi_lp.replay.spec",
    "TransitionReplaySpec": "magi_lp.replay.spec",
    "ActorCore": "magi_lp.agent.actor_core",
    "Learner": "magi_lp.agent.learner",
    "JaxLearner": "magi_lp.agent.learner",
    "distributed_main": "magi_lp.cli",
    "single_process_main": "magi_lp.cli",
}

__all__ = sorted(_EXPORTS)


_ENTRY_POINTS = ("distributed_main", "single_process_main")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'magi_lp' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    except KeyboardInterrupt:
        if name not in _ENTRY_POINTS:
            raise
        # An entry script's first import (about a second: absl, ml_collections, the CLI),
        # before the CLI handles Ctrl-C itself: the same one line, not a traceback.
        import signal
        import sys

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # its echo (magi_lp.cli: the same reason)
        from magi_lp import console

        console.say("interrupted before the run started; nothing was launched or written")
        sys.exit(130)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
