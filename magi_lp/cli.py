"""What every entry point shares: flags, config checks, the plan, and the two ways to run.

A project's `lp_main.py` / `main.py` only supplies `make_experiment(config) -> Experiment`
(or `make_experiment(config, workdir=...)` when it writes files of its own, e.g. videos)
and its config checks (`validate_config`, run once, before anything heavy is imported), and
calls `distributed_main` / `single_process_main`. Flags:
  --config path/to/config.py   (ml_collections config file; --config.<key>=value overrides)
  --workdir DIR                 (logs, checkpoints, node outputs; reused to resume)
  --dry_run                     (lp_main only: print the placement plan and exit)
  --launcher local|ray|hosts|slurm|kubernetes  (lp_main only: the engine, magi_lp.engines;
                                default local where Launchpad is installed, else ray)
  --render DIR                  (lp_main only: several hosts, magi_lp.cluster, docs/cluster.md)

Heavy libraries (TensorFlow, JAX, Launchpad, Reverb) are imported only after the config has
been read, checked and planned, so bad input fails in well under a second, and so that the
network-isolation re-exec happens before any of them start threads.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import importlib.util
import inspect
import math
import os
import re
import shlex
import signal
import sys
import sysconfig
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import ml_collections
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from magi_lp import console, engines
from magi_lp.config_schema import did_you_mean, fact_refusal, flag_value, override_refusal
from magi_lp.errors import ConfigError
from magi_lp.launch import interrupts, run_folders
from magi_lp.launch.node_lifetime import quiet_gym_notice
from magi_lp.placement.jax_build import (
    COMPILATION_CACHE_VAR,
    JaxBuild,
    client_allocators,
    compilation_cache_warning,
    detect_jax_build,
    jaxlib_0_11_or_later,
)
from magi_lp.placement.xla_flags import check_xla_flags
from magi_lp.replay.plan import plan_replay_store
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.config import (
    SECTIONS,
    capacity_warnings,
    check_isolation_allows_logging,
    make_placement_plan,
    validate_experiment_config,
)
from magi_lp.runtime.memory_reckoning import size_gpu_memory
from magi_lp.runtime.workdir import Workdir

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (ml_collections).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run folder: logs, checkpoints, node outputs. Reuse it to resume a run."
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the placement plan (node, devices, memory, env) and exit."
)
_LAUNCHER = flags.DEFINE_enum(
    "launcher",
    None,
    list(engines.ENGINES),
    "The engine that runs the nodes (lp_main only; default: local where Launchpad is "
    "installed, else ray): "
    + "; ".join(f"{e.name}: {e.summary}" for e in engines.ENGINES.values())
    + " (docs/cluster.md).",
)
_RENDER = flags.DEFINE_string(
    "render", None, "With --launcher hosts|slurm|kubernetes: write the generated files here."
)

_STATUS_EVERY = flags.DEFINE_float(
    "status_every",
    30.0,
    "Seconds between status lines when the output is not a terminal (lp_main only); on a "
    "terminal the status table refreshes every few seconds.",
)

flags.register_validator(
    "status_every",
    lambda seconds: math.isfinite(seconds) and seconds > 0,
    message="must be a number of seconds > 0; e.g. --status_every=30 (the default)",
)

MakeExperiment = Callable[..., Any]
ValidateConfig = Callable[[Any], None]


_FACTORY_CALLS = (
    ("environment_factory", "environment_factory(seed, evaluation)", (0, False)),
    ("network_factory", "network_factory(environment_spec)", (None,)),
)
"""How the toolkit calls an `Experiment`'s factories (`magi_lp.runtime.experiment`)."""


def _make(make_experiment: MakeExperiment, config: Any, workdir: Path) -> Any:
    """Calls `make_experiment(config)`, passing `workdir=` when the project's function takes
    it; refuses what is not an `Experiment` of the whole config (a new project's slip, which
    otherwise failed later as `'NoneType' object has no attribute 'builder'`, or as a
    `KeyError: 'checkpoint'` three tracebacks deep)."""
    from magi_lp.agent.builder import AgentBuilder
    from magi_lp.runtime.experiment import Experiment

    if "workdir" in inspect.signature(make_experiment).parameters:
        experiment = make_experiment(config, workdir=str(workdir))
    else:
        experiment = make_experiment(config)
    name = getattr(make_experiment, "__qualname__", None)  # a partial or callable has none
    module = getattr(make_experiment, "__module__", None)
    where = f"{module}.{name}" if name and module else repr(make_experiment)
    if not isinstance(experiment, Experiment):
        raise ConfigError(
            fact_refusal(
                f"{where} returned {type(experiment).__name__}",
                "the toolkit runs a magi_lp.runtime.experiment.Experiment",
                "return Experiment(builder=..., environment_factory=..., network_factory=..., "
                "config=config), as projects/td3/experiment.py does",
            )
        )
    if not isinstance(experiment.builder, AgentBuilder):
        raise ConfigError(
            fact_refusal(
                f"{where}: Experiment.builder is a {type(experiment.builder).__name__}",
                "the toolkit drives a magi_lp.agent.builder.AgentBuilder",
                "make the builder a subclass of AgentBuilder",
            )
        )
    for name, call, args in _FACTORY_CALLS:
        try:
            inspect.signature(getattr(experiment, name)).bind(*args)
        except ValueError:  # no signature to read (a builtin): its first call will tell
            continue
        except TypeError as error:
            raise ConfigError(
                fact_refusal(
                    f"{where}: Experiment.{name} cannot be called as {call} ({error})",
                    "the toolkit calls it so in every node",
                    "take exactly those arguments (functools.partial binds the others, as "
                    "projects/td3/experiment.py does)",
                )
            ) from None
    missing = [name for name in SECTIONS if name not in experiment.config]
    if missing:
        raise ConfigError(
            fact_refusal(
                f"{where}: Experiment.config has no {', '.join(missing)}",
                "it is the run's whole config, the toolkit's sections and the project's",
                "pass the config make_experiment was given (config=config), not a section",
            )
        )
    return experiment


def _cluster() -> Any:
    """The multi-host package: the one place the toolkit imports it (the core never does, by
    the layers contract in pyproject.toml), and only for a config with a `hosts` section or a
    `--launcher` other than local."""
    from magi_lp import cluster
    from magi_lp.cluster import config, main  # noqa: F401  (loads cluster.config, cluster.main)

    return cluster


def _fail(message: str) -> NoReturn:
    console.error(message)
    sys.exit(2)


