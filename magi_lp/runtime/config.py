"""The experiment config every project shares: its keys, defaults, checks and node groups.

A project's config file starts from `experiment_defaults()` and fills in `env` and `agent`
(which the project owns and checks). The toolkit's keys are declared once, as typed
dataclasses with a comment per field (`RunSettings` at the top level, `CheckpointSettings`,
`EvaluationSettings`, `LoggingSettings`, `DebugSettings`), and
`validate_experiment_config` checks a config against them, so a typo or a bad value fails
before any process starts with the key's full name and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from magi_lp.errors import ConfigError
from magi_lp.placement.plan import GroupRequest
from magi_lp.placement.resources import ResourceSpec, resource_spec

NODE_GROUPS = ("replay", "counter", "learner", "actor", "evaluator", "coordinator")
"""The node groups of every program, in the order the program graph adds them."""

ISOLATION_MODES = ("auto", "required", "off")


def _fail_unless(ok: bool, key: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The toolkit's top-level keys."""

    seed: int = 0  # every node's seed and key derive from it (magi_lp.runtime.seeding)
    max_actor_steps: int = 100_000  # agent steps summed over actors; the run stops there
    num_actors: int = 1  # actor processes in the distributed program
    envs_per_actor: int = 1  # environments one actor steps, choosing their actions in one call
    num_evaluators: int = 1  # evaluator processes (0: no evaluation)
    variable_update_period: int = 100  # actor steps between non-blocking parameter pulls
    colocate_learner_and_replay: bool = False  # replay as a thread of the learner's process
    isolation: str = "auto"  # node RPC ports in a loopback-only namespace: auto/required/off

    def __post_init__(self) -> None:
        _fail_unless(self.seed >= 0, "seed", "an integer >= 0", self.seed)
        for key, minimum in (
            ("max_actor_steps", 1),
            ("num_actors", 1),
            ("envs_per_actor", 1),
            ("num_evaluators", 0),
            ("variable_update_period", 1),
        ):
            value = getattr(self, key)
            _fail_unless(value >= minimum, key, f"an integer >= {minimum}", value)
        _fail_unless(
            self.isolation in ISOLATION_MODES,
            "isolation",
            " or ".join(repr(m) for m in ISOLATION_MODES),
            self.isolation,
        )


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """`config.checkpoint`: learner (and optionally replay) checkpoints in the workdir."""

    enabled: bool = True  # learner checkpoints under <workdir>/checkpoints/learner
    every_minutes: float = 10.0  # time between periodic learner checkpoints
    reverb: bool = False  # also checkpoint the replay at stop, and restore it on relaunch

    def __post_init__(self) -> None:
        _fail_unless(self.every_minutes > 0, "checkpoint.every_minutes", "> 0", self.every_minutes)


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """`config.evaluation`: what evaluators do."""

    episodes: int = 5  # exploration-free episodes per evaluation
    every_actor_steps: int = 10_000  # actor steps between evaluations

    def __post_init__(self) -> None:
        for key in ("episodes", "every_actor_steps"):
            value = getattr(self, key)
            _fail_unless(value >= 1, f"evaluation.{key}", "an integer >= 1", value)


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    """`config.logging`: where every node's log rows go (`magi_lp.runtime.loggers`)."""

    csv: bool = True  # <workdir>/logs/<label>/logs.csv
    tensorboard: bool = True  # <workdir>/tensorboard/<label>
    wandb: bool = False  # Weights & Biases (needs the wandb package and the network)
    wandb_project: str = ""  # W&B project ("": W&B's default / WANDB_PROJECT)
    terminal: bool = True  # one line per logger write on stdout
    time_delta: float = 1.0  # seconds between rows a logger keeps (0: every row)

    def __post_init__(self) -> None:
        _fail_unless(self.time_delta >= 0, "logging.time_delta", ">= 0 seconds", self.time_delta)


