"""The fault table's toy program (tests/test_fault_table.py), one graph for every engine.

    python tests/fault_toys.py <engine> <out_dir> <scenario> <notice_secs>

runs the graph through the real engine (`magi_lp.engines.engine(<engine>).load().run`) in
this process and exits with its code, so the test can signal and SIGKILL it as a user would
(Launchpad's and Ray's signal handlers never touch the pytest process). The graph, built as
`magi_lp.runtime.program.build_program` builds the real one (`ProgramGraph`, `NodeSpec`): a
counter, a replay (a Reverb queue on Launchpad, a served object on Ray), a learner that
'saves' for `SAVE_S` at its stop (so the hurry and the lost save show) and an actor; no JAX.

Scenarios: `plain`; `leave` (the actor starts a process in a session of its own and leaves it
running: only the end's sweep finds it); `stubborn` (the actor does not end at its stop);
`unschedulable` (the plan gives the learner GPU 1,
which this machine lacks: Ray asks for a GPU for it and never places it, as a joined cluster
short of the plan's GPUs would).

Nodes unpickle this module's classes by reference: `main` puts this folder on PYTHONPATH,
which every node inherits. Each node writes `<out_dir>/reports/<name>.json` as it runs (its pid,
the launch's marker, what it left running; the replay as it makes its tables or server), the
counter and the actor `<name>.made.json` once made (Ray runs a wave's nodes once all of them
are made); the learner writes `saving.json` as its save begins and `saved.json` once whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

_HERE = Path(__file__).resolve().parent
SAVE_S = 6.0
"""How long the learner's final save takes: long enough for two more Ctrl-Cs during it."""
GROUPS = ("counter", "replay", "learner", "actor")
LAUNCH_ID_VAR = "MAGI_LP_LAUNCH_ID"  # the engines' marker (magi_lp.launch.supervisor)


def report(folder: str, name: str, **info) -> None:
    """Writes `<folder>/<name>.json` atomically (the test polls for it)."""
    data = {"pid": os.getpid(), "launch_id": os.environ.get(LAUNCH_ID_VAR), **info}
    partial = Path(folder) / f".{name}.partial"
    partial.write_text(json.dumps(data))
    partial.rename(Path(folder) / f"{name}.json")


def say(text: str) -> None:
    print(text, flush=True)


class Counter:
    """Counts nothing; answers the status view's question."""

    def __init__(self, folder: str, *, lifetime):
        self._folder, self._lifetime = folder, lifetime
        report(folder, "counter_0.made")

    def get_counts(self) -> dict:
        return {"actor_steps": 0, "learner_steps": 0}

    def run(self) -> None:
        report(self._folder, "counter_0")
        self._lifetime.wait_for_stop(None)
        self._lifetime.leave()


class Learner:
    """Waits for the stop, then 'saves' for `SAVE_S` seconds, holding its process's exit for
    it as the real learner does (`hold_exit`: Launchpad's stop watcher would leave the process
    after its 1 s budget otherwise)."""

    def __init__(self, folder: str, *, lifetime):
        self._folder, self._lifetime = folder, lifetime

    def run(self) -> None:
        from magi_lp.launch.node_lifetime import hold_exit

        with hold_exit("the toy learner's final save"):
            report(self._folder, "learner_0")
            say("learner is up")
            self._lifetime.wait_for_stop(None)
            say("learner: writing its final save")
            report(self._folder, "saving")
            time.sleep(SAVE_S)
            report(self._folder, "saved")
            say("learner: final save written")
        self._lifetime.leave()


class Actor:
    """Waits for the stop. `leave`: first starts `sleep` in a session of its own (by a shell
    that exits at once), which neither the node's end nor Ray's reaches. `stubborn`: never
    ends at its stop (as one stuck in a C++ call): SIGTERM ignored (Launchpad's stop watcher
    never wakes), and `run` never returns."""

    def __init__(self, folder: str, mode: str, *, lifetime):
        self._folder, self._lifetime, self._mode = folder, lifetime, mode
        self._left = None
        if mode == "leave":
            started = subprocess.run(
                ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!"],
                capture_output=True,
                text=True,
                check=True,
            )
            self._left = int(started.stdout.strip())
        if mode == "stubborn":
            with contextlib.suppress(ValueError):  # Ray makes nodes off the main thread
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        report(folder, "actor_0.made")

    def run(self) -> None:
        report(self._folder, "actor_0", left=self._left)
        say("actor is up")
        if self._mode == "stubborn":
            while True:
                time.sleep(1)
        self._lifetime.wait_for_stop(None)
        self._lifetime.leave()


class ToyServer:
    """What the replay node serves on Ray: nothing but its numbers."""

    def info(self) -> dict:
        return {"size": 0, "inserted": 0}

    def close(self) -> None:
        pass


class ToyStore:
    """The graph's replay store: a Reverb queue (Launchpad's replay node), or `ToyServer`
    (Ray's); the replay node reports as it makes either."""

    def __init__(self, folder: str):
        self.folder = folder

    def make_tables(self, environment_spec) -> list:
        import reverb

        report(self.folder, "replay_0")
        return [reverb.Table.queue("toy", max_size=10)]

    def make_server(self, environment_spec) -> ToyServer:
        report(self.folder, "replay_0")
        return ToyServer()


def make_launch(out_dir: Path, scenario: str, notice_secs: float):
    """The toy graph as a `Launch`: every group on the CPU, no GPU in the inventory."""
    from magi_lp.engines.base import Launch
    from magi_lp.placement.gpu_inventory import GpuInventory
    from magi_lp.runtime.graph import NodeSpec, ProgramGraph, ReplaySpec

    folder = str(out_dir / "reports")
    workdir = out_dir / "work"
    store = ToyStore(folder)
    replay = ReplaySpec(store, None, str(workdir), checkpoint_at_stop=False)
    nodes = [
        NodeSpec("counter", 0, "counter", Counter, (folder,)),
        NodeSpec("replay", 0, "replay", replay=replay),
        NodeSpec("learner", 0, "learner", Learner, (folder,)),
        NodeSpec("actor", 0, "actor", Actor, (folder, scenario)),
    ]
    envs = {g: {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"} for g in GROUPS}
    if scenario == "unschedulable":
        envs["learner"]["CUDA_VISIBLE_DEVICES"] = "1"  # Ray asks for 1 GPU for it
    plan = types.SimpleNamespace(envs=lambda: envs, inventory=GpuInventory(()))
    experiment = types.SimpleNamespace(
        config=types.SimpleNamespace(max_actor_steps=1), frames_per_step=1
    )
    return Launch(
        ProgramGraph("fault_toys", nodes, store=store),
        plan,
        experiment,
        workdir,
        status_every=3600.0,
        termination_notice_secs=notice_secs,
    )


def main(argv: list[str]) -> int:
    engine_name, out_dir, scenario, notice = argv[1], Path(argv[2]), argv[3], float(argv[4])
    (out_dir / "reports").mkdir(parents=True, exist_ok=True)
    (out_dir / "work").mkdir(parents=True, exist_ok=True)
    # Nodes unpickle this module's classes by reference: they inherit this.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_HERE), str(_HERE.parent), os.environ.get("PYTHONPATH", "")) if p
    )
    from magi_lp.engines import engine

    return engine(engine_name).load().run(make_launch(out_dir, scenario, notice))


if __name__ == "__main__":
    sys.path[:0] = [str(_HERE), str(_HERE.parent)]
    import fault_toys  # this file as the module the nodes import, not as __main__

    sys.exit(fault_toys.main(sys.argv))
