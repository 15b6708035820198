"""What the entry points refuse before anything starts: the config, the project's experiment,
the environment's GPU settings, the workdir, and the replay an agent can fill; each in one
line naming the key and the fix."""

from __future__ import annotations

import inspect
import math
import os
import shlex
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from magi_lp import console
from magi_lp.cli.flags import (
    _CONFIG,
    _DRY_RUN,
    _WORKDIR,
    MakeExperiment,
    ValidateConfig,
    _config_path,
    _example_config,
    _require_a_config,
)
from magi_lp.config_schema import did_you_mean, fact_refusal, flag_value
from magi_lp.errors import ConfigError
from magi_lp.launch import run_folders
from magi_lp.placement.jax_build import (
    COMPILATION_CACHE_VAR,
    JaxBuild,
    client_allocators,
    detect_jax_build,
    jaxlib_0_11_or_later,
)
from magi_lp.runtime.config import (
    SECTIONS,
    validate_experiment_config,
)
from magi_lp.runtime.workdir import Workdir

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


def _make_workdir(workdir: Path, *, lock: bool = True) -> None:
    """Makes the workdir and (`lock`) takes it for this launch (`workdir_lock`): a second
    launch of the same workdir while this one runs is refused in one line."""
    run_folders.prepared_folder(workdir, f"--workdir {workdir}")
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
    if config.num_actors not in (1, "auto"):  # 'auto' is one actor here
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


def _use_cpu_only_here() -> None:
    # The launching process only assembles the program (and builds one environment to read
    # its spec); it must not take a CUDA context or GPU memory that the nodes need.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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


def _ignored_sigint() -> list[str]:
    """A line when this process was started with SIGINT ignored (`cmd &` from a script): the
    run keeps it so, and Ctrl-C then does nothing, which looks like a hang."""
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return []
    return [
        "this process was started with SIGINT ignored (as `cmd &` in a script does), so "
        "Ctrl-C will not stop the run; stop it with SIGTERM (kill), which saves as Ctrl-C does"
    ]


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