def _checked_inputs(
    default_workdir_name: str, validate_config: ValidateConfig | None
) -> tuple[Any, Path]:
    """The config (every key checked, the project's own included) and the workdir path.

    The toolkit's keys first, then the project's (`validate_config`, its one run): all before
    anything heavy is imported. Nothing is created here: a refused run leaves no workdir
    behind (`_make_workdir`).
    """
    path = _config_path()
    if not path:
        raise ConfigError(
            fact_refusal("--config is required", "", f"e.g. --config {_example_config()}")
        )
    file = Path(path.split(":", 1)[0])
    if file.is_dir():
        raise ConfigError(
            fact_refusal(
                f"--config {path}", "a folder, not a file", "e.g. --config configs/<name>.py"
            )
        )
    if not file.is_file():
        # A misspelt name in a folder that exists: the closest file name there.
        siblings = [p.name for p in file.parent.glob("*.py")]
        prefix = "" if str(file.parent) == "." else f"{file.parent}/"
        close = did_you_mean(file.name, siblings, prefix=prefix, otherwise="")
        raise ConfigError(
            fact_refusal(f"--config {path}", "no such file", close or "pick one from configs/")
        )
    try:
        config = _CONFIG.value
        _require_a_config(path, config)
        validate_experiment_config(config)
        if "hosts" in config:
            _cluster().config.validate_hosts_config(config)
    except OSError as error:
        cause = error.__cause__ or " ".join(str(error).split())
        raise ConfigError(
            fact_refusal(
                f"--config {path}: cannot load the config file",
                str(cause),
                "fix the file, or pick one from configs/",
            )
        ) from None
    _check_mujoco_gl(os.environ.get("MUJOCO_GL"))  # before a project's checks import dm_control
    if validate_config is not None:
        validate_config(config)
    else:
        own = [f"{section}.{key}" for section in ("agent", "env") for key in config[section]]
        if own:  # a misspelt key of its own would be taken without a word
            console.say(
                f"warning: this entry point passes no validate_config: the project's own keys "
                f"({len(own)}: {', '.join(own[:3])}{', ...' if len(own) > 3 else ''}) are not "
                "checked; pass validate_config= to distributed_main / single_process_main "
                "(projects/td3/lp_main.py does)"
            )
    if _WORKDIR.value is not None and not _WORKDIR.value.strip():
        raise ConfigError(
            fact_refusal("--workdir is empty", "", f"name a folder, or leave it out ({_RUNS})")
        )
    workdir = Path(_WORKDIR.value or Path("runs") / default_workdir_name).absolute()
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(
            fact_refusal(
                f"--workdir {workdir}", "it exists and is not a folder", "pick another path"
            )
        )
    return config, workdir


_RUNS = "runs/<config name> is the default"

_MUJOCO_GL_NAMES = ("egl", "osmesa", "glfw", "on", "enable", "enabled", "true", "1", "", "off",
                    "disable", "disabled", "false", "0")  # fmt: skip
"""What dm_control takes as MUJOCO_GL (dm_control/_render/constants.py); anything else makes
its import raise, in the project's checks or in every node."""


def _check_mujoco_gl(value: str | None) -> None:
    if value is None or value in _MUJOCO_GL_NAMES:
        return
    raise ConfigError(
        fact_refusal(
            f"MUJOCO_GL={value!r} (in the environment)",
            "not a MuJoCo rendering backend",
            "use egl, osmesa or glfw, in lower case, or unset it (each node's is set from "
            "resources.<group>.render; main.py uses egl)",
        )
    )


def _check_jax_platforms(env: Mapping[str, str]) -> None:
    """Refuses, before anything starts, a JAX_PLATFORMS in main.py's environment that JAX
    cannot start here (lp_main.py sets each node's own from its plan)."""
    value = env.get("JAX_PLATFORMS", "")
    platforms = [p.strip() for p in value.split(",") if p.strip()]
    if not platforms or platforms[0] == "cpu":
        return
    fix = "unset it (JAX then uses CUDA where it can, else the CPU), or set JAX_PLATFORMS=cpu"
    unknown = [p for p in platforms if p not in ("cuda", "gpu", "cpu")]
    if unknown:
        lower = [p.lower() for p in unknown if p.lower() in ("cuda", "gpu", "cpu")]
        raise ConfigError(
            fact_refusal(
                f"JAX_PLATFORMS={value} (in the environment)",
                "magi_lp runs JAX on cuda or cpu",
                f"did you mean {lower[0]!r}? (lower case)" if lower else fix,
            )
        )
    from magi_lp.placement.gpu_inventory import query_inventory

    build = detect_jax_build()
    if "cpu" in platforms and jaxlib_0_11_or_later(build):
        return  # jax 0.11 skips a CUDA it cannot start and takes the CPU (0.4.30 raised)
    if not build.serves_cuda:
        why = f"JAX in this Python is CPU only ({build.describe()})"
    else:
        inventory = query_inventory()
        if inventory.gpus:
            return
        why = f"no NVIDIA GPU here ({inventory.reason or 'NVML lists none'})"
    raise ConfigError(fact_refusal(f"JAX_PLATFORMS={value} (in the environment)", why, fix))


_NO_GPU_VALUES = ("-1", "NoDevFiles")
"""CUDA_VISIBLE_DEVICES values that hide every GPU on purpose (SLURM sets NoDevFiles)."""


def _check_jax_memory_env(env: Mapping[str, str], build: JaxBuild) -> None:
    """Refuses, before anything starts, GPU settings in main.py's environment that are never
    right and that a CPU JAX takes without a word (lp_main.py sets each node's own from its
    plan): a memory fraction that is no positive number (above 1 is for unified memory), an
    allocator this jaxlib does not know, a CUDA_VISIBLE_DEVICES entry that is no GPU index
    or UUID (CUDA hides every GPU from the first such entry on)."""
    fix = "unset it (lp_main.py sets each node's from resources.<group>)"
    for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):
        value = env.get(name, "")
        if not value:
            continue  # jaxlib treats "" as unset
        try:
            fraction = float(value)
        except ValueError:
            fraction = math.nan
        if not (math.isfinite(fraction) and fraction > 0):
            raise ConfigError(
                fact_refusal(
                    f"{name}={value} (in the environment)",
                    "JAX takes a positive fraction of each GPU's memory",
                    f"give one such as 0.5, or {fix}",
                )
            )
    if (
        jaxlib_0_11_or_later(build)
        and env.get("XLA_CLIENT_MEM_FRACTION")
        and env.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    ):
        raise ConfigError(
            fact_refusal(
                "XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION (in the environment)",
                "this jaxlib reads the first and stops at the GPU's start when its deprecated "
                "second name is set too",
                "unset XLA_PYTHON_CLIENT_MEM_FRACTION",
            )
        )
    if "XLA_PYTHON_CLIENT_ALLOCATOR" in env:
        allocator = env["XLA_PYTHON_CLIENT_ALLOCATOR"]
        known = client_allocators(build)
        if allocator.lower() not in known:
            raise ConfigError(
                fact_refusal(
                    f"XLA_PYTHON_CLIENT_ALLOCATOR={allocator!r} (in the environment)",
                    f"this jaxlib takes {', '.join(known)}",
                    f"pick one, or {fix}",
                )
            )
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    if visible and visible.strip() not in _NO_GPU_VALUES:
        tokens = [token.strip() for token in visible.split(",")]
        # -1 ends the list on purpose (0,-1: GPU 0 only).
        bad = [
            t for t in tokens if not (t.isdigit() or t == "-1" or t.startswith(("GPU-", "MIG-")))
        ]
        if bad:
            raise ConfigError(
                fact_refusal(
                    f"CUDA_VISIBLE_DEVICES={visible} (in the environment)",
                    f"{bad[0]!r} is no GPU index or UUID, and CUDA hides every GPU from the "
                    "first such entry on",
                    "use CUDA's device indices (0,1), UUIDs (GPU-..., as `nvidia-smi -L` "
                    "lists them), or an empty value for no GPU",
                )
            )


