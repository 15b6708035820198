"""The experiment-level config every project shares, and its validation.

A project's config file starts from `experiment_defaults()` and fills in `env` and `agent`;
`validate_experiment_config` then checks every key the toolkit reads, so a typo or a bad value
fails before any process starts, with the key's full name and what would be accepted.
"""

from __future__ import annotations

import difflib
from typing import Any

import ml_collections

from magi_lp.errors import ConfigError

NODE_GROUPS = ("replay", "counter", "learner", "actor", "evaluator", "coordinator")

# Keys the toolkit reads; agent projects own `env` and `agent`.
_TOP_LEVEL = {
    "seed",
    "max_actor_steps",
    "num_actors",
    "num_evaluators",
    "variable_update_period",
    "colocate_learner_and_replay",
    "isolation",
    "checkpoint",
    "evaluation",
    "logging",
    "resources",
    "env",
    "agent",
}


def _cpu_node(threads: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"device": "cpu"}
    if threads is not None:
        spec["cpu_threads"] = threads
    return spec


def experiment_defaults() -> ml_collections.ConfigDict:
    """Defaults for every toolkit key; projects override what they need."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    # Agent steps summed over all actors; the coordinator stops the program there.
    config.max_actor_steps = 100_000
    config.num_actors = 1
    config.num_evaluators = 1
    # Actor steps between two (non-blocking) parameter pulls from the learner.
    config.variable_update_period = 100
    # Run replay as a thread of the learner's process (saves a process and a copy per batch).
    config.colocate_learner_and_replay = False
    # Network isolation of node RPC ports: auto (isolate when possible), required, off.
    config.isolation = "auto"
    config.checkpoint = ml_collections.ConfigDict(
        {"enabled": True, "every_minutes": 10.0, "reverb": False}
    )
    config.evaluation = ml_collections.ConfigDict({"episodes": 5, "every_actor_steps": 10_000})
    config.logging = ml_collections.ConfigDict(
        {
            "csv": True,
            "tensorboard": True,
            "wandb": False,
            "wandb_project": "",
            "terminal": True,
            "time_delta": 1.0,
        }
    )
    config.resources = ml_collections.ConfigDict(
        {
            "replay": _cpu_node(),
            "counter": _cpu_node(1),
            "learner": _cpu_node(),
            "actor": _cpu_node(1),
            "evaluator": _cpu_node(1),
            "coordinator": _cpu_node(1),
        }
    )
    return config


def _unknown(prefix: str, key: str, known: set[str] | tuple[str, ...]) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" Did you mean {prefix}{close[0]}?" if close else ""
    return ConfigError(
        f"{prefix}{key} is not a known config key.{hint} Known: {', '.join(sorted(known))}."
    )


def _int_at_least(config: Any, key: str, minimum: int) -> None:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}.")


def _section(config: Any, name: str, keys: dict[str, type | tuple[type, ...]]) -> None:
    section = config[name]
    for key in section:
        if key not in keys:
            raise _unknown(f"{name}.", key, set(keys))
    for key, types in keys.items():
        if key not in section:
            raise ConfigError(f"{name}.{key} is missing; start from experiment_defaults().")
        value = section[key]
        if not isinstance(value, types) or (
            isinstance(value, bool) and bool not in _as_tuple(types)
        ):
            raise ConfigError(f"{name}.{key} has the wrong type: got {value!r}.")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def validate_experiment_config(config: ml_collections.ConfigDict) -> None:
    """Checks every toolkit key; raises ConfigError naming the first bad one."""
    for key in config:
        if key not in _TOP_LEVEL:
            raise _unknown("", key, _TOP_LEVEL)
    for key in _TOP_LEVEL:
        if key not in config:
            raise ConfigError(f"{key} is missing; start from magi_lp.experiment_defaults().")
    _int_at_least(config, "seed", 0)
    _int_at_least(config, "max_actor_steps", 1)
    _int_at_least(config, "num_actors", 1)
    _int_at_least(config, "num_evaluators", 0)
    _int_at_least(config, "variable_update_period", 1)
    if not isinstance(config.colocate_learner_and_replay, bool):
        raise ConfigError("colocate_learner_and_replay must be True or False.")
    if config.isolation not in ("auto", "required", "off"):
        raise ConfigError(
            f"isolation must be 'auto', 'required' or 'off', got {config.isolation!r}."
        )
    _section(config, "checkpoint", {"enabled": bool, "every_minutes": (int, float), "reverb": bool})
    if config.checkpoint.every_minutes <= 0:
        raise ConfigError("checkpoint.every_minutes must be > 0.")
    _section(config, "evaluation", {"episodes": int, "every_actor_steps": int})
    if config.evaluation.episodes < 1 or config.evaluation.every_actor_steps < 1:
        raise ConfigError("evaluation.episodes and evaluation.every_actor_steps must be >= 1.")
    for group in config.resources:
        if group not in NODE_GROUPS:
            raise _unknown("resources.", group, NODE_GROUPS)
    for group in NODE_GROUPS:
        if group not in config.resources:
            raise ConfigError(f"resources.{group} is missing; e.g. {{'device': 'cpu'}}.")


def check_isolation_allows_logging(config: ml_collections.ConfigDict) -> None:
    """A distributed run isolated to loopback cannot reach Weights & Biases."""
    if config.logging.get("wandb", False) and config.isolation != "off":
        raise ConfigError(
            f"logging.wandb=True needs the network, but isolation={config.isolation!r} runs the "
            "nodes in a loopback-only network namespace; set isolation='off' (node RPC ports are "
            "then reachable from the network) or turn logging.wandb off."
        )
