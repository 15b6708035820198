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
    return config


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
