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

import ctypes
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from absl import app
from absl import logging as absl_logging

from magi_lp import console, engines
from magi_lp.cli.checks import (
    _check_agent_tables,
    _check_isolation_elsewhere,
    _check_jax_memory_env,
    _check_jax_platforms,
    _check_render,
    _check_resumes_the_same_run,
    _check_workdir_can_be_made,
    _check_workdir_free,
    _checked_inputs,
    _cluster,
    _ignored_by_single_process,
    _ignored_sigint,
    _make,
    _make_workdir,
    _use_cpu_only_here,
)
from magi_lp.cli.decision import (
    LaunchDecision,
    decide_distributed,
    decide_single_process,
    reverb_carries_replay,
)
from magi_lp.cli.flags import (
    _DRY_RUN,
    _LAUNCHER,
    _RENDER,
    _STATUS_EVERY,
    MakeExperiment,
    ValidateConfig,
    _config_name,
    _fail,
    parse_flags,
)
from magi_lp.cli.standing import (
    _finished_line,
    _resume_line,
    _where_it_stands,
)
from magi_lp.config_schema import fact_refusal
from magi_lp.errors import ConfigError
from magi_lp.launch import interrupts, run_folders
from magi_lp.launch.node_lifetime import quiet_gym_notice
from magi_lp.placement.jax_build import (
    detect_jax_build,
)
from magi_lp.replay.stores import resolve_store
from magi_lp.runtime.config import (
    check_isolation_allows_logging,
)
from magi_lp.runtime.workdir import Workdir

_STARTED_IN: list[Path] = []
"""The workdir, once the run is handed to its runner or engine (`_run_starts`): a Ctrl-C
that reaches the top after that is not one "before the run started"."""


def _run_starts(workdir: Path) -> None:
    _STARTED_IN[:] = [workdir]


def _run_distributed(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> int:
    """Checks, decides once, (optionally) isolates, and hands the program to its engine."""
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
    decision = decide_distributed(make_experiment, config, workdir, engine, finished)
    interrupts.raise_if_swallowed()  # a Ctrl-C during the planning's imports stops it here
    lines = list(decision.lines)
    if _DRY_RUN.value:
        # The plan is this command's result: it goes to stdout.
        print(f"engine: --launcher {engine.name} ({engine.summary})")
        for line in lines:
            print(line)
        print(decision.plan.format_table())
        if joined:
            print(
                f"network isolation: does not apply: the nodes run on the cluster at {joined}, "
                "under its own network rules"
            )
        else:
            print(f"network isolation: {isolation.describe(config.isolation, engine.transport)}")
        return 0

    if joined:
        # The nodes run on that cluster's machines: this process's namespace is not theirs.
        lines.append(
            f"notice: {engine.name} joins the cluster at {joined} ({engine.cluster_var}); "
            "network isolation does not apply there (the cluster's own network rules do)"
        )
    else:
        code = isolation.run_isolated_if_needed(config.isolation, sys.argv, engine.transport)
        if code is not None:
            return code  # the isolated re-run of this command did the work (and the printing)
    for line in lines:
        console.say(line)
    return _launch_here(engine, decision, workdir, logger_factory)


def _launch_here(
    engine: engines.Engine, decision: LaunchDecision, workdir: Path, logger_factory: Any
) -> int:
    """Builds the graph the decision says and runs it on `engine` (this machine, or the
    cluster it joins)."""
    _use_cpu_only_here()
    from magi_lp.engines.base import Launch
    from magi_lp.runtime.program import build_program

    engine_module = engine.load()  # Ray's or Launchpad's import: before the last check
    interrupts.raise_if_swallowed()
    _make_workdir(workdir)
    graph = build_program(
        decision.experiment,
        decision.plan,
        workdir=str(workdir),
        logger_factory=logger_factory,
        transport=engine.transport,
    )
    # On the terminal, and dated in nodes/launcher.log, where the engine's lines follow.
    folders = Workdir(workdir)
    folders.nodes.mkdir(parents=True, exist_ok=True)
    report = run_folders.reporter(None, folders.launcher_log)
    report(f"workdir: {workdir}")
    resuming = _resume_line(decision.config, workdir)
    if resuming:
        report(resuming)
    launch = Launch(
        graph,
        decision.plan,
        decision.experiment,
        workdir,
        status_every=_STATUS_EVERY.value,
        group_resources=decision.group_resources,
    )
    _run_starts(workdir)
    code = engine_module.run(launch)
    report(_where_it_stands(decision.config, workdir, single_process=False))
    return code


def _run_on_hosts(make_experiment: MakeExperiment, config: Any, workdir: Path, name: str) -> int:
    """`--launcher hosts|slurm|kubernetes` (magi_lp.cluster.main), or `--render`."""
    from magi_lp.engines.base import HostsLaunch, Launch
    from magi_lp.runtime.loggers import LoggerFactory

    engine = engines.engine(_LAUNCHER.value)
    if engine.several_hosts and engine.stack == "ray":
        # The job's driver runs `--launcher ray`, which would refuse it once the job ran.
        engines.engine("ray").check_colocation(
            bool(config.colocate_learner_and_replay), launcher=engine.name
        )
    if not _DRY_RUN.value and not _RENDER.value:  # its cluster files are written here
        _check_workdir_can_be_made(workdir)
    if engine.several_hosts:
        _check_isolation_elsewhere(config, f"--launcher {engine.name}")
    experiment = None
    if reverb_carries_replay(engine):  # Launchpad on the hosts (on this stack: Ray's serves)
        experiment = _make(make_experiment, config, workdir)
        builder = experiment.builder
        _check_agent_tables(builder, resolve_store(builder, config), single_process=False)

    def build_program(plan: Any) -> Any:
        _use_cpu_only_here()
        from magi_lp.engines.launchpad_engine import to_program
        from magi_lp.runtime.program import build_program

        logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
        made = experiment or _make(make_experiment, config, workdir)
        interrupts.raise_if_swallowed()
        # Pickled for the hosts, which run it (the job's own launch): nothing runs here.
        _make_workdir(workdir, lock=False)
        graph = build_program(made, plan, workdir=str(workdir), logger_factory=logger_factory)
        return to_program(graph)

    hosts = HostsLaunch(
        config,
        launcher=engine.name,
        config_name=name,
        dry_run=_DRY_RUN.value,
        render_dir=_RENDER.value,
        build_program=build_program,
        command=shlex.join(sys.argv),
    )
    # `--render` with --launcher local (or none) reaches the hosts' engine too, which refuses
    # it in one line: its module is the cluster's, whichever engine was named.
    return _cluster().main.run(Launch(None, None, experiment, workdir, hosts=hosts))


def _run_single_process(
    make_experiment: MakeExperiment, validate_config: ValidateConfig | None = None
) -> int:
    """Checks, decides once and runs the experiment in this process (debugging, small
    machines), on the single-process engine."""
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
    decision = decide_single_process(make_experiment, config, workdir, build)
    for line in decision.lines:
        console.say(line)
    from magi_lp.engines.base import Launch
    from magi_lp.runtime.loggers import LoggerFactory

    logger_factory = LoggerFactory.from_config(str(workdir), config.logging)
    interrupts.raise_if_swallowed()
    _make_workdir(workdir)
    console.say(f"workdir: {workdir}")
    engine = engines.engine(engines.SINGLE_PROCESS)
    launch = Launch(
        None,
        None,
        decision.experiment,
        workdir,
        logger_factory=logger_factory,
        standing=lambda: _where_it_stands(decision.config, workdir, single_process=True),
    )
    _run_starts(workdir)
    return engine.load().run(launch)


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
