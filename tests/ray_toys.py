"""Toy nodes for the Ray engine's tests: each reports what its process sees, then waits.

Ray's workers unpickle these classes by reference: the tests put this folder on sys.path, and
the engine hands the driver's sys.path to every node (`ray_driver._node_env`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROBED = ("CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS", "OMP_NUM_THREADS", "TOY_GROUP")


class Reporter:
    """Writes `<folder>/<name>.json`: its env, pid, the GPUs Ray counted for it and the
    address its Ray node has."""

    def __init__(self, folder: str, name: str, *, lifetime):
        import ray

        self._lifetime = lifetime
        report = {
            "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in PROBED},
            "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "jax_imported": "jax" in __import__("sys").modules,
            "tempdir": __import__("tempfile").gettempdir(),
            "node_ip": ray.util.get_node_ip_address(),
        }
        partial = Path(folder) / f".{name}.partial"
        partial.write_text(json.dumps(report))
        partial.rename(Path(folder) / f"{name}.json")

    def ping(self) -> str:
        return "pong"

    def run(self) -> None:
        self._lifetime.wait_for_stop(None)


class Stopper:
    """Stops the program once every reporter has written and answered through its handle."""

    def __init__(self, folder: str, names: list[str], *handles, lifetime):
        self._folder = Path(folder)
        self._names = names
        self._handles = handles
        self._lifetime = lifetime

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not all((self._folder / f"{n}.json").exists() for n in self._names):
            if time.monotonic() > deadline or self._lifetime.wait_for_stop(0.1):
                return
        answers = [handle.ping() for handle in self._handles]
        (self._folder / "answers.json").write_text(json.dumps(answers))
        (self._folder / "listening.json").write_text(json.dumps(ray_listening()))
        self._lifetime.stop_program()
        self._lifetime.wait_for_stop(None)


class Broken:
    """A node whose making fails (as a node's constructor can, on its own machine)."""

    def __init__(self, folder: str, name: str, *, lifetime):
        print("building the broken node", flush=True)
        raise RuntimeError("the broken node cannot be made")


class Stubborn:
    """A node that does not end at a stop (as one stuck in a C++ call): it reports, then
    sleeps until killed."""

    def __init__(self, folder: str, name: str, *, lifetime):
        self._path = Path(folder) / f"{name}.json"

    def run(self) -> None:
        self._path.write_text(json.dumps({"pid": os.getpid()}))
        while True:
            time.sleep(1)


def ray_listening() -> list[dict]:
    """The TCP and UDP sockets every process of this Ray listens on: the driver (the raylet's
    parent, for an embedded Ray), and every process below it: Ray's GCS, raylet, agents and
    workers (the nodes)."""
    import socket

    import psutil

    driver = psutil.Process(os.getppid()).parent()  # this worker's raylet's parent
    found = []
    for proc in [driver, *driver.children(recursive=True)]:
        try:
            name = proc.name()
            sockets = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        for sock in sockets:
            if sock.status == psutil.CONN_LISTEN or (sock.type == socket.SOCK_DGRAM and sock.laddr):
                found.append({"pid": proc.pid, "name": name, "ip": sock.laddr.ip})
    return found


class Leaver:
    """A node that starts a process and leaves it running when it ends (a daemon, say):
    `sleep` in a session of its own, started by a shell that exits at once. Ray ends what stays
    in a worker's process group with it (a plain `sleep &` died with the node); this one it
    does not reach."""

    def __init__(self, folder: str, name: str, *, lifetime):
        import subprocess

        self._lifetime = lifetime
        started = subprocess.run(
            ["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 </dev/null & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        report = {"pid": os.getpid(), "left": int(started.stdout.strip())}
        (Path(folder) / f"{name}.json").write_text(json.dumps(report))

    def run(self) -> None:
        self._lifetime.wait_for_stop(None)
