"""The config and placement plan the GPU check measures (magi_lp's own plan, on this machine)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.common import REPO
from benchmarks.gpu_check.settings import CONFIG


def load_config(
    overrides: Mapping[str, Any] | None = None,
    num_actors: int | None = None,
    path: str = CONFIG,
    argument: str | None = None,
):
    """A config file's config (configs/reacher_hard_distributed.py by default, `get_config
    (argument)` when given one), with dotted-key overrides."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_config", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config() if argument is None else module.get_config(argument)
    for key, value in (overrides or {}).items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    if num_actors is not None:
        config.num_actors = num_actors
    # The check measures fixed layouts: where a config sizes its actors to the machine
    # ('auto', at launch), it measures the counts it was written for.
    if config.num_actors == "auto":
        config.num_actors = MEASURED_ACTORS.get(argument, 4)
    if config.envs_per_actor == "auto":
        config.envs_per_actor = 8 if config.resources.actor.device == "gpu" else 1
    return config


MEASURED_ACTORS = {None: 4, "1gpu": 2, "4gpu": 4}
"""get_config's argument -> the actors the check measures where the config says 'auto' (the
counts these configs gave before they were sized to the machine)."""


def make_plan(config: Any, inventory: Any) -> Any:
    """The plan `lp_main.py` makes for `config` on `inventory`."""
    from magi_lp.runtime.config import make_placement_plan

    return make_placement_plan(config, inventory)


def group_env(plan: Any, group: str, index: int = 0) -> dict[str, str]:
    """The env overrides node `index` of `group` gets under `plan`."""
    return dict(plan.groups[plan.launch_group(group, index)].env)


def _shown_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if v or k == "CUDA_VISIBLE_DEVICES"}


def describe_plan(plan: Any) -> dict:
    return {
        "table": plan.format_table(),
        "notices": list(plan.notices),
        "groups": {
            name: {
                "group": p.group,
                "nodes": len(p.node_indices),
                "device": p.device,
                "jax_backend": p.jax_backend,
                "gpu_ids": list(p.gpu_ids),
                "env": _shown_env(p.env),
            }
            for name, p in plan.groups.items()
        },
    }