def _check_workdir_can_be_made(workdir: Path, flag: str = "--workdir") -> None:
    """Refuses, before anything starts, a folder this run writes on this machine (its
    workdir, or `--render`'s) that would be under a file or in a folder this user cannot
    write (it is made only once the run is about to start). Not for a dry run, nor for the
    workdir of files rendered for other machines: they write it, or nothing does."""
    existing = next(folder for folder in (workdir, *workdir.parents) if folder.exists())
    if not existing.is_dir():
        facts = f"{existing} is a file, not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):  # a read-only mount refuses root too
        facts = f"{existing} is not writable by this user"
    elif existing == Path("/proc") or Path("/proc") in existing.parents:
        facts = "/proc holds no folders of ours"  # root may 'write' it; mkdir fails there
    else:
        return
    what = "cannot be written" if existing == workdir else "cannot be created"
    raise ConfigError(
        fact_refusal(f"{flag} {workdir} {what}", facts, "pick a path you can write to")
    )


def _check_isolation_elsewhere(config: Any, where: str) -> None:
    """Refuses `isolation='required'` for nodes that run on other machines: this machine's
    private network namespace cannot hold them, and the run would go on unisolated."""
    if config.isolation != "required":
        return
    raise ConfigError(
        fact_refusal(
            f"isolation='required' with {where}",
            "the nodes run on other machines, which no network namespace here can isolate; "
            "their network's rules apply (docs/cluster.md)",
            "--config.isolation=auto (or 'off'), or run on this machine alone",
        )
    )


def _check_render(render: str | None) -> None:
    """Refuses a `--render` that writes nothing, or cannot: empty, beside --dry_run (which
    prints the files instead), or a folder this user cannot make."""
    if render is None:
        return
    if not render.strip():
        raise ConfigError(
            fact_refusal("--render is empty", "", "name the folder to write the files to")
        )
    if _DRY_RUN.value:
        raise ConfigError(
            fact_refusal(
                "--render with --dry_run",
                "the dry run prints the files and writes nothing",
                "give one of the two",
            )
        )
    _check_workdir_can_be_made(Path(render).absolute(), "--render")


def _require_a_config(spec: str, config: Any) -> None:
    """Refuses what a config file's get_config() returned unless it is a ConfigDict (None:
    a forgotten return)."""
    if not isinstance(config, ml_collections.ConfigDict):
        # ml_collections hands a file that failed with an OSError over as a placeholder that
        # raises it when touched: let it, so that it is said as the OSError it is.
        hasattr(config, "keys")
        raise ConfigError(
            fact_refusal(
                f"--config {spec}: get_config() returned {type(config).__name__}",
                "",
                "return an ml_collections.ConfigDict, as the files in configs/ do",
            )
        )


_STARTED_IN: list[Path] = []
"""The workdir, once the run is handed to its runner or engine (`_run_starts`): a Ctrl-C
that reaches the top after that is not one "before the run started"."""


def _run_starts(workdir: Path) -> None:
    _STARTED_IN[:] = [workdir]


def _make_workdir(workdir: Path, *, lock: bool = True) -> None:
    """Makes the workdir and (`lock`) takes it for this launch (`workdir_lock`): a second
    launch of the same workdir while this one runs is refused in one line."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            fact_refusal(
                f"--workdir {workdir} cannot be created",
                str(error.strerror),
                "pick a path you can write to",
            )
        ) from None
    if lock:
        from magi_lp.launch import workdir_lock

        unguarded = workdir_lock.hold(Workdir(workdir).lock, workdir, shlex.join(sys.argv))
        if unguarded:
            console.say(f"warning: {unguarded}")


def _check_workdir_free(workdir: Path) -> None:
    """Refuses a launch of a workdir another launch runs in, before anything starts (the
    isolated re-run, the planning): `_make_workdir` takes the lock itself later."""
    from magi_lp.launch import workdir_lock

    workdir_lock.check_free(Workdir(workdir).lock, workdir)


def _resource_notices(config: Any) -> list[str]:
    """Settings that the plan accepts but that do nothing, in one line each."""
    notices = []
    for group in config.resources:
        spec = config.resources[group]
        gpus = spec.get("gpus", "auto")
        if spec.get("device") == "cpu" and gpus not in ("auto", None, 0, [], ()):
            notices.append(
                f"resources.{group}.gpus={gpus!r} is ignored: resources.{group}.device='cpu' "
                f"(set device='gpu' to use them)"
            )
    return notices


def _replay_checkpoint_notices(config: Any, store: Any) -> list[str]:
    """A `checkpoint.reverb` / `checkpoint.replay` that saves nothing in this run: the other
    one saves its replay (`ReplayStore.saved_by`)."""
    name = store.name if " " in store.name else f"the {store.name} store"
    return [
        f"checkpoint.{key}=True saves nothing in this run: its replay ({name}) is saved by "
        f"checkpoint.{store.saved_by}=True"
        for key in ("reverb", "replay")
        if config.checkpoint.get(key, False) and key != store.saved_by
    ]


def _compilation_cache_settings(config: Any | None) -> dict[str, str]:
    """Where JAX_COMPILATION_CACHE_DIR is set: this environment, and (distributed) each
    group's `resources.<group>.env`."""
    settings = {}
    if os.environ.get(COMPILATION_CACHE_VAR):
        settings["the environment"] = os.environ[COMPILATION_CACHE_VAR]
    for group in config.resources if config is not None else ():
        value = (config.resources[group].get("env") or {}).get(COMPILATION_CACHE_VAR)
        if value:
            settings[f"resources.{group}.env"] = value
    return settings


def _ignored_by_single_process(config: Any, argv: list[str]) -> str | None:
    """One line about distributed-only settings main.py does not use, when any is set."""
    ignored = []
    if int(config.num_actors) != 1:
        ignored.append(f"num_actors={config.num_actors}")
    for key in ("resources", "isolation", "colocate_learner_and_replay"):
        if any(arg.startswith(f"--config.{key}") for arg in argv):
            ignored.append("resources.*" if key == "resources" else key)
    if not ignored:
        return None
    return (
        f"main.py runs one actor, the learner and the replay in this process and ignores "
        f"{', '.join(ignored)}; lp_main.py uses them"
    )


def _config_path() -> str | None:
    flag = flags.FLAGS["config"]
    return flag.config_filename if flag.present else None


def _example_config() -> str:
    """The config file the entry script's docstring runs it with (each project's own, e.g.
    TD3's configs/td3_cartpole.py), else DrQ-v2's configs/reacher_hard.py."""
    main = sys.modules.get("__main__")
    doc = getattr(main, "__doc__", None)
    script = getattr(main, "__file__", None)
    if doc is None and script:  # python -OO drops docstrings: read it from the script
        try:
            doc = ast.get_docstring(ast.parse(Path(script).read_text()))
        except (OSError, SyntaxError, ValueError):
            doc = None
    match = re.search(r"--config[ =](\S+\.py)", doc or "")
    return match.group(1) if match else "configs/reacher_hard.py"


def _config_name() -> str:
    path = _config_path()
    return Path(path.split(":", 1)[0]).stem if path else "run"