@dataclasses.dataclass(frozen=True)
class DebugSettings:
    """`config.debug`: checks that cost time, for finding mistakes (all off by default)."""

    # Every policy call and learner update checks that its inputs and outputs live on the
    # node's declared devices (magi_lp.agent.device_check); a mismatch stops the node with
    # one line naming the node, the array and both devices.
    check_devices: bool = False


# Where each node group runs unless the config says otherwise: everything on the CPU, one
# thread for the small nodes, no rendering except where environments live.
DEFAULT_RESOURCES: dict[str, dict[str, Any]] = {
    "replay": {"device": "cpu", "render": "none"},
    "counter": {"device": "cpu", "render": "none", "cpu_threads": 1},
    "learner": {"device": "cpu", "render": "none"},
    "actor": {"device": "cpu", "render": "egl", "cpu_threads": 1},
    "evaluator": {"device": "cpu", "render": "egl", "cpu_threads": 1},
    "coordinator": {"device": "cpu", "render": "none", "cpu_threads": 1},
}


def experiment_defaults() -> ml_collections.ConfigDict:
    """Every toolkit key with its default; projects add `env` and `agent`.

    Every resource spec lists every `ResourceSpec` field (see `resource_spec`), so any
    resource key of any group can be overridden on the command line.
    """
    config = ml_collections.ConfigDict(dataclasses.asdict(RunSettings()))
    config.checkpoint = ml_collections.ConfigDict(dataclasses.asdict(CheckpointSettings()))
    config.evaluation = ml_collections.ConfigDict(dataclasses.asdict(EvaluationSettings()))
    config.logging = ml_collections.ConfigDict(dataclasses.asdict(LoggingSettings()))
    config.debug = ml_collections.ConfigDict(dataclasses.asdict(DebugSettings()))
    config.resources = ml_collections.ConfigDict(
        {group: resource_spec(**DEFAULT_RESOURCES[group]) for group in NODE_GROUPS}
    )
    config.env = ml_collections.ConfigDict()
    config.agent = ml_collections.ConfigDict()
    return config


_SECTIONS = ("checkpoint", "evaluation", "logging", "debug", "resources", "env", "agent")


def _unknown(prefix: str, key: str, known: Iterable[str]) -> ConfigError:
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" Did you mean {prefix}{close[0]}?" if close else ""
    return ConfigError(f"{prefix}{key} is not a known config key.{hint} Known: {', '.join(known)}.")


def _type_ok(value: Any, annotation: Any) -> bool:
    if annotation is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # True is an int to Python, never to a config
    if annotation is int:
        return isinstance(value, int)
    if annotation is float:
        return isinstance(value, (int, float))
    if annotation is str:
        return isinstance(value, str)
    return any(_type_ok(value, arg) for arg in typing.get_args(annotation)) or (
        value is None and type(None) in typing.get_args(annotation)
    )


_TYPE_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


def _describe(annotation: Any) -> str:
    if annotation in _TYPE_WORDS:
        return _TYPE_WORDS[annotation]
    words = [_TYPE_WORDS.get(arg, "None") for arg in typing.get_args(annotation)]
    return " or ".join(words) or str(annotation)


def typed_section(
    cls: type, values: Mapping[str, Any], prefix: str, *, fixed: Mapping[str, Any] | None = None
) -> Any:
    """`cls(**values)`, refusing unknown or missing keys and wrong types by their full name.

    Args:
      cls: a dataclass whose fields are the section's keys (bool, int, float, str or
        unions of them); its `__post_init__` checks ranges.
      values: the section (dict or ConfigDict).
      prefix: the section's path with a trailing dot ("checkpoint."), "" at the top level.
      fixed: constructor arguments that are not config keys (e.g. a workdir).
    """
    fixed = dict(fixed or {})
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in fixed]
    for key in values:
        if key not in names:
            raise _unknown(prefix, key, names)
    kwargs = {}
    for name in names:
        if name not in values:
            raise ConfigError(
                f"{prefix}{name} is missing; start from "
                "magi_lp.runtime.config.experiment_defaults()."
            )
        value = values[name]
        if not _type_ok(value, hints[name]):
            raise ConfigError(f"{prefix}{name} must be {_describe(hints[name])}, got {value!r}.")
        kwargs[name] = value
    return cls(**kwargs, **fixed)


