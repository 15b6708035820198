"""The experiment config every project shares: its keys, defaults, checks and node groups.

A project's config file starts from `experiment_defaults()` and fills in `env` and `agent`
(which the project owns and checks). The toolkit's keys are declared once, as typed
dataclasses with a comment per field (`RunSettings` at the top level, `CheckpointSettings`,
`EvaluationSettings`, `LoggingSettings`, `DebugSettings`), and
`validate_experiment_config` checks a config against them, so a typo or a bad value fails
before any process starts with the key's full name and what would be accepted.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from typing import Any

import ml_collections
from ml_collections import config_dict

from magi_lp.config_schema import (
    allowed,
    check,
    check_keys,
    fact_refusal,
    fail_unless,
    in_range,
    is_int,
    typed_section,
)
from magi_lp.errors import ConfigError
from magi_lp.placement.actor_sizing import (
    AUTO,
    LEARNER_THREADS,
    ActingSite,
    actor_gpus,
    size_actors,
)
from magi_lp.placement.host_memory import NODE_RSS_GIB, node_counts
from magi_lp.placement.plan import GroupRequest
from magi_lp.placement.resources import ResourceSpec, resource_spec
from magi_lp.replay.stores import FRAME_STORES

NODE_GROUPS = ("replay", "counter", "learner", "actor", "evaluator", "coordinator")
"""The node groups of every program, in the order the plan and the dry run's table list them
(the program graph adds the counter first: `runtime/program.py`'s `build_program`)."""

ISOLATION_MODES = ("auto", "required", "off")

ACTOR_COUNT_KEYS = ("num_actors", "envs_per_actor")
"""The keys 'auto' sizes to the machine (`resolve_actor_counts`)."""
ACTOR_COUNT_WORDS = "'auto' (sized to the machine) or an integer >= 1"


DISTRIBUTED_COUNT_EVERY = 20
"""Loop steps a distributed actor or evaluator takes between two reports to the counter node
(and at every episode's end): a Courier call each. The program's `actor_steps` trail the
truth by fewer than this many steps per actor (times `envs_per_actor`), and a run stops within
that of `max_actor_steps`; one process counts every step (`ActingLoop(count_every=1)`). An
actor whose steps go in batches (on Ray) reports with each batch instead, far from the limit
(`runtime.nodes.far_from_limit`)."""


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The toolkit's top-level keys."""

    seed: int = 0  # every node's seed and key derive from it (magi_lp.runtime.seeding)
    max_actor_steps: int = 100_000  # agent steps summed over actors; the run stops there
    # Actor processes in the distributed program; 'auto': as many as the cores, the GPU memory
    # and the RAM the other nodes leave allow (magi_lp.placement.actor_sizing; one in main.py).
    num_actors: int | str = allowed(ACTOR_COUNT_WORDS, default=1)
    # Environments one actor steps, choosing their actions in one call; 'auto': 8 where its
    # policy runs on a GPU, else 1.
    envs_per_actor: int | str = allowed(ACTOR_COUNT_WORDS, default=1)
    num_evaluators: int = 1  # evaluator processes (0: no evaluation)
    variable_update_period: int = 100  # actor steps between non-blocking parameter pulls
    colocate_learner_and_replay: bool = False  # replay as a thread of the learner's process
    isolation: str = "auto"  # node RPC ports in a loopback-only namespace: auto/required/off

    def __post_init__(self) -> None:
        for key, minimum in (
            ("seed", 0),
            ("max_actor_steps", 1),
            ("num_evaluators", 0),
            ("variable_update_period", 1),
        ):
            in_range(self, key, minimum=minimum)
        for key in ACTOR_COUNT_KEYS:
            value = getattr(self, key)
            check(self, key, value == AUTO or (is_int(value) and value >= 1))
        check(
            self,
            "isolation",
            self.isolation in ISOLATION_MODES,
            " or ".join(repr(m) for m in ISOLATION_MODES),
        )


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """`config.checkpoint`: learner (and optionally replay) checkpoints in the workdir."""

    enabled: bool = True  # learner checkpoints under <workdir>/checkpoints/learner
    every_minutes: float = 10.0  # time between periodic learner checkpoints
    reverb: bool = False  # Reverb store: checkpoint the replay server at stop, restore on relaunch
    replay: bool = False  # device store: save it with each learner checkpoint, restore it too

    def __post_init__(self) -> None:
        in_range(self, "every_minutes", above=0)


REPLAY_STORES = ("auto", *FRAME_STORES)
"""`replay.store`: 'auto' (the plan chooses) or a store of `magi_lp.replay.stores`."""


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """`config.replay`: where the agent's replay lives (`magi_lp.replay.stores.resolve_store`).

    A pixel agent (its builder gives a `frame_replay` spec: DrQ-v2) gets the store `store`
    names. A state agent (TD3) keeps its own Reverb tables, except where its builder gives a
    `transition_replay` spec and Reverb is not the replay: in one process with `store`
    'device' (or 'auto' where Reverb is not installed), or on an engine without Reverb (Ray).
    Its transitions then live in host memory (`magi_lp.replay.transition_replay`).
    """

    # 'device': frames on the learner's device(s), sampled there; actors send each step once
    # through a step queue (Reverb's, or the served one on Ray). 'host': the same, but the
    # frames zstd-compressed in the learner's host memory (~5.5 KB a transition at 84x84),
    # sampled on its prefetch thread. 'reverb': the Reverb frame replay, sampled on the
    # learner's CPU (Launchpad only). 'auto': device where the learner's device has room for
    # it, else reverb where the engine carries Reverb (Launchpad), else host where the host's
    # memory has room (magi_lp.replay.stores.auto_frame_store).
    store: str = "auto"
    queue_steps: int = 500  # device/host store: steps in flight from actors to the learner
    # device/host store on Ray: an actor sends its k environments' steps in one call once this
    # many wait, or once the oldest waited send_secs, and near max_actor_steps at each report
    # of its counts (magi_lp.replay.step_queue.StepSender; SEND_STEPS and SEND_SECS there)
    send_steps: int = 256
    send_secs: float = 2.0

    def __post_init__(self) -> None:
        check(self, "store", self.store in REPLAY_STORES, " or ".join(map(repr, REPLAY_STORES)))
        in_range(self, "queue_steps", minimum=1)
        in_range(self, "send_steps", minimum=1)
        in_range(self, "send_secs", minimum=0)


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """`config.evaluation`: what evaluators do."""

    episodes: int = 5  # exploration-free episodes per evaluation
    every_actor_steps: int = 10_000  # actor steps between evaluations

    def __post_init__(self) -> None:
        for key in ("episodes", "every_actor_steps"):
            in_range(self, key, minimum=1)


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    """`config.logging`: where every node's log rows go (`magi_lp.runtime.loggers`)."""

    csv: bool = True  # <workdir>/logs/<label>/logs.csv
    tensorboard: bool = True  # <workdir>/tensorboard/<label>
    wandb: bool = False  # Weights & Biases (needs the wandb package and the network)
    wandb_project: str = ""  # W&B project ("": W&B's default / WANDB_PROJECT)
    terminal: bool = True  # one line per logger write on stdout
    # Seconds between rows a logger keeps (0: every row). Evaluators keep every row.
    time_delta: float = 1.0

    def __post_init__(self) -> None:
        # Said as `logging.time_delta` for the LoggerFactory made from this section too.
        fail_unless(
            math.isfinite(self.time_delta) and self.time_delta >= 0,
            "logging.time_delta",
            "a number of seconds >= 0",
            self.time_delta,
            "e.g. --config.logging.time_delta=1.0 (the default); 0 keeps every row",
        )


STOP_TIERS: dict[str, int] = {
    "actor": 0,
    "evaluator": 0,
    "learner": 1,
    "replay": 2,
    "counter": 2,
}
"""The order a program's nodes are told to stop (lower first), on one host (the local
launcher's stop stages) and on several (the stop board's tiers):

- actors and evaluators first: an actor blocks inside a replay insert once the rate
  limiter wants samples, so it stops while the learner still samples and serves parameters;
- then the learner, which saves its final checkpoint with the counts while the counter
  still answers (a replay in the learner's process stops with it: its only writers, the
  actors, are gone);
- then replay and counter.

The coordinator is the one node whose place depends on who runs the stop (`stop_tiers`).
"""


def stop_tiers(*, several_hosts: bool) -> dict[str, int]:
    """`STOP_TIERS` with the coordinator's tier.

    On several hosts the coordinator is the authority: it serves the stop board every other
    node polls, so it is told last (its board outlives the stop). On one host the launcher
    is the authority and the coordinator only polls the counter for the step limit, so it
    stops first: told last, it would sit in a call to the stopped counter until its own stop
    budget ran out (measured: a fourth stage of 1.1 s on `make run`'s program).
    """
    return {**STOP_TIERS, "coordinator": max(STOP_TIERS.values()) + 1 if several_hosts else 0}


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
    run = dataclasses.asdict(RunSettings())
    for key in ACTOR_COUNT_KEYS:
        # 'auto' or a number: untyped, so that `--config.num_actors=auto` and `=5` both parse
        # (5 as the int), and a config file may set either.
        run[key] = config_dict.FieldReference(run[key], field_type=object)
    config = ml_collections.ConfigDict(run)
    config.checkpoint = ml_collections.ConfigDict(dataclasses.asdict(CheckpointSettings()))
    config.replay = ml_collections.ConfigDict(dataclasses.asdict(ReplaySettings()))
    config.evaluation = ml_collections.ConfigDict(dataclasses.asdict(EvaluationSettings()))
    config.logging = ml_collections.ConfigDict(dataclasses.asdict(LoggingSettings()))
    config.debug = ml_collections.ConfigDict(dataclasses.asdict(DebugSettings()))
    config.resources = ml_collections.ConfigDict(
        {group: resource_spec(**DEFAULT_RESOURCES[group]) for group in NODE_GROUPS}
    )
    config.env = ml_collections.ConfigDict()
    config.agent = ml_collections.ConfigDict()
    return config


SECTIONS = ("checkpoint", "replay", "evaluation", "logging", "debug", "resources", "env", "agent")
"""The sections of every run's config (`experiment_defaults`): the toolkit's and the project's."""
# Optional: only a config for several hosts has it (magi_lp.cluster.config.hosts_defaults); the
# entry point checks it with the cluster's schema (magi_lp.cli), the core never reads it.
_OPTIONAL_SECTIONS = ("hosts",)


def validate_experiment_config(config: ml_collections.ConfigDict) -> RunSettings:
    """Checks every toolkit key; raises ConfigError naming the first bad one.

    Returns the top-level settings, typed. Resource specs are checked by the placement plan
    (`placement_requests`); `env` and `agent` by the project.
    """
    known = [f.name for f in dataclasses.fields(RunSettings)] + [*SECTIONS, *_OPTIONAL_SECTIONS]
    check_keys(config, "", known, required=SECTIONS)
    top = {key: config[key] for key in config if key not in (*SECTIONS, *_OPTIONAL_SECTIONS)}
    # Each refused value's line ends with its default as a flag, as the agents' sections do.
    settings = typed_section(RunSettings, top, "", suggest_defaults=True)
    typed_section(CheckpointSettings, config.checkpoint, "checkpoint.", suggest_defaults=True)
    typed_section(ReplaySettings, config.replay, "replay.", suggest_defaults=True)
    typed_section(EvaluationSettings, config.evaluation, "evaluation.", suggest_defaults=True)
    typed_section(LoggingSettings, config.logging, "logging.", suggest_defaults=True)
    typed_section(DebugSettings, config.debug, "debug.", suggest_defaults=True)
    check_keys(config.resources, "resources.", NODE_GROUPS)
    for group in NODE_GROUPS:
        if group not in config.resources:
            raise ConfigError(
                fact_refusal(
                    f"resources.{group} is missing",
                    "",
                    f"e.g. resources.{group} = magi_lp.placement.resource_spec(device='cpu')",
                )
            )
    return settings


def check_isolation_allows_logging(config: ml_collections.ConfigDict) -> None:
    """A distributed run isolated to loopback cannot reach Weights & Biases."""
    if config.logging.get("wandb", False) and config.isolation != "off":
        raise ConfigError(
            fact_refusal(
                "logging.wandb=True needs the network",
                f"isolation={config.isolation!r} runs the nodes in a loopback-only network "
                "namespace",
                "set isolation='off' (node RPC ports are then reachable from the network) or "
                "turn logging.wandb off",
            )
        )


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
    `num_actors` and `envs_per_actor` must be numbers here (`resolve_actor_counts`).
    """
    for key in ACTOR_COUNT_KEYS:
        if config[key] == AUTO:
            raise ConfigError(
                fact_refusal(
                    f"{key}='auto' is not sized here",
                    "lp_main.py sizes it to the one machine it launches on; a plan of several "
                    "hosts (or a program built without lp_main.py) needs the number",
                    f"give --config.{key}=<n>",
                )
            )
    requests = {
        group: GroupRequest(ResourceSpec.from_config(group, config.resources[group]), count)
        for group, count in node_counts(config).items()
        if count > 0
    }
    requests["learner"] = dataclasses.replace(
        requests["learner"], batch_size=learner_batch_size(config), batch_key=LEARNER_BATCH_KEY
    )
    # The environments each node steps (an evaluator steps one): where its spec renders
    # through EGL on a GPU, each holds a GL context there, which the memory check counts.
    for group, renders in (("actor", int(config.get("envs_per_actor", 1))), ("evaluator", 1)):
        if group in requests:
            requests[group] = dataclasses.replace(requests[group], renders=renders)
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


def busy_threads(config: ml_collections.ConfigDict) -> dict[str, int]:
    """The threads the nodes other than the actors keep busy, by group (the coordinator,
    asleep between its polls, takes none): each node's `cpu_threads`, 1 where its spec gives
    none, `LEARNER_THREADS` for a learner's (its update and its prefetch). A replay colocated
    with the learner is a thread of its process: it counts the same."""

    return {
        "learner": node_threads(config, "learner", LEARNER_THREADS),
        "replay": node_threads(config, "replay"),
        "evaluator": int(config.num_evaluators) * node_threads(config, "evaluator"),
        "counter": node_threads(config, "counter"),
    }


def node_threads(config: ml_collections.ConfigDict, group: str, default: int = 1) -> int:
    """The threads one node of `group` keeps busy: its spec's `cpu_threads`, else `default`."""
    return int(config.resources[group].get("cpu_threads") or default)


def resolve_actor_counts(
    config: ml_collections.ConfigDict,
    inventory: Any = None,
    *,
    cores: int | None = None,
    memory_gib: float | None = None,
    jax_build: Any = None,
) -> tuple[ml_collections.ConfigDict, str | None]:
    """`config` with `num_actors` and `envs_per_actor` as numbers, and the line that says
    how 'auto' became them (`magi_lp.placement.actor_sizing`); `config` itself and None where
    both are numbers already (the plan's memory check still refuses what does not fit).

    Args:
      config: a validated experiment config (not changed: the numbers go into a copy).
      inventory: the GPUs to size against; None reads this machine's (NVML).
      cores: the CPUs the run may use (default: this process's affinity mask).
      memory_gib: the machine's RAM (default: psutil's total).
      jax_build: what JAX serves (default: `detect_jax_build()`); tests inject their own.

    Raises:
      ConfigError: a given `num_actors` whose GPU memory does not fit, or a plan refused.
    """
    if not any(config[key] == AUTO for key in ACTOR_COUNT_KEYS):
        return config, None
    import psutil  # the launch decision only

    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.plan import make_plan

    inventory = inventory if inventory is not None else query_inventory()
    cores = cores or len(os.sched_getaffinity(0))
    memory_gib = memory_gib or psutil.virtual_memory().total / 2**30
    # A first plan with as many actors as it takes to see every GPU they would use.
    first = copy.deepcopy(config)
    spec = ResourceSpec.from_config("actor", config.resources.actor)
    spread = max(1, len(inventory)) if spec.gpu_distribution == "round_robin" else 1
    first.num_actors = spread if config.num_actors == AUTO else config.num_actors
    first.envs_per_actor = 1 if config.envs_per_actor == AUTO else config.envs_per_actor
    plan = make_plan(placement_requests(first), inventory, jax_build)
    counts = node_counts(first)
    others_rss = sum(NODE_RSS_GIB[g] * n for g, n in counts.items() if g != "actor")
    learner = plan.groups[plan.launch_group("learner", 0)]
    sizing = size_actors(
        config.num_actors,
        config.envs_per_actor,
        cores=cores,
        busy=busy_threads(config),
        site=ActingSite(
            threads=max(1, int(spec.cpu_threads or 1)),
            rss_bytes=int(NODE_RSS_GIB["actor"] * 2**30),
            gpus=actor_gpus(plan),
        ),
        memory_bytes=int(memory_gib * 2**30),
        others_rss_bytes=int(others_rss * 2**30),
        min_writers=learner.num_devices,
    )
    resolved = copy.deepcopy(config)
    resolved.num_actors = sizing.num_actors
    resolved.envs_per_actor = sizing.envs_per_actor
    return resolved, sizing.line


def single_process_counts(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` as main.py runs it: 'auto' is one actor of one environment (a copy; `config`
    itself where neither key is 'auto')."""
    if not any(config[key] == AUTO for key in ACTOR_COUNT_KEYS):
        return config
    resolved = copy.deepcopy(config)
    for key in ACTOR_COUNT_KEYS:
        if resolved[key] == AUTO:
            resolved[key] = 1
    return resolved


def capacity_warnings(
    config: ml_collections.ConfigDict,
    cores: int | None = None,
    memory_gib: float | None = None,
) -> list[str]:
    """Warnings for a program larger than this machine: threads past its cores, RAM past its
    memory. The run may still work (slower, or swapping), so these are warnings, not errors.
    The threads are those 'auto' sizes the actors by (`busy_threads`), plus the actors'.

    Args:
      config: a validated experiment config.
      cores: CPUs this process may use (default: its affinity mask).
      memory_gib: the machine's memory (default: psutil's total).
    """
    import psutil  # the dry run and the launch only

    cores = cores or len(os.sched_getaffinity(0))
    memory_gib = memory_gib or psutil.virtual_memory().total / 2**30
    counts = node_counts(config)
    warnings = []
    threads = {**busy_threads(config), "actor": counts["actor"] * node_threads(config, "actor")}
    if sum(threads.values()) > cores:
        listed = ", ".join(f"{group} {n}" for group, n in threads.items() if n)
        warnings.append(
            f"the busy nodes need {sum(threads.values())} threads ({listed}) but this machine "
            f"has {cores} cores: they will share them and each runs slower; lower num_actors "
            "or resources.<group>.cpu_threads"
        )
    rss = sum(NODE_RSS_GIB[group] * count for group, count in counts.items())
    if rss > memory_gib:
        warnings.append(
            f"{sum(counts.values())} nodes need about {rss:.1f} GiB of RAM after start-up "
            f"(before replay data) but this machine has {memory_gib:.1f} GiB; lower num_actors"
        )
    return warnings
