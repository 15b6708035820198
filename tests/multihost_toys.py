"""A small Launchpad program (no TensorFlow) for the multi-host launch tests.

    python tests/multihost_toys.py <normal|crash|raise> <out_dir>

prepares the job of a three-group program on two loopback "hosts" in `<out_dir>` (the
pickled program in `<out_dir>/job`, the per-host scripts in `<out_dir>/scripts`), as
`lp_main.py --launcher hosts` does for a real agent: a `server` (Courier, host h1), two
`worker`s that call it in a loop (host h2) and a `coordinator` (h1) that calls `lp.stop()`
after STOP_AFTER_S in the `normal` scenario. In the `crash` scenario worker 1 exits with
code 3 after CRASH_AFTER_S instead (no word to anyone: a killed node) and the coordinator
never stops by itself; in `raise` worker 1's `run` raises then (its node runner says so to
the coordinator as it leaves).

Node processes unpickle this module's classes by reference, so it is a top-level module and
this folder is put on PYTHONPATH (as tests/launch_programs.py does).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import launchpad as lp

STOP_AFTER_S = 3.0
CRASH_AFTER_S = 2.0
PORT = 24100
HOSTS = {"h1": "127.0.0.2", "h2": "127.0.0.3"}


class Server:
    """Answers pings until the program stops."""

    def ping(self) -> str:
        return "pong"


class Worker:
    """Pings the server until told to stop; worker 1 exits with code 3 (`crash` "exit") or
    raises (`crash` "raise") after CRASH_AFTER_S."""

    def __init__(self, server, index: int, crash: str):
        self._server = server
        self._index = index
        self._crash = crash

    def run(self) -> None:
        crashes = bool(self._crash) and self._index == 1
        _ping_until_stopped(self._server, 0.1, CRASH_AFTER_S, self._fail if crashes else None)

    def _fail(self) -> None:
        print("worker 1 crashes on purpose", flush=True)
        if self._crash == "raise":
            raise RuntimeError("worker 1 fails on purpose")
        os._exit(3)


class Coordinator:
    """Stops the program after STOP_AFTER_S (never, with `stop=False`)."""

    def __init__(self, server, stop: bool):
        self._server = server
        self._stop = stop

    def run(self) -> None:
        _ping_until_stopped(self._server, 0.2, STOP_AFTER_S, lp.stop if self._stop else None)


def _ping_until_stopped(server, period_s: float, after_s: float, then=None) -> None:
    """Pings `server` every `period_s` until the program stops. With `then`, calls it once
    `after_s` have passed (it crashes the node, or stops the program) and returns."""
    start = time.monotonic()
    while not lp.wait_for_stop(period_s):
        server.ping()
        if then is not None and time.monotonic() - start > after_s:
            then()
            return


def make_program(scenario: str) -> lp.Program:
    program = lp.Program("toy")
    with program.group("server"):
        server = program.add_node(lp.CourierNode(Server))
    with program.group("worker"):
        for index in range(2):
            crash = {"crash": "exit", "raise": "raise"}.get(scenario, "")
            program.add_node(lp.PyClassNode(Worker, server, index, crash))
    with program.group("coordinator"):
        program.add_node(lp.CourierNode(Coordinator, server, scenario == "normal"))
    return program


def make_job(out_dir: Path):
    from magi_lp.cluster import job as cluster

    def group(name, host, ports, tier, count=1):
        nodes = tuple(
            cluster.ClusterNode(name, task, host, ports[task] if ports else (), tier)
            for task in range(count)
        )
        return cluster.ClusterGroup(name, host, {"TOY_GROUP": name}, nodes, summary=f"{name} toy")

    return cluster.ClusterJob(
        engine="hosts",
        name="toy",
        hosts=tuple(cluster.ClusterHost(name, address) for name, address in HOSTS.items()),
        groups=(
            group("server", "h1", [(PORT,)], 1),
            group("worker", "h2", None, 0, count=2),
            group("coordinator", "h1", [(PORT + 1, PORT + 2)], 2),
        ),
        coordinator="coordinator/0",
        paths=cluster.JobPaths(
            python=sys.executable,
            project_dir=str(Path(__file__).resolve().parents[1]),
            workdir=str(out_dir),
            job_dir=str(out_dir / "job"),
            log_dir=str(out_dir / "nodes"),
        ),
        stop=cluster.StopSettings(
            poll_seconds=0.2,
            notice_seconds=5.0,
            heartbeat_timeout_seconds=2.0,
            start_timeout_seconds=60.0,
        ),
    )


def main(argv: list[str]) -> int:
    from magi_lp.cluster.host_scripts import render_host_scripts
    from magi_lp.cluster.prepare import prepare_job

    scenario, out_dir = argv[1], Path(argv[2])
    job = make_job(out_dir)
    prepare_job(make_program(scenario), job)
    scripts = out_dir / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    for name, text in render_host_scripts(job).items():
        (scripts / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