def _use_cpu_only_here() -> None:
    # The launching process only assembles the program (and builds one environment to read
    # its spec); it must not take a CUDA context or GPU memory that the nodes need.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _run_distributed(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> int:
    """Plans, (optionally) isolates, builds and launches the distributed program."""
    name = _config_name()
    config, workdir = _checked_inputs(
        name if name.endswith("distributed") else f"{name}_distributed", validate_config
    )
    engine = engines.engine(_LAUNCHER.value)
    _check_resumes_the_same_run(config, workdir)
    finished = _finished_line(config, workdir, single_process=False)
    if finished and not _DRY_RUN.value and not _RENDER.value:
        console.say(f"nothing to do: {finished}")
        return 0
    _check_render(_RENDER.value)
    if engine.several_hosts or _RENDER.value:
        return _run_on_hosts(make_experiment, config, workdir, name)
    # Before planning, a dry run's too: the plan of an engine that cannot run here says
    # nothing true (its replay, its transport), and the launch would refuse it; so would it
    # a cluster address where nothing answers.
    engine.require_stack()
    engine.check_cluster()
    if not _DRY_RUN.value:
        _check_workdir_can_be_made(workdir)
        _check_workdir_free(workdir)
    engine.check_colocation(bool(config.colocate_learner_and_replay))
    joined = engine.cluster_address()
    if joined:
        _check_isolation_elsewhere(
            config, f"--launcher {engine.name} joins the cluster at {joined} ({engine.cluster_var})"
        )
    check_isolation_allows_logging(config)
    from magi_lp.launch import isolation
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    plan, group_resources = _placement_plan(config, engine)
    check_xla_flags(
        {group: config.resources[group].get("xla_flags", "") for group in config.resources},
        os.environ.get("XLA_FLAGS"),
    )
    # Where a pixel agent's frames live, against the learner's memory (sets replay.store):
    # the experiment that runs is made again below, from the config as this settles it.
    planning = _make(make_experiment, config, workdir)
    _check_replay_can_fill(planning.builder)
    store = plan_replay_store(
        config, planning.builder, plan, reverb_available=_reverb_carries_replay(engine)
    )
    replay = resolve_store(planning.builder, config, transport=engine.transport)
    _check_agent_tables(planning.builder, replay, single_process=False)
    # Each GPU node's memory from its compiled programs ('auto'), checked GPU by GPU.
    plan = size_gpu_memory(planning, plan, store)
    notices = [
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
        *_never_updates(config, planning.builder),
    )
    notices += [f"warning: {w}" for w in warnings]
    if store is not None:
        notices.append(store.line)
    else:  # an agent without frame_replay: which store holds its transitions
        notices.append(f"replay: {replay.name}, in the replay node")
    if finished:
        notices.append(f"notice: a launch would do nothing: {finished}")
    notices += [f"notice: {n}" for n in _ignored_sigint()]
    interrupts.raise_if_swallowed()  # a Ctrl-C during the planning's imports stops it here
    if _DRY_RUN.value:
        # The plan is this command's result: it goes to stdout.
        print(f"engine: --launcher {engine.name} ({engine.summary})")
        for notice in notices:
            print(notice)
        print(plan.format_table())
        if joined:
            print(
                f"network isolation: does not apply: the nodes run on the cluster at {joined}, "
                "under its own network rules"
            )
        else:
            print(f"network isolation: {isolation.describe(config.isolation)}")
        return 0

    if joined:
        # The nodes run on that cluster's machines: this process's namespace is not theirs.
        notices.append(
            f"notice: {engine.name} joins the cluster at {joined} ({engine.cluster_var}); "
            "network isolation does not apply there (the cluster's own network rules do)"
        )
    else:
        code = isolation.run_isolated_if_needed(config.isolation, sys.argv)
        if code is not None:
            return code  # the isolated re-run of this command did the work (and the printing)
    for notice in notices:
        console.say(notice)

    _use_cpu_only_here()
    from magi_lp.engines.base import Launch
    from magi_lp.runtime.program import build_program

    experiment = _make(make_experiment, config, workdir)
    engine_module = engine.load()  # Ray's or Launchpad's import: before the last check
    interrupts.raise_if_swallowed()
    _make_workdir(workdir)
    graph = build_program(
        experiment,
        plan,
        workdir=str(workdir),
        logger_factory=logger_factory,
        transport=engine.transport,
    )
    # On the terminal, and dated in nodes/launcher.log, where the engine's lines follow.
    folders = Workdir(workdir)
    folders.nodes.mkdir(parents=True, exist_ok=True)
    report = run_folders.reporter(None, folders.launcher_log)
    report(f"workdir: {workdir}")
    resuming = _resume_line(config, workdir)
    if resuming:
        report(resuming)
    launch = Launch(
        graph,
        plan,
        experiment,
        workdir,
        status_every=_STATUS_EVERY.value,
        group_resources=group_resources,
    )
    _run_starts(workdir)
    code = engine_module.run(launch)
    report(_where_it_stands(config, workdir, single_process=False))
    return code


_AGENT_TABLE_METHODS = ("make_replay_tables", "make_adder", "make_dataset_iterator")


def _check_agent_tables(builder: Any, replay: Any, *, single_process: bool) -> None:
    """Refuses, before anything starts, an agent served from its own Reverb tables whose
    builder does not make them (a state agent that gives only `transition_replay`, on the
    Launchpad stack), with the ways out."""
    from magi_lp.agent.builder import AgentBuilder
    from magi_lp.replay.stores.agent_tables import AgentTables

    if not isinstance(replay, AgentTables) or not isinstance(builder, AgentBuilder):
        return
    missing = [
        name
        for name in _AGENT_TABLE_METHODS
        if getattr(type(builder), name) is getattr(AgentBuilder, name)
    ]
    if not missing:
        return
    from magi_lp.replay.stores import reverb_installed

    if builder.transition_replay(None) is None:
        way = "give frame_replay or transition_replay"
    elif single_process:
        way = "set --config.replay.store=device (its transitions in this process's memory)"
    elif reverb_installed():
        way = (
            "run it on the current stack (.venv312, make setup312), whose Ray engine serves "
            "its transitions"
        )
    else:
        way = "use --launcher ray, which serves its transitions"
    raise ConfigError(
        fact_refusal(
            f"{type(builder).__name__} does not implement {', '.join(missing)}",
            f"its replay here is {replay.name} (replay.store={replay.config.replay.store!r})",
            f"{way}; or implement the three, as projects/td3/builder.py does",
        )
    )


