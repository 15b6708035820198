"""What every entry point shares: flags, config checks, the plan, and the two ways to run.

A project's `lp_main.py` / `main.py` only supplies `make_experiment(config) -> Experiment`
(or `make_experiment(config, workdir=...)` when it writes files of its own, e.g. videos)
and calls `distributed_main` / `single_process_main`. Flags:
  --config path/to/config.py   (ml_collections config file; --config.<key>=value overrides)
  --workdir DIR                 (logs, checkpoints, node outputs; reused to resume)
  --dry_run                     (lp_main only: print the placement plan and exit)
  --launcher local|hosts|slurm|kubernetes, --render DIR   (lp_main only: several hosts,
                                magi_lp.runtime.cluster and docs/cluster.md)

Heavy libraries (TensorFlow, JAX, Launchpad, Reverb) are imported only after the config has
been read, checked and planned, so bad input fails in well under a second, and so that the
network-isolation re-exec happens before any of them start threads.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from magi_lp import console
from magi_lp.errors import ConfigError
from magi_lp.runtime.config import (
    check_isolation_allows_logging,
    make_placement_plan,
    validate_experiment_config,
)

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
    "local",
    ["local", "hosts", "slurm", "kubernetes"],
    "Where the nodes run: this machine, or several hosts (config.hosts) through per-host "
    "scripts, a SLURM batch script or Kubernetes manifests (docs/cluster.md).",
)
_RENDER = flags.DEFINE_string(
    "render", None, "With --launcher hosts|slurm|kubernetes: write the generated files here."
)

MakeExperiment = Callable[..., Any]


def _make(make_experiment: MakeExperiment, config: Any, workdir: Path) -> Any:
    """Calls `make_experiment(config)`, passing `workdir=` when the project's function takes it."""
    if "workdir" in inspect.signature(make_experiment).parameters:
        return make_experiment(config, workdir=str(workdir))
    return make_experiment(config)


def _fail(message: str) -> NoReturn:
    console.error(message)
    sys.exit(2)


def _checked_inputs(default_workdir_name: str) -> tuple[Any, Path]:
    path = _config_path()
    if not path:
        raise ConfigError("--config is required, e.g. --config configs/reacher_hard.py")
    if not Path(path.split(":", 1)[0]).is_file():
        raise ConfigError(f"--config {path}: no such file; pick one from configs/.")
    try:
        config = _CONFIG.value
        validate_experiment_config(config)
    except OSError as error:
        cause = error.__cause__ or " ".join(str(error).split())
        raise ConfigError(f"--config {path}: cannot load the config file: {cause}") from None
    workdir = Path(_WORKDIR.value or Path("runs") / default_workdir_name).absolute()
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir} exists and is not a folder; pick another path.")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--workdir {workdir} cannot be created ({error.strerror}).") from None
    return config, workdir


def _config_path() -> str | None:
    flag = flags.FLAGS["config"]
    return flag.config_filename if flag.present else None


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


def run_distributed(make_experiment: MakeExperiment) -> int:
    """Plans, (optionally) isolates, builds and launches the distributed program."""
    name = _config_name()
    config, workdir = _checked_inputs(
        name if name.endswith("distributed") else f"{name}_distributed"
    )
    if _LAUNCHER.value != "local" or _RENDER.value:
        return _run_on_hosts(make_experiment, config, workdir, name)
    check_isolation_allows_logging(config)
    from magi_lp.launch import isolation
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    plan = make_placement_plan(config)
    if _DRY_RUN.value:
        # The plan is this command's result: it goes to stdout.
        for notice in plan.notices:
            print(f"notice: {notice}")
        print(plan.format_table())
        print(f"network isolation: {isolation.describe(config.isolation)}")
        return 0

    code = isolation.run_isolated_if_needed(config.isolation, sys.argv)
    if code is not None:
        return code  # the isolated re-run of this command did the work (and the printing)
    for notice in plan.notices:
        console.say(f"notice: {notice}")

    _use_cpu_only_here()
    from magi_lp.launch.local import launch
    from magi_lp.runtime.program import build_program

    experiment = _make(make_experiment, config, workdir)
    program = build_program(experiment, plan, workdir=str(workdir), logger_factory=logger_factory)
    console.say(f"workdir: {workdir}")
    return launch(program, plan.envs(), log_dir=workdir / "nodes")


