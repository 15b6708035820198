"""Nodes and programs for the launcher's integration tests.

Node processes unpickle these classes by reference, so this module must be importable in
them: `launch_programs.py` puts this folder on PYTHONPATH, which the nodes inherit. It is a
top-level module rather than `tests.launcher_nodes` because `tests/` is not a package and a
namespace package called `tests` can be shadowed by any installed distribution that ships
one.

Every node writes `<out_dir>/reports/<group>_<index>.json` with its pid, the environment it
sees and, for JAX nodes, what JAX reports, so the test can check the per-group env and find
the processes to kill or to look for afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import launchpad as lp

TABLE = "probe"
PROBED_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "JAX_PLATFORMS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "LAUNCHER_TEST_GROUP",
    "PYTHONUNBUFFERED",
)
NUM_ACTORS = 2


def _plan_envs() -> dict[str, dict[str, str]]:
    """Each group's env from its resource spec, through the real placement plan.

    The replay group is deliberately left out of the plan: it must get no overrides.
    """
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.placement.plan import GroupRequest, make_plan
    from magi_lp.placement.resources import ResourceSpec

    specs = {
        "actor": GroupRequest(
            ResourceSpec.from_config(
                "actor",
                {
                    "device": "cpu",
                    "cpu_threads": 1,
                    "render": "none",
                    "env": {"LAUNCHER_TEST_GROUP": "actor"},
                },
            ),
            NUM_ACTORS,
        ),
        "learner": GroupRequest(
            ResourceSpec.from_config(
                "learner",
                {
                    "device": "gpu_if_available",
                    "cpu_threads": 2,
                    "env": {"LAUNCHER_TEST_GROUP": "learner"},
                },
            ),
            1,
        ),
    }
    plan = make_plan(specs, GpuInventory(reason="no GPU in the launcher tests"))
    return {group: dict(env) for group, env in plan.envs().items()}


ENVS = _plan_envs()
ACTOR_ENV = ENVS["actor"]
LEARNER_ENV = ENVS["learner"]
# Every variable any group sets, plus the test's own: what each node reports it sees.
PROBED_VARS = tuple(sorted({*PROBED_VARS, *ACTOR_ENV, *LEARNER_ENV}))


def reports_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "reports"


def write_report(out_dir: str, name: str, **info) -> None:
    """Writes one node's report atomically (the test polls for these files)."""
    folder = reports_dir(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    report = {
        "pid": os.getpid(),
        "time": time.time(),
        "env": {v: os.environ.get(v) for v in PROBED_VARS},
        **info,
    }
    partial = folder / f".{name}.json.partial"
    partial.write_text(json.dumps(report))
    partial.rename(folder / f"{name}.json")


def jax_view() -> dict:
    """What JAX reports inside this process."""
    import jax

    return {
        "platforms": sorted({d.platform for d in jax.devices()}),
        "backend": jax.default_backend(),
        "preallocate_seen": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
    }


def spawn_sleeper() -> int:
    """Starts a child process that would outlive its node; returns its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return child.pid


def replay_tables(out_dir: str):
    """The ReverbNode's table factory; it runs inside the replay process, so it reports."""
    import reverb

    write_report(out_dir, "replay_0")
    return [reverb.Table.queue(TABLE, max_size=100)]


class Actor:
    """Reports, writes one item to Reverb, then waits for the stop (or blocks in an RPC)."""

    def __init__(self, out_dir: str, index: int, replay, block_in_rpc: bool, spawn: bool):
        self._out_dir = out_dir
        self._index = index
        self._replay = replay
        self._block_in_rpc = block_in_rpc
        self._spawn = spawn

    def run(self) -> None:
        import numpy as np

        info = {"jax": jax_view()}
        # The dereferenced ReverbNode handle is already a reverb.Client.
        self._replay.insert([np.int32(self._index)], priorities={TABLE: 1.0})
        if self._spawn:
            info["child_pid"] = spawn_sleeper()
        write_report(self._out_dir, f"actor_{self._index}", **info)
        print(f"actor {self._index} is up", flush=True)
        if self._block_in_rpc:
            import courier
            import portpicker

            # Nothing listens there: a Courier call with no deadline waits forever, in
            # C++, where no Python signal handler can run.
            courier.Client(f"localhost:{portpicker.pick_unused_port()}").ping()
        lp.wait_for_stop()


class Learner:
    """Reports; with `stop_when_ready`, calls lp.stop() once every node has reported."""

    def __init__(self, out_dir: str, replay, stop_when_ready: bool):
        self._out_dir = out_dir
        self._replay = replay
        self._stop_when_ready = stop_when_ready

    def run(self) -> None:
        write_report(self._out_dir, "learner_0", jax=jax_view())
        print("learner is up", flush=True)
        if self._stop_when_ready:
            expected = ["replay_0", "learner_0"] + [f"actor_{i}" for i in range(NUM_ACTORS)]
            deadline = time.monotonic() + 120
            while True:
                reported = all(
                    (reports_dir(self._out_dir) / f"{n}.json").exists() for n in expected
                )
                size = self._replay.server_info()[TABLE].current_size
                if reported and size >= NUM_ACTORS:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nodes did not report in time (table size {size})")
                time.sleep(0.1)
            write_report(self._out_dir, "stop_requested", table_size=size)
            print("learner calls lp.stop()", flush=True)
            lp.stop()
        lp.wait_for_stop()


def build_program(scenario: str, out_dir: str) -> lp.Program:
    """The test program: replay, learner, NUM_ACTORS actors.

    Scenarios:
      stop:  the learner calls lp.stop() once all nodes reported and the table holds an
             item per actor; actor 1 then blocks forever in a Courier RPC and actor 0 has a
             child process of its own.
      serve: nothing stops by itself; actor 1 has a child process of its own. The test
             kills a node or signals the launcher.
    """
    if scenario not in ("stop", "serve"):
        raise ValueError(f"unknown scenario {scenario!r}")
    program = lp.Program("launcher_test")
    with program.group("replay"):
        replay = program.add_node(lp.ReverbNode(functools.partial(replay_tables, out_dir)))
    with program.group("learner"):
        program.add_node(lp.CourierNode(Learner, out_dir, replay, scenario == "stop"))
    with program.group("actor"):
        for index in range(NUM_ACTORS):
            if scenario == "stop":
                block, spawn = index == 1, index == 0
            else:
                block, spawn = False, index == 1
            program.add_node(lp.CourierNode(Actor, out_dir, index, replay, block, spawn))
    return program