def _stop_on_sigterm() -> None:
    """SIGTERM (`kill`, a scheduler's stop) ends a run in this process as Ctrl-C does: the
    runner's final save, then the same command resumes. Its default would end the process
    at once, and the steps since the last periodic checkpoint would be taken again. Once: a
    second SIGTERM while the save runs is ignored. One inherited as ignored stays so."""
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        return

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _ignored_sigint() -> list[str]:
    """A line when this process was started with SIGINT ignored (`cmd &` from a script): the
    run keeps it so, and Ctrl-C then does nothing, which looks like a hang."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return []
    return [
        "this process was started with SIGINT ignored (as `cmd &` in a script does), so "
        "Ctrl-C will not stop the run; stop it with SIGTERM (kill), which saves as Ctrl-C does"
    ]


def _saved_counts(config: Any, workdir: Path) -> dict[str, Any]:
    """The counts a relaunch of `workdir` resumes from: its newest learner checkpoint's ({}
    for a new run, or one that saves no checkpoints)."""
    from magi_lp.runtime.checkpoint_metadata import saved_metadata

    if not config.checkpoint.enabled or not workdir.is_dir():
        return {}
    counts = saved_metadata(Workdir(workdir).learner_checkpoints).get("counts")
    return counts if isinstance(counts, dict) else {}


def _never_updates(config: Any, builder: Any) -> list[str]:
    """A warning when the run ends before its learner's first update: allowed (a smoke test
    of the acting side), but rarely meant."""
    first = int(builder.replay_schedule().min_replay_size)
    limit = int(config.max_actor_steps)
    if not limit or limit > first:
        return []
    return [
        f"max_actor_steps={limit} ends before the learner's first update (the replay holds "
        f"{first:,} items first, by the agent's settings): the learner will not update; raise "
        f"max_actor_steps above {first}"
    ]


def _check_replay_can_fill(builder: Any) -> None:
    """Refuses a replay the toolkit serves (`frame_replay`, `transition_replay`) that cannot
    hold the items the learner's first update waits for (`replay_schedule`): the learner
    would wait forever, with every node up and the status line at 0 updates/s. A project's
    own settings check may say it first, naming its keys (TD3's, DrQ-v2's)."""
    spec = builder.frame_replay(None) or builder.transition_replay(None)
    if spec is None:  # the agent's own Reverb tables: their sizes are its own
        return
    first = int(builder.replay_schedule().min_replay_size)
    if int(spec.capacity) >= first:
        return
    raise ConfigError(
        fact_refusal(
            f"the agent's replay holds {int(spec.capacity):,} transitions "
            f"({type(spec).__name__}.capacity)",
            f"its learner's first update waits for {first:,} "
            "(replay_schedule().min_replay_size), which it can never hold",
            "raise the agent's replay size to at least that, or lower the items its first "
            "update waits for",
        )
    )


def _check_resumes_the_same_run(config: Any, workdir: Path) -> None:
    """Refuses, before anything starts, a relaunch of `workdir` whose agent or env keys
    differ from those its newest checkpoint was saved with (`RUN_SECTIONS`): the learner
    would fail to restore other shapes only once every node was up, or go on training with
    other settings than the run's first part, in one run folder."""
    from magi_lp.runtime.checkpoint_metadata import (
        identity_differences,
        run_identity,
        saved_metadata,
    )

    if not config.checkpoint.enabled or not workdir.is_dir():
        return
    saved = saved_metadata(Workdir(workdir).learner_checkpoints).get("config")
    differences = identity_differences(saved, run_identity(config))
    if not differences:
        return
    now = ", ".join(f"{key}={flag_value(value)}" for key, _, value in differences)
    saved_with = ", ".join(f"{key}={flag_value(value)}" for key, value, _ in differences)
    flags = " ".join(f"--config.{key}={flag_value(value)}" for key, value, _ in differences)
    raise ConfigError(
        fact_refusal(
            now,
            f"the run in {workdir} was saved with {saved_with}; a relaunch resumes that run",
            f"give {flags} to resume it, or a new --workdir for a new run",
        )
    )


def _finished_line(config: Any, workdir: Path, *, single_process: bool) -> str | None:
    """Why a relaunch of `workdir` has nothing to do, or None: its checkpoint is at or past
    `max_actor_steps` and every evaluator's last evaluation, whole, is of those parameters
    (`_evaluated_at`, `_finally_evaluated`). Otherwise it is relaunched as before: the run
    makes the evaluation. A relaunch of a finished run would take a few more steps past the
    limit, save again and evaluate the same parameters once more."""
    limit = int(config.max_actor_steps)
    counts = _saved_counts(config, workdir)
    steps = counts.get("actor_steps")
    if not limit or steps is None or int(steps) < limit:
        return None
    if single_process:  # main.py runs one evaluator, whatever num_evaluators says
        evaluated = _evaluated_at(config, workdir, int(steps), min(1, int(config.num_evaluators)))
    else:
        evaluated = _finally_evaluated(config, workdir, int(steps))
    if not evaluated:
        return None
    return (
        f"the run in {workdir} has reached max_actor_steps={limit} (its newest "
        f"checkpoint: {int(steps)} actor steps, learner step "
        f"{int(counts.get('learner_steps', 0))}) and was evaluated there; raise "
        "--config.max_actor_steps to train on, or give a new --workdir"
    )


def _count_lag(config: Any) -> int:
    """How far the counted actor steps may trail a distributed run's truth: its actors report
    every DISTRIBUTED_COUNT_EVERY steps, per environment."""
    from magi_lp.runtime.config import DISTRIBUTED_COUNT_EVERY

    return DISTRIBUTED_COUNT_EVERY * int(config.num_actors) * int(config.envs_per_actor)


def _evaluated_at(config: Any, workdir: Path, steps: int, evaluators: int) -> bool:
    """Whether each evaluator's log ends with a whole evaluation (`evaluation.episodes` rows)
    at or past `max_actor_steps`, the last row within the counts' reporting lag of the
    checkpoint's `steps`: not one cut short by a stop, nor an earlier launch's (a run first
    trained to the limit, then past it and stopped, has parameters no evaluation saw). For
    main.py's runs, whose evaluations come at exact step counts (distributed runs:
    `_finally_evaluated`)."""
    import csv

    limit, episodes = int(config.max_actor_steps), int(config.evaluation.episodes)
    lag = _count_lag(config)
    for index in range(evaluators):
        try:
            with open(Workdir(workdir).log_csv(f"evaluator_{index}"), newline="") as file:
                rows = [row for row in csv.DictReader(file) if row.get("episode_return")]
            last = [float(row.get("actor_steps") or "nan") for row in rows[-episodes:]]
        except (OSError, ValueError, csv.Error):
            return False
        whole = len(last) == episodes and all(at >= limit for at in last)
        if not whole or last[-1] < steps - lag:
            return False
    return True


