"""What every entry point shares: flags, config checks, the plan, and the two ways to run.

A project's `lp_main.py` / `main.py` only supplies `make_experiment(config) -> Experiment`
(or `make_experiment(config, workdir=...)` when it writes files of its own, e.g. videos)
and calls `distributed_main` / `single_process_main`. Flags:
  --config path/to/config.py   (ml_collections config file; --config.<key>=value overrides)
  --workdir DIR                 (logs, checkpoints, node outputs; reused to resume)
  --dry_run                     (lp_main only: print the placement plan and exit)

Heavy libraries (TensorFlow, JAX, Launchpad, Reverb) are imported only after the config has
been read, checked and planned, so bad input fails in well under a second, and so that the
network-isolation re-exec happens before any of them start threads.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from magi_lp.errors import ConfigError
from magi_lp.runtime.config import (
    NODE_GROUPS,
    check_isolation_allows_logging,
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

MakeExperiment = Callable[..., Any]


def _make(make_experiment: MakeExperiment, config: Any, workdir: Path) -> Any:
    """Calls `make_experiment(config)`, passing `workdir=` when the project's function takes it."""
    if "workdir" in inspect.signature(make_experiment).parameters:
        return make_experiment(config, workdir=str(workdir))
    return make_experiment(config)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
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


def make_plan(config: Any, inventory: Any = None) -> Any:
    """The validated placement plan for the program `config` describes."""
    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.plan import GroupRequest
    from magi_lp.placement.plan import make_plan as plan_groups
    from magi_lp.placement.resources import ResourceSpec

    counts = {
        "replay": 1,
        "counter": 1,
        "learner": 1,
        "actor": config.num_actors,
        "evaluator": config.num_evaluators,
        "coordinator": 1,
    }
    requests = {}
    for group in NODE_GROUPS:
        if counts[group] == 0:
            continue
        spec = ResourceSpec.from_config(group, config.resources[group])
        requests[group] = GroupRequest(spec, counts[group])
    if config.colocate_learner_and_replay:
        requests.pop("replay")
    return plan_groups(requests, inventory if inventory is not None else query_inventory())


def _print_notices(plan: Any) -> None:
    for notice in plan.notices:
        print(f"notice: {notice}")


def _use_cpu_only_here() -> None:
    # The launching process only assembles the program (and builds one environment to read
    # its spec); it must not take a CUDA context or GPU memory that the nodes need.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run_distributed(make_experiment: MakeExperiment, argv: list[str]) -> int:
    """Plans, (optionally) isolates, builds and launches the distributed program."""
    del argv
    name = _config_name()
    config, workdir = _checked_inputs(
        name if name.endswith("distributed") else f"{name}_distributed"
    )
    check_isolation_allows_logging(config)
    from magi_lp.launch import isolation
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    plan = make_plan(config)
    if _DRY_RUN.value:
        _print_notices(plan)
        print(plan.format_table())
        print(f"network isolation: {isolation.describe(config.isolation)}")
        return 0

    code = isolation.run_isolated_if_needed(config.isolation, sys.argv)
    if code is not None:
        return code  # the isolated re-run of this command did the work (and the printing)
    _print_notices(plan)

    _use_cpu_only_here()
    from magi_lp.launch.local import launch
    from magi_lp.runtime.program import build_program

    experiment = _make(make_experiment, config, workdir)
    program = build_program(experiment, plan, workdir=str(workdir), logger_factory=logger_factory)
    print(f"workdir: {workdir}")
    return launch(program, plan.envs(), log_dir=workdir / "nodes")


def run_single_process(make_experiment: MakeExperiment, argv: list[str]) -> int:
    """Runs the experiment in this process (debugging, small machines)."""
    del argv
    config, workdir = _checked_inputs(_config_name())
    if _DRY_RUN.value:
        raise ConfigError("--dry_run is for lp_main.py; main.py runs in this one process.")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from magi_lp.runtime.loggers import LoggerFactory
    from magi_lp.runtime.single_process import run_local

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    experiment = _make(make_experiment, config, workdir)
    print(f"workdir: {workdir}")
    result = run_local(experiment, workdir=str(workdir), logger_factory=logger_factory)
    if result.resumed_from_step is not None:
        print(f"resumed from learner step {result.resumed_from_step}")
    if result.stopped_by_user:
        print(f"stopped; checkpoint saved. Resume with the same --workdir {workdir}")
    print(
        f"done: {result.actor_steps} actor steps, {result.learner_steps} learner steps, "
        f"{result.episodes} episodes"
    )
    return 0


def _override_error(argv: list[str], error: BaseException) -> str:
    overrides = [arg for arg in argv if arg.startswith("--config.")]
    text = str(error.args[0]) if error.args else str(error)
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    missing = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
    for override in overrides:
        key = override[len("--config.") :].split("=", 1)[0]
        if missing and missing[0] in key.split("."):
            if suggestion:
                return f"{override}: no config key {key}. Did you mean {suggestion.group(1)}?"
            return (
                f"{override}: the config file has no key {key}. Command-line overrides can "
                "only change keys the config file sets; add it to the config file."
            )
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
    return argv


def _main(runner: Callable[[MakeExperiment, list[str]], int], make: MakeExperiment) -> None:
    def main(argv: list[str]) -> None:
        if not any(arg.startswith(("--verbosity", "-v")) for arg in sys.argv[1:]):
            # Library INFO chatter (orbax, XLA) buries the run's own lines; -v 0 brings it back.
            absl_logging.set_verbosity(absl_logging.WARNING)
        if len(argv) > 1:
            _fail(f"unexpected arguments {argv[1:]}; use --config, --workdir, --config.<key>=...")
        try:
            code = runner(make, argv)
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