def validate_experiment_config(config: ml_collections.ConfigDict) -> RunSettings:
    """Checks every toolkit key; raises ConfigError naming the first bad one.

    Returns the top-level settings, typed. Resource specs are checked by the placement plan
    (`placement_requests`); `env` and `agent` by the project.
    """
    known = {f.name for f in dataclasses.fields(RunSettings)} | set(_SECTIONS)
    for key in config:
        if key not in known:
            raise _unknown("", key, known)
    for section in _SECTIONS:
        if section not in config:
            raise ConfigError(
                f"{section} is missing; start from magi_lp.runtime.config.experiment_defaults()."
            )
    top = {key: config[key] for key in config if key not in _SECTIONS}
    settings = typed_section(RunSettings, top, "")
    typed_section(CheckpointSettings, config.checkpoint, "checkpoint.")
    typed_section(EvaluationSettings, config.evaluation, "evaluation.")
    typed_section(LoggingSettings, config.logging, "logging.")
    typed_section(DebugSettings, config.debug, "debug.")
    for group in config.resources:
        if group not in NODE_GROUPS:
            raise _unknown("resources.", group, NODE_GROUPS)
    for group in NODE_GROUPS:
        if group not in config.resources:
            raise ConfigError(
                f"resources.{group} is missing; e.g. "
                f"resources.{group} = magi_lp.placement.resource_spec(device='cpu')."
            )
    return settings


def check_isolation_allows_logging(config: ml_collections.ConfigDict) -> None:
    """A distributed run isolated to loopback cannot reach Weights & Biases."""
    if config.logging.get("wandb", False) and config.isolation != "off":
        raise ConfigError(
            f"logging.wandb=True needs the network, but isolation={config.isolation!r} runs "
            "the nodes in a loopback-only network namespace; set isolation='off' (node RPC ports "
            "are then reachable from the network) or turn logging.wandb off."
        )


def node_counts(config: ml_collections.ConfigDict) -> dict[str, int]:
    """How many nodes each node group of the program has, in program order."""
    return {
        "replay": 1,
        "counter": 1,
        "learner": 1,
        "actor": int(config.num_actors),
        "evaluator": int(config.num_evaluators),
        "coordinator": 1,
    }


LEARNER_BATCH_KEY = "agent.batch_size"
"""Where an agent config gives the learner's batch. The learner's update is data-parallel over
all of its devices, so the plan refuses a device count that does not divide this batch
(`placement_requests`); an agent without the key is checked at its first batch instead."""


def learner_batch_size(config: ml_collections.ConfigDict) -> int | None:
    """The learner's batch as the agent config gives it (`agent.batch_size`), or None."""
    value = config.get("agent", {}).get("batch_size", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def placement_requests(config: ml_collections.ConfigDict) -> dict[str, GroupRequest]:
    """What the placement plan must place: each group with nodes, its spec and its count.

    A replay colocated with the learner runs in the learner's process under its spec. The
    learner's request carries the batch its devices must divide (`learner_batch_size`).
    """
    requests = {
        group: GroupRequest(ResourceSpec.from_config(group, config.resources[group]), count)
        for group, count in node_counts(config).items()
        if count > 0
    }
    requests["learner"] = dataclasses.replace(
        requests["learner"], batch_size=learner_batch_size(config), batch_key=LEARNER_BATCH_KEY
    )
    if config.colocate_learner_and_replay:
        requests.pop("replay")
    return requests


def make_placement_plan(config: ml_collections.ConfigDict, inventory: Any = None) -> Any:
    """The validated placement plan of the program `config` describes.

    Args:
      config: a validated experiment config.
      inventory: the GPUs to plan against; None reads this machine's (NVML).
    """
    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.plan import make_plan

    return make_plan(
        placement_requests(config), inventory if inventory is not None else query_inventory()
    )
