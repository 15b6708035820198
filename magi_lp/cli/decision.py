"""The one launch decision: what runs where, decided once, before any engine starts.

From the checked config and the chosen engine: the placement plan (each launch group's
devices, env and threads), the replay store (where a pixel agent's frames live, against the
learner's memory), each GPU node's memory from its compiled programs, and the lines to say
about them. The result is frozen and handed down; the config it was given is not changed
(the store it settles is in a copy, `LaunchDecision.config`), and the experiment is made
once, here, from that copy.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from magi_lp import engines
from magi_lp.cli.checks import (
    _check_agent_tables,
    _check_replay_can_fill,
    _cluster,
    _compilation_cache_settings,
    _ignored_sigint,
    _make,
    _never_updates,
    _replay_checkpoint_notices,
    _resource_notices,
)
from magi_lp.cli.flags import MakeExperiment
from magi_lp.placement.jax_build import JaxBuild, compilation_cache_warning
from magi_lp.placement.xla_flags import check_xla_flags
from magi_lp.replay.plan import plan_replay_store
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.config import (
    capacity_warnings,
    make_placement_plan,
    resolve_actor_counts,
    single_process_counts,
)
from magi_lp.runtime.memory_reckoning import size_gpu_memory


@dataclasses.dataclass(frozen=True)
class LaunchDecision:
    """What a launch runs, decided once.

    Attributes:
      config: the experiment config with `replay.store` settled and 'auto' `num_actors` /
        `envs_per_actor` made numbers (a copy of the one given).
      experiment: the project's experiment, made once from `config`.
      store: where a pixel agent's frames live (`ReplayStorePlan`); None for other agents.
      replay: the store that serves the agent's replay (`magi_lp.replay.stores`).
      lines: what the launch says about itself before it starts ("notice: ...",
        "warning: ...", the replay's line), in order.
      plan: the placement plan, each GPU node's memory sized (distributed runs; None in one
        process).
      group_resources: launch group -> the custom resources its nodes ask the engine for.
    """

    config: Any
    experiment: Any
    store: Any
    replay: Any
    lines: tuple[str, ...]
    plan: Any = None
    group_resources: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)


def _settled(config: Any, experiment: Any, builder: Any, **plan_store: Any) -> Any:
    """The store `plan_replay_store` settles for `builder`, in a copy of `config`; the
    experiment made from the config given, pointed at the copy (a project's builder reads its
    own sections, which the copy leaves as they were)."""
    settled = copy.deepcopy(config)
    store = plan_replay_store(settled, builder, **plan_store)
    return settled, dataclasses.replace(experiment, config=settled), store


def _placement_plan(config: Any, engine: engines.Engine) -> tuple[Any, dict]:
    """This machine's placement plan, and no group resources; or, on the cluster of several
    machines an engine joins (the driver inside a Ray job of `--launcher slurm|kubernetes`),
    the host plan's, each launch group asking for its machine's resource (docs/cluster.md)."""
    if "hosts" in config and engine.cluster_address():
        return _cluster().main.joined_cluster_plan(config)
    return make_placement_plan(config), {}


def reverb_carries_replay(engine: engines.Engine) -> bool:
    """Whether the engine's replay can be Reverb here (so 'auto' may choose it)."""
    from magi_lp.replay.stores import reverb_installed

    return engine.transport == "reverb" and reverb_installed()


def decide_distributed(
    make_experiment: MakeExperiment,
    config: Any,
    workdir: Path,
    engine: engines.Engine,
    finished: str | None,
) -> LaunchDecision:
    """The decision of `lp_main.py` on a one-machine engine (or a cluster it joins)."""
    sized = None
    if not ("hosts" in config and engine.cluster_address()):
        # 'auto' actors sized to this machine, once, before the plan and the experiment: all
        # of them (and everything made from `LaunchDecision.config`) read the same numbers.
        config, sized = resolve_actor_counts(config)
    plan, group_resources = _placement_plan(config, engine)
    check_xla_flags(
        {group: config.resources[group].get("xla_flags", "") for group in config.resources},
        os.environ.get("XLA_FLAGS"),
    )
    made = _make(make_experiment, config, workdir)
    builder = made.builder
    _check_replay_can_fill(builder)
    config, experiment, store = _settled(
        config,
        made,
        builder,
        plan=plan,
        reverb_available=reverb_carries_replay(engine),
    )
    replay = resolve_store(builder, config, transport=engine.transport)
    _check_agent_tables(builder, replay, single_process=False)
    # Each GPU node's memory from its compiled programs ('auto'), checked GPU by GPU.
    plan = size_gpu_memory(experiment, plan, store)
    lines = [sized] if sized else []
    lines += [
        f"notice: {n}"
        for n in (
            *plan.notices,
            *_resource_notices(config),
            *_replay_checkpoint_notices(config, replay),
        )
    ]
    cache = compilation_cache_warning(plan.jax_build, _compilation_cache_settings(config))
    warnings = (
        *capacity_warnings(config),
        *plan.warnings,
        *([cache] if cache else []),
        *_never_updates(config, builder),
    )
    lines += [f"warning: {w}" for w in warnings]
    if store is not None:
        lines.append(store.line)
    else:  # an agent without frame_replay: which store holds its transitions
        lines.append(f"replay: {replay.name}, in the replay node")
    if finished:
        lines.append(f"notice: a launch would do nothing: {finished}")
    lines += [f"notice: {n}" for n in _ignored_sigint()]
    return LaunchDecision(config, experiment, store, replay, tuple(lines), plan, group_resources)


def decide_single_process(
    make_experiment: MakeExperiment, config: Any, workdir: Path, build: JaxBuild
) -> LaunchDecision:
    """The decision of `main.py`: the store in this process (no plan: no other process)."""
    check_xla_flags({}, os.environ.get("XLA_FLAGS"))
    config = single_process_counts(config)  # 'auto': the one actor, of one environment
    cache = compilation_cache_warning(build, _compilation_cache_settings(None))
    lines = [f"warning: {cache}"] if cache else []
    made = _make(make_experiment, config, workdir)
    builder = made.builder
    _check_replay_can_fill(builder)
    lines += [f"warning: {w}" for w in _never_updates(config, builder)]
    config, experiment, store = _settled(config, made, builder, single_process=True)
    if store is not None:
        lines.append(store.line)
    replay = resolve_store(builder, config, single_process=True)
    _check_agent_tables(builder, replay, single_process=True)
    if store is None:
        lines.append(f"replay: {replay.name}, in this process")
    lines += [f"notice: {n}" for n in _replay_checkpoint_notices(config, replay)]
    return LaunchDecision(config, experiment, store, replay, tuple(lines))