def _run_on_hosts(make_experiment: MakeExperiment, config: Any, workdir: Path, name: str) -> int:
    """`--launcher hosts|slurm|kubernetes` (magi_lp.runtime.cluster)."""
    from magi_lp.runtime import cluster
    from magi_lp.runtime.loggers import LoggerFactory

    def build_program(plan: Any) -> Any:
        _use_cpu_only_here()
        from magi_lp.runtime.program import build_program

        logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
        experiment = _make(make_experiment, config, workdir)
        return build_program(experiment, plan, workdir=str(workdir), logger_factory=logger_factory)

    return cluster.run(
        config,
        launcher=_LAUNCHER.value,
        workdir=workdir,
        config_name=name,
        dry_run=_DRY_RUN.value,
        render_dir=_RENDER.value,
        build_program=build_program,
        command=shlex.join(sys.argv),
    )


def run_single_process(make_experiment: MakeExperiment) -> int:
    """Runs the experiment in this process (debugging, small machines)."""
    config, workdir = _checked_inputs(_config_name())
    if _DRY_RUN.value:
        raise ConfigError("--dry_run is for lp_main.py; main.py runs in this one process.")
    if _LAUNCHER.value != "local" or _RENDER.value:
        raise ConfigError("--launcher and --render are for lp_main.py; main.py runs here.")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from magi_lp.runtime import single_process
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    experiment = _make(make_experiment, config, workdir)
    console.say(f"workdir: {workdir}")
    result = single_process.run_single_process(
        experiment, workdir=str(workdir), logger_factory=logger_factory
    )
    if result.resumed_from_step is not None:
        console.say(f"resumed from learner step {result.resumed_from_step}")
    if result.stopped_by_user:
        console.say(f"stopped; checkpoint saved. Resume with the same --workdir {workdir}")
    console.say(
        f"done: {result.actor_steps} actor steps, {result.learner_steps} learner steps, "
        f"{result.episodes} episodes"
    )
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
            where = ".".join(walked) or "the config"
            close = difflib.get_close_matches(part, keys, n=1)
            if close:
                return f"no config key {dotted}. Did you mean {'.'.join([*walked, close[0]])}?"
            return (
                f"{where} has no key {part!r}. Command-line overrides can only change keys the "
                "config file sets; add it to the config file."
            )
        node, walked = node[part], [*walked, part]
    return None


def _override_error(argv: list[str], error: BaseException) -> str:
    """One line for an override ml_collections refused: the missing key, else its reason."""
    overrides = [arg for arg in argv if arg.startswith("--config.")]
    config_arg = next(
        (argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"),
        next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")), None),
    )
    if config_arg is not None:
        try:
            config = _load_config_file(config_arg)
        except Exception:  # the file's own problems are reported elsewhere
            config = None
        if config is not None:
            for override in overrides:
                why = _missing_key(config, override[len("--config.") :].split("=", 1)[0])
                if why:
                    return f"{override}: {why}"
    text = str(error.args[0]) if error.args else str(error)
    return f"bad config override ({' '.join(overrides)}): {' '.join(text.split())}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with one clear line instead of a traceback for bad input."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ConfigError):  # raised by the config file's get_config
            # ml_collections re-raises it with the traceback as text; keep the last line.
            _fail(str(cause).strip().splitlines()[-1].split("ConfigError: ", 1)[-1])
        _fail(f"{error}. See --helpfull.")
    except OSError as error:
        reason = error.__cause__ or str(error).splitlines()[-1].strip()
        _fail(f"--config: cannot load the config file: {reason}")
    except SyntaxError as error:
        _fail(f"--config: the config file has a syntax error: {error}")
    except (KeyError, AttributeError, TypeError, ValueError) as error:
        _fail(_override_error(argv, error))


def _main(runner: Callable[[MakeExperiment], int], make: MakeExperiment) -> None:
    def main(argv: list[str]) -> None:
        if not any(arg.startswith(("--verbosity", "-v")) for arg in sys.argv[1:]):
            # Library INFO chatter (orbax, XLA) buries the run's own lines; -v 0 brings it back.
            absl_logging.set_verbosity(absl_logging.WARNING)
        if len(argv) > 1:
            _fail(f"unexpected arguments {argv[1:]}; use --config, --workdir, --config.<key>=...")
        try:
            code = runner(make)
        except ConfigError as error:
            _fail(str(error))
        sys.exit(code)

    app.run(main, flags_parser=parse_flags)


def distributed_main(make_experiment: MakeExperiment) -> None:
    """Entry point body for `lp_main.py`."""
    _main(run_distributed, make_experiment)


def single_process_main(make_experiment: MakeExperiment) -> None:
    """Entry point body for `main.py`."""
    _main(run_single_process, make_experiment)
