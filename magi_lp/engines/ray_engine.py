"""`--launcher ray`: the program graph on Ray Core, one actor (one process) per node.

The run starts an embedded Ray on this machine (or joins the cluster `RAY_ADDRESS` names)
and stops it at the end. Each node of the graph becomes a threaded actor, created in the
graph's order (the counter first; the nodes whose handles are all made, together: the
actors and evaluators at once) and running as soon as it is made (the learner builds while
the nodes after it are made; the actors once every node is), with its launch group's env
from the plan through
`runtime_env` (in the process's environment before Python starts, as Launchpad's
`PythonProcess(env=)`) and its output in `<workdir>/nodes/<group>/<index>` (an earlier
launch's kept as `<index>.<launch>`; the driver's lines in `nodes/launcher.log`, dated, as a
Launchpad launch's: `magi_lp.launch.run_folders`). A `Ref` becomes
a `NodeClient`: synchronous calls of the node's public methods, as a Courier client makes.
The replay node serves the store's own server (`ReplayStore.make_server`: the device store's
step queue, a state agent's transition table); no Reverb.

The driver (this process) supervises by the Launchpad launcher's rules (`launch.stop_machine`):
- a node whose process dies is named with its log's last lines, and the program stops;
- SIGINT / SIGTERM / SIGHUP stop the program in tiers (`magi_lp.runtime.config.STOP_TIERS`:
  actors, evaluators and the coordinator, then the learner, which saves, then replay and
  counter): each node's `stop()` sets its lifetime's event; its `run()` returns, and its
  actor is ended; one still running after the notice is killed, which is reported as a fault;
- the coordinator's `stop_program()` at `max_actor_steps` asks the driver for that stop.

What the plan decides, Ray carries out: the GPUs a node sees are the plan's
(`CUDA_VISIBLE_DEVICES` in its env, which Ray is told to keep), Ray's GPU count of a node is
the number of the plan's GPUs it sees, a GPU that nodes share split evenly between them
(logical, so Ray's scheduling agrees), CPU threads are
the plan's env (Ray's `num_cpus` stays 0: the plan, not Ray, decides where threads go).

Left behind: nothing. Ray's session folder lives in a private temporary folder removed at the
end; the cluster's token is made for the run and lives only in its processes' environment
(no `~/.ray/auth_token`); the embedded Ray binds to loopback; what a node started and left
running is swept at the end (the launch's marker in its env, `MAGI_LP_LAUNCH_ID`), as on
Launchpad.

The start honours a stop signal within a poll, and ends after `START_TIMEOUT_S` when Ray places
a node nowhere, naming what the cluster lacks.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from typing import Any, NoReturn

import ray

from magi_lp.config_schema import fact_refusal
from magi_lp.engines import ray_paths, ray_seam
from magi_lp.engines.base import Launch
from magi_lp.engines.ray_driver import (
    NODE_TMP,
    _Driver,
    _probe,
)
from magi_lp.errors import ConfigError
from magi_lp.launch import processes
from magi_lp.launch.supervisor import (
    KILL_WAIT_SECS,
    LAUNCH_ID_VAR,
    StopSignals,
)
from magi_lp.runtime.config import stop_tiers
from magi_lp.runtime.graph import ProgramGraph


def _start_ray(
    run_tmp: str, gpu_ids: tuple[int, ...], address: str | None, notice_secs: float = 10.0
) -> None:
    """Joins the cluster at `address`, or (None) starts Ray here in `run_tmp`; its processes
    outlast a lost GCS long enough for the stop in tiers (`notice_secs` a stage)."""
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
        "namespace": f"magi_lp_{secrets.token_hex(4)}",
    }
    if address:
        try:
            ray.init(address=address, **options)
        except ConnectionError as error:  # the cluster went away since the entry point's check
            _refuse_no_cluster(address, error)
        return
    # A token made for this run, in the environment Ray's processes inherit: token
    # authentication without ~/.ray/auth_token.
    ray_seam.use_run_token()
    with ray_seam.gpus_shown_to_raylet(gpu_ids), ray_seam.loopback_ray() as loopback:
        ray.init(
            _temp_dir=run_tmp,
            _node_ip_address=loopback,
            num_cpus=os.cpu_count() or 1,
            num_gpus=len(gpu_ids),
            # Ray runs its workers at nice 15 by default, below everything else on the machine;
            # the nodes are the run's work, as Launchpad's are (measured here under load: every
            # node actor at nice 15 beside the learning runs and the suite).
            _system_config={
                "worker_niceness": 0,
                # Ray's processes give up 60 s after losing their GCS (the driver's own client
                # exits then); a stop in tiers whose notices add up to more would be cut.
                ray_seam.GCS_RECONNECT_KEY: max(60.0, _STOP_STAGES * notice_secs + 30),
                # No dashboard reads them: the reports cost every Ray process CPU per call and
                # per second (BENCHMARKS.md, "Served acting").
                ray_seam.TASK_EVENTS_KEY: 0,
            },
            **options,
        )


_STOP_STAGES = len(set(stop_tiers(several_hosts=False).values()))
"""The stages of a stop on one machine, each up to the termination notice."""


def resolve_cluster_address(address: str) -> str | None:
    """host:port of `RAY_ADDRESS`'s cluster (`auto` resolved as `ray.init` does); one
    refusal where no cluster runs on this machine."""
    try:
        return ray_seam.bootstrap_address(address)
    except ConnectionError as error:
        _refuse_no_cluster(address, error)


def _refuse_no_cluster(address: str, error: BaseException) -> NoReturn:
    raise ConfigError(
        fact_refusal(
            f"RAY_ADDRESS={address}",
            str(error).split(". ", 1)[0],
            "start the cluster first (ray start --head), or unset RAY_ADDRESS to start Ray "
            "for this run alone",
        )
    ) from None


def check(graph: ProgramGraph) -> None:
    """Refuses what this engine cannot run, before Ray starts (the entry point has checked
    the config already; this is for a graph built otherwise)."""
    from magi_lp.engines import engine

    engine("ray").check_colocation(any(spec.colocate_with is not None for spec in graph.nodes))


def _sweep(launch_id: str, driver: _Driver | None) -> None:
    """Kills what the nodes started and left running on this machine (the processes with the
    launch's marker, `_node_env`), as a Launchpad launch does; names those that are not a
    node's own process (those end with Ray, which was just shut down)."""
    nodes = set() if driver is None else {node.pid for *_, node in driver.status_nodes()}
    left = processes.processes_marked(LAUNCH_ID_VAR, launch_id)
    strays = processes.kill_processes(
        [p for p in left if p.pid not in nodes], wait_s=KILL_WAIT_SECS
    )
    processes.kill_processes([p for p in left if p.pid in nodes], wait_s=KILL_WAIT_SECS)
    if strays and driver is not None:
        driver.say(
            f"killed {len(strays)} processes that nodes had started and left running: "
            f"{', '.join(strays)}"
        )


def run(launch: Launch) -> int:
    """Runs the graph on Ray until it ends; returns the exit code (0: a normal stop)."""
    from magi_lp.runtime.probe import make_status_monitor

    check(launch.graph)
    signals = StopSignals()
    signals.install()
    from magi_lp.engines import engine

    address = engine("ray").cluster_address()  # RAY_ADDRESS, as the entry point read it
    run_tmp = ray_paths.run_temp_folder()
    node_tmp = None
    if not address:  # Ray started here: every node on this machine
        node_tmp = os.path.join(run_tmp, NODE_TMP)
        os.mkdir(node_tmp)
    saved_env = {k: os.environ.get(k) for k in ray_seam.AUTH_VARS}
    status = None
    driver = None
    launch_id = secrets.token_hex(8)
    try:
        started = time.monotonic()
        _start_ray(run_tmp, launch.plan.inventory.ids(), address, launch.termination_notice_secs)
        signals.install()  # Ray's start may have put its own handlers in place
        driver = _Driver(launch, signals, node_tmp, launch_id)
        if not address:
            driver.watch_ray()
        driver.start()
        if signals.received and not driver.status_nodes():
            # The stop came while Ray started: no node ran, so nothing is stopped, sampled or
            # written (the status table would have been an empty one in the workdir).
            name = signal.Signals(signals.received[0]).name
            driver.say(f"received {name} while Ray started: no node was started; Ray stopped")
            return 0
        if driver.start_failure is not None:
            if not driver.status_nodes():
                driver.say(f"no node was started; exit code 1 ({driver.start_failure})")
                return 1
            return driver.supervise(lambda: None)  # no status table: the run never ran
        if not signals.received:
            driver.say(f"Ray and every node up in {time.monotonic() - started:.1f} s")
        status = make_status_monitor(
            _probe(driver, launch.workdir),
            launch.plan,
            launch.experiment,
            launch.workdir,
            plain_every_s=launch.status_every,
        )
        status.start(driver.status_nodes())
        return driver.supervise(status.final_sample)
    finally:
        if status is not None:
            with contextlib.suppress(Exception):
                status.stop()
        with contextlib.suppress(Exception):
            ray.shutdown()
        if not address:  # a joined cluster's machines are not this one
            _sweep(launch_id, driver)
        if driver is not None and driver.end_line is not None:
            driver.say(driver.end_line)  # the exit code, last, as on Launchpad
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(run_tmp, ignore_errors=True)
        signals.restore()