def _finally_evaluated(config: Any, workdir: Path, steps: int) -> bool:
    """Whether every evaluator of a distributed run made its evaluation at `max_actor_steps`
    whole (`Workdir.final_evaluation`, written when it is), within the counts' reporting lag
    of the checkpoint's `steps`. Its log rows cannot tell: a periodic evaluation that the
    actors overtook at the limit logs counts at the limit too, and a stop in the evaluation
    after it left rows that read as one whole evaluation there. A run from before these
    records is relaunched: it evaluates its parameters once more."""
    import json

    limit = int(config.max_actor_steps)
    lag = _count_lag(config)
    for index in range(int(config.num_evaluators)):
        try:
            record = json.loads(Workdir(workdir).final_evaluation(f"evaluator_{index}").read_text())
            at = int(record["actor_steps"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if at < limit or at < steps - lag:
            return False
    return True


def _resume_line(config: Any, workdir: Path) -> str | None:
    """What a relaunch of `workdir` resumes from (its newest learner checkpoint's counts), in
    the launcher's terminal: the learner's node log says it too, but later and out of sight."""
    counts = _saved_counts(config, workdir)
    if not counts:
        return None
    return f"resuming from the workdir's newest checkpoint: {_checkpoint_text(config, counts)}"


def _checkpoint_text(config: Any, counts: dict[str, Any]) -> str:
    """A checkpoint's saved counts as the launcher says them."""
    return (
        f"learner step {int(counts.get('learner_steps', 0))}, "
        f"{int(counts.get('actor_steps', 0))} "
        f"actor steps (max_actor_steps={config.max_actor_steps})"
    )


def _where_it_stands(config: Any, workdir: Path, *, single_process: bool) -> str:
    """What the same command would do next, read from the workdir once the run has ended:
    the launcher's last line (the nodes' own lines say what each saved, out of sight), and
    main.py's after a stop."""
    finished = _finished_line(config, workdir, single_process=single_process)
    if finished:
        return f"done: {finished}"
    if not config.checkpoint.enabled:
        return (
            "checkpoints are off (checkpoint.enabled=False): the same command starts again "
            "from step 0"
        )
    counts = _saved_counts(config, workdir)
    if not counts:
        return "no learner checkpoint was saved: the same command starts again from step 0"
    return (
        f"the same command resumes from the newest checkpoint: {_checkpoint_text(config, counts)}"
    )


def _placement_plan(config: Any, engine: engines.Engine) -> tuple[Any, dict]:
    """This machine's placement plan, and no group resources; or, on the cluster of several
    machines an engine joins (the driver inside a Ray job of `--launcher slurm|kubernetes`),
    the host plan's, each launch group asking for its machine's resource (docs/cluster.md)."""
    if "hosts" in config and engine.cluster_address():
        return _cluster().main.joined_cluster_plan(config)
    return make_placement_plan(config), {}


def _reverb_carries_replay(engine: engines.Engine) -> bool:
    """Whether the engine's replay can be Reverb here (so 'auto' may choose it)."""
    from magi_lp.replay.stores import reverb_installed

    return engine.transport == "reverb" and reverb_installed()


def _run_on_hosts(make_experiment: MakeExperiment, config: Any, workdir: Path, name: str) -> int:
    """`--launcher hosts|slurm|kubernetes` (magi_lp.cluster.main)."""
    from magi_lp.runtime.loggers import LoggerFactory

    cluster = _cluster().main
    engine = engines.engine(_LAUNCHER.value)
    if engine.several_hosts and _cluster().engines.cluster_engine(engine.name).runtime == "ray":
        # The job's driver runs `--launcher ray`, which would refuse it once the job ran.
        engines.engine("ray").check_colocation(
            bool(config.colocate_learner_and_replay), launcher=engine.name
        )
    if not _DRY_RUN.value and not _RENDER.value:  # its cluster files are written here
        _check_workdir_can_be_made(workdir)
    if engine.several_hosts:
        _check_isolation_elsewhere(config, f"--launcher {engine.name}")
    if _reverb_carries_replay(engine):  # Launchpad on the hosts (on this stack: Ray's serves)
        builder = _make(make_experiment, config, workdir).builder
        _check_agent_tables(builder, resolve_store(builder, config), single_process=False)

    def build_program(plan: Any) -> Any:
        _use_cpu_only_here()
        from magi_lp.engines.launchpad_engine import to_program
        from magi_lp.runtime.program import build_program

        logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
        experiment = _make(make_experiment, config, workdir)
        interrupts.raise_if_swallowed()
        # Pickled for the hosts, which run it (the job's own launch): nothing runs here.
        _make_workdir(workdir, lock=False)
        graph = build_program(experiment, plan, workdir=str(workdir), logger_factory=logger_factory)
        return to_program(graph)

    return cluster.run(
        config,
        launcher=engine.name,
        workdir=workdir,
        config_name=name,
        dry_run=_DRY_RUN.value,
        render_dir=_RENDER.value,
        build_program=build_program,
        command=shlex.join(sys.argv),
    )


def _run_single_process(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> int:
    """Runs the experiment in this process (debugging, small machines)."""
    config, workdir = _checked_inputs(_config_name(), validate_config)
    if _DRY_RUN.value:
        raise ConfigError(
            fact_refusal(
                "--dry_run is for lp_main.py",
                "main.py runs in this one process",
                "drop it, or run lp_main.py --dry_run for the plan",
            )
        )
    if _LAUNCHER.value is not None or _RENDER.value:
        raise ConfigError(
            fact_refusal(
                "--launcher and --render are for lp_main.py",
                "main.py runs in this one process",
                "drop them, or run lp_main.py",
            )
        )
    _check_workdir_can_be_made(workdir)
    _check_workdir_free(workdir)
    _check_jax_platforms(os.environ)
    build = detect_jax_build()
    _check_jax_memory_env(os.environ, build)
    _check_resumes_the_same_run(config, workdir)
    finished = _finished_line(config, workdir, single_process=True)
    if finished:
        console.say(f"nothing to do: {finished}")
        return 0
    ignored = _ignored_by_single_process(config, sys.argv)
    if ignored:
        console.say(f"notice: {ignored}")
    for notice in _ignored_sigint():
        console.say(f"notice: {notice}")
    os.environ.setdefault("MUJOCO_GL", "egl")
    check_xla_flags({}, os.environ.get("XLA_FLAGS"))
    cache = compilation_cache_warning(build, _compilation_cache_settings(None))
    if cache:
        console.say(f"warning: {cache}")
    # Where a pixel agent's frames live (sets replay.store): the experiment that runs is made
    # again below, from the config as this settles it.
    builder = _make(make_experiment, config, workdir).builder
    _check_replay_can_fill(builder)
    for warning in _never_updates(config, builder):
        console.say(f"warning: {warning}")
    store = plan_replay_store(config, builder, single_process=True)
    if store is not None:
        console.say(store.line)
    replay = resolve_store(builder, config, single_process=True)
    _check_agent_tables(builder, replay, single_process=True)
    if store is None:
        console.say(f"replay: {replay.name}, in this process")
    for notice in _replay_checkpoint_notices(config, replay):
        console.say(f"notice: {notice}")
    from magi_lp.runtime import single_process
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    experiment = _make(make_experiment, config, workdir)
    interrupts.raise_if_swallowed()
    _make_workdir(workdir)
    console.say(f"workdir: {workdir}")
    _stop_on_sigterm()
    _run_starts(workdir)
    with run_folders.private_temp():
        result = single_process.run_single_process(
            experiment, workdir=str(workdir), logger_factory=logger_factory
        )
        # Saved and closed: a stop now has nothing left to stop, and ends the process as
        # the signal's default does (raised, it would read as a Ctrl-C before the run).
        for signum in interrupts.STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
    if result.resumed_from_step is not None:
        console.say(f"resumed from learner step {result.resumed_from_step}")
    counts = (
        f"{result.actor_steps} actor steps, {result.learner_steps} learner steps, "
        f"{result.episodes} episodes"
    )
    if result.stopped_by_user:
        console.say(f"stopped at {counts}")
        console.say(_where_it_stands(config, workdir, single_process=True))
    else:
        console.say(f"done: {counts}")
    return 0


def _load_config_file(spec: str) -> Any:
    """Runs a config file's `get_config` (`path[:argument]`), as ml_collections does."""
    path, _, argument = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("_magi_lp_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(argument) if argument else module.get_config()


def _missing_key(config: Any, dotted: str) -> str | None:
    """Why `dotted` is no key of `config`, with the closest valid names; None if it is one."""
    node, walked = config, []
    for part in dotted.split("."):
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if part not in keys:
            prefix = "".join(f"{name}." for name in walked)
            close = did_you_mean(part, keys, prefix=prefix, otherwise="")
            if close:
                return fact_refusal(f"no config key {dotted}", "", close)
            return fact_refusal(
                f"{'.'.join(walked) or 'the config'} has no key {part!r}",
                "command-line overrides can only change keys the config file sets",
                "add it to the config file",
            )
        node, walked = node[part], [*walked, part]
    return None


def _override_error(argv: list[str], error: BaseException) -> str:
    """One line for an override ml_collections refused: the missing key, else its reason."""
    overrides = [arg for arg in argv if arg.startswith("--config.")]
    config_arg = _config_arg(argv)
    if config_arg is not None:
        try:
            config = _load_config_file(config_arg)
        except Exception:  # the file's own problems are reported elsewhere
            config = None
        else:
            try:
                _require_a_config(config_arg, config)
            except ConfigError as error:
                return str(error)
        if config is not None:
            for override in overrides:
                why = _missing_key(config, override[len("--config.") :].split("=", 1)[0])
                if why:
                    return f"{override}: {why}"
    text = str(error.args[0]) if error.args else str(error)
    return f"bad config override ({' '.join(overrides)}): {' '.join(text.split())}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with one clear line instead of a traceback for bad input."""
    absl_logger = absl_logging.get_absl_logger()
    # ml_collections warns when get_config() returns None; _checked_inputs refuses it in one line.
    absl_logger.addFilter(_not_a_config_warning)
    try:
        rest = flags.FLAGS(argv)
    except Exception as error:  # each kind gets its own line (_flag_error)
        _fail(_flag_error(argv, error))
    finally:
        absl_logger.removeFilter(_not_a_config_warning)
    _refuse_a_repeated_sequence(argv)
    return rest


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
    """(key, value) of each `--config.<key>=<value>` / `--config.<key> <value>`, in order."""
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith(("--config.", "-config.")):
            continue
        key, equals, value = arg.lstrip("-")[len("config.") :].partition("=")
        if not equals and index + 1 < len(argv):
            value = argv[index + 1]
        found.append((key, value))
    return found


def _refuse_a_repeated_sequence(argv: list[str]) -> None:
    """ml_collections joins a tuple key's repeated overrides ((32,32) then (16,16) gives
    (32,32,16,16)) where a scalar's last one wins: a key given twice whose value is a
    sequence is refused."""
    given: dict[str, list[str]] = {}
    with contextlib.suppress(flags.Error):  # as absl read them: --flagfile's lines in place
        argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
    for key, value in _overrides(argv):
        given.setdefault(key, []).append(value)
    config = _CONFIG.value
    for key, values in given.items():
        if len(values) < 2 or config is None or _missing_key(config, key) is not None:
            continue
        node = config
        for part in key.split("."):
            node = node[part]
        if isinstance(node, (tuple, list)):
            _fail(
                fact_refusal(
                    f"--config.{key} is given {len(values)} times ({', then '.join(values)})",
                    f"the values of a sequence are joined, not replaced (it would be {node})",
                    "give it once",
                )
            )


def _not_a_config_warning(record: Any) -> bool:
    return "get_config() returned None" not in record.getMessage()


def _flag_error(argv: list[str], error: Exception) -> str:
    """The one line for an exception absl's flag parsing raised."""
    if _raised_in_code_of_this_checkout(argv, error):
        raise error  # a bug, met while the file ran: it keeps its traceback
    where = _line_in_config_file(argv, error)
    if where is not None and not isinstance(error, (flags.Error, SyntaxError)):
        # The file itself failed while it loaded (an import, a name, a lookup at module
        # level): not an override's fault, whatever the exception's kind.
        return (
            f"{_config_flag(argv)}: the file raised {type(error).__name__} at "
            f"{where}: {_one_line(error)}; fix the file, or pick one from configs/"
        )
    if isinstance(error, flags.Error):
        cause = _config_error_in(error)
        if cause is not None:  # raised while the config file ran (a refusal, a checked value)
            # ml_collections re-raises it with the traceback as text; keep the last line.
            # (Its last line: "magi_lp.errors.ConfigError: ...", or a subclass's name.)
            refusal = re.sub(r"^[\w.]*Error: ", "", str(cause).strip().splitlines()[-1])
            line = _config_file_line_in_chain(argv, error)
            # The file's line that made the refused call: a refusal of a toolkit class or
            # helper (ResourceSpec.cpu_threads, resource_spec()) names no config key.
            return f"{_config_flag(argv)} (line {line}): {refusal}" if line else refusal
        if "Error whilst parsing config file" in str(error):
            return _get_config_error(str(error))
        switch = re.match(
            r"flag --(\w+)=(.*): \('Non-boolean argument to boolean flag'", str(error)
        )
        if switch:
            name, value = switch.groups()
            return fact_refusal(
                f"--{name}={value}", "it is a switch", f"give --{name} alone (or --no{name})"
            )
        if (
            isinstance(error, flags.UnrecognizedFlagError)
            and error.flagname.startswith("config.")
            and _config_arg(argv) is None
        ):
            return fact_refusal(
                f"--{error.flagname}",
                "it overrides a key of the config file, and no --config was given",
                f"give the file too, e.g. --config {_example_config()} --{error.flagname}=...",
            )
        return _unreadable_override(argv, str(error)) or f"{error}. See --helpfull."
    if isinstance(error, OSError):
        reason = error.__cause__ or str(error).splitlines()[-1].strip()
        return f"{_config_flag(argv)}: cannot load the config file: {reason}"
    if isinstance(error, SyntaxError):
        path = _config_arg(argv)
        line = f" at line {error.lineno}" if error.lineno else ""
        name = error.filename or ""
        flag = _config_flag(argv)
        if name.startswith("<") or not path:  # text the file compiles or evals
            return f"{flag}: reading the config raised SyntaxError: {error.msg}; fix the file"
        if name and not _is_config_file(name, path):  # a module the file imports
            return (
                f"--config {path}: {error.filename}, which it imports, has a syntax "
                f"error{line}: {error.msg}; fix that file"
            )
        return (
            f"--config {path}: the config file has a syntax error{line}: {error.msg}; fix the file"
        )
    if isinstance(error, AttributeError) and "get_config" in str(error):
        return (
            f"{_config_flag(argv)}: the file defines no get_config(); a config "
            "file defines get_config() returning an ml_collections.ConfigDict (see configs/)"
        )
    if isinstance(error, (AttributeError, KeyError, TypeError, ValueError)):
        return _override_error(argv, error)
    return (
        f"{_config_flag(argv)}: reading the config raised {type(error).__name__}: "
        f"{_one_line(error)}; fix the file, or pick one from configs/"
    )


def _raised_in_code_of_this_checkout(argv: list[str], error: BaseException) -> bool:
    """Whether `error` (no ConfigError) was raised in code neither the config file's nor a
    library's: the toolkit's, a project's (which config files call), or the user's own
    modules. Taken from its traceback, or from the traceback text ml_collections puts in
    the TypeError or ValueError it re-raises. The file's own mistakes (a name, a lookup, an
    import, a library refusing an argument) are one line; a bug there keeps its traceback."""
    if _config_error_in(error) is not None:
        return False
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    if "Error whilst parsing config file" in str(error):
        files = [name for name, _, _ in _frames_in_text(str(error))]
    spec = _config_arg(argv)
    if not files or not spec or not any(_is_config_file(name, spec) for name in files):
        return False  # the file never ran into it: absl's or an override's error
    innermost = files[-1]
    return not (
        _is_config_file(innermost, spec)
        or innermost.startswith("<")  # importlib's frozen frames, generated code
        or _in_a_library(innermost)
    )


def _config_error_in(error: BaseException) -> ConfigError | None:
    """The ConfigError `error` is, or was raised from (ml_collections re-raises a config
    file's ValueError as a new one of its type, and absl wraps that in a flags.Error)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConfigError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _in_a_library(filename: str) -> bool:
    """Whether `filename` is the standard library's or an installed package's."""
    path = Path(filename).resolve()
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.is_relative_to(Path(root).resolve()) for root in roots if root)


def _unreadable_override(argv: list[str], message: str) -> str | None:
    """One refusal for `--config.<key>=<value>` the flag parser could not read as the key's
    kind of value ("flag --config.num_actors=True: invalid literal for int()..."), saying
    what the key takes and its value in the config; None where that cannot be told."""
    match = re.match(r"flag --config\.([\w.]+)=(.*?): ", message)
    spec = _config_arg(argv)
    if not match or not spec:
        return None
    key, given = match.groups()
    try:
        node = _load_config_file(spec)
        for part in key.split("."):
            node = node[part]
    except Exception:  # the file's or the key's own problem is said elsewhere
        return None
    return override_refusal(key, given, node)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or "(no message)"


def _line_in_config_file(argv: list[str], error: BaseException) -> str | None:
    """`line <n>` of the innermost frame of `error`'s traceback that runs the config file
    itself, or None when the file never ran into it (an override's or absl's error)."""
    spec = _config_arg(argv)
    if not spec:
        return None
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(error.__traceback__)
        if _is_config_file(frame.filename, spec)
    ]
    return f"line {lines[-1]}" if lines else None


def _is_config_file(filename: str | None, spec: str) -> bool:
    """Whether `filename` (a traceback frame's) is the config file of `--config spec`."""
    config_file = Path(spec.split(":", 1)[0]).resolve()
    return bool(filename) and Path(filename).resolve() == config_file


def _config_flag(argv: list[str]) -> str:
    """`--config <value>` as the command line gave it, or `--config` alone where it did not
    (a --flagfile's)."""
    value = _config_arg(argv)
    return "--config" if value is None else f"--config {value}"


def _config_arg(argv: list[str]) -> str | None:
    """The value given to --config on the command line."""
    return next(
        (argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"),
        next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")), None),
    )


def _get_config_error(message: str) -> str:
    """One line for an exception a config file's get_config() raised (ml_collections hands
    it over as the text of its traceback)."""
    head = message.split(": Error whilst parsing", 1)[0].replace("flag --config=", "--config ")
    last = next((line.strip() for line in reversed(message.splitlines()) if line.strip()), "")
    if "get_config() takes 0 positional arguments" in last:
        spec = head.removeprefix("--config ")
        return (
            f"{head}: this config file's get_config() takes no argument, so "
            f"':{spec.partition(':')[2]}' cannot select anything; use --config "
            f"{spec.partition(':')[0]}"
        )
    spec = head.removeprefix("--config ")
    if "get_config() missing 1 required positional argument" in last:
        return (
            f"{head}: this config file's get_config() takes an argument ({last.rsplit(': ', 1)[-1]}"
            f"); give it after a colon: --config {spec.partition(':')[0]}:<argument>"
        )
    frames = _frames_in_text(message)
    inside = [(line, scope) for name, line, scope in frames if _is_config_file(name, spec)]
    if inside:
        line, scope = inside[-1]
        at = "get_config()" if scope == "get_config" else "the file"
        return f"{head}: {at} raised {last} at line {line}; fix the file, or pick one from configs/"
    return f"{head}: its get_config() raised {last}"


def _config_file_line_in_chain(argv: list[str], error: BaseException) -> str | None:
    """The line of the config file in the innermost frame that runs it, over `error`'s chain
    of causes: from their tracebacks, or from the traceback text ml_collections puts in the
    message of an exception it re-raises. None when the file never ran into it."""
    spec = _config_arg(argv)
    if not spec:
        return None
    lines: list[str] = []
    seen: BaseException | None = error
    while seen is not None:
        frames = [(f.filename, str(f.lineno)) for f in traceback.extract_tb(seen.__traceback__)]
        frames += [(name, line) for name, line, _ in _frames_in_text(str(seen))]
        lines = [line for name, line in frames if _is_config_file(name, spec)] or lines
        if isinstance(seen, ConfigError):
            break  # what it was raised while handling is another matter (a file's except:)
        seen = seen.__cause__ or seen.__context__
    return lines[-1] if lines else None


def _frames_in_text(message: str) -> list[tuple[str, str, str]]:
    """(file, line, scope) of each frame of a traceback given as text (ml_collections puts a
    config file's traceback in the message of the exception it re-raises), outermost first."""
    return re.findall(r'File "([^"]+)", line (\d+), in (\S+)', message)


def _interrupted(error: BaseException) -> bool:
    """Whether `error` comes from a Ctrl-C: a SIGINT that lands inside a C extension's import
    (dm_control's, MuJoCo's) surfaces as `ImportError: initialization failed` caused by it,
    and one that lands in a ctypes call's argument conversion (PyOpenGL's EGL lookups, which
    dm_control's import makes) as `ctypes.ArgumentError: argument 1: KeyboardInterrupt`, with
    the KeyboardInterrupt in its message only (seen in a busy suite run)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        if isinstance(error, ctypes.ArgumentError) and ": KeyboardInterrupt" in str(error):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _interrupted_before_start() -> int:
    # Ctrl-C before the launcher took over its signals (while importing or building). The same
    # Ctrl-C can come twice: to the process group, and forwarded by the isolation parent
    # (`interrupts.one_interrupt` and the launcher's own handler drop such echoes); a Ctrl-C
    # after that block, in this line, would print a traceback (seen once in a busy suite run),
    # so further SIGINTs are ignored first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _STARTED_IN:  # one that escaped the run's own handling, in its last lines
        console.say(
            f"interrupted; the same command resumes from the newest checkpoint in "
            f"{_STARTED_IN[0]}, if it has one"
        )
    else:
        console.say("interrupted before the run started; nothing was launched or written")
    return 130


def _main(
    runner: Callable[..., int], make: MakeExperiment, validate_config: ValidateConfig | None
) -> None:
    def main(argv: list[str]) -> None:
        if not any(arg.startswith(("--verbosity", "-v")) for arg in sys.argv[1:]):
            # Library INFO chatter (orbax, XLA) buries the run's own lines; -v 0 brings it back.
            absl_logging.set_verbosity(absl_logging.WARNING)
        if len(argv) > 1:
            _fail(f"unexpected arguments {argv[1:]}; use --config, --workdir, --config.<key>=...")
        quiet_gym_notice()
        # Before a project's checks import dm_control, which would otherwise pick GLFW.
        os.environ.setdefault("MUJOCO_GL", "egl")
        try:
            with interrupts.one_interrupt():
                code = runner(make, validate_config)
        except ConfigError as error:
            _fail(str(error))
        except Exception as error:
            if not _interrupted(error):
                raise
            code = _interrupted_before_start()
        except KeyboardInterrupt:
            code = _interrupted_before_start()
        if runner is _run_distributed:
            # Every node has ended and every file is written; the launcher's own teardown
            # (TensorFlow's and Reverb's threads, loaded to build the program) took 2-4 s
            # more before the shell got its prompt back.
            _leave_now(code)
        sys.exit(code)

    app.run(main, flags_parser=parse_flags)


def _leave_now(code: int) -> NoReturn:
    """Exits at once, output flushed (no interpreter teardown)."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def distributed_main(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> None:
    """Entry point body for `lp_main.py`.

    Args:
      make_experiment: `config -> Experiment` (or `(config, workdir=...) -> Experiment`).
      validate_config: the project's checks of its own keys (`config.agent`, `config.env`),
        e.g. `magi_lp.config_schema.check_project_sections` on its dataclasses: the one
        place a project wires them. Run once, right after the toolkit's checks, before
        anything heavy is imported or any process starts; it raises `ConfigError` naming the
        key and the fix. None: the project has no keys of its own to check (with keys in
        `config.agent` or `config.env`, a warning says they go unchecked).
    """
    _main(_run_distributed, make_experiment, validate_config)


def single_process_main(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> None:
    """Entry point body for `main.py` (arguments as for `distributed_main`)."""
    _main(_run_single_process, make_experiment, validate_config)
