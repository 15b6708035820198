"""Starting the GPU check's worker processes, sampling their GPU memory (NVML, by pid),
and stopping them with nothing left behind.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, kill_marked, marked_env, tail
from benchmarks.gpu_check.settings import MIB, READY_TIMEOUT_S
from magi_lp.placement.gpu_inventory import process_memory_on_gpu


class NvmlProcesses:
    """GPU memory per pid (compute and graphics processes, summed over GPUs), from NVML."""

    def __init__(self, nvml: Any = None):
        if nvml is None:
            import pynvml as nvml
        self._nvml = nvml
        nvml.nvmlInit()
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]

    def by_pid(self) -> dict[int, float]:
        """pid -> MiB; -1.0 for a process NVML lists without an amount. A process with both a
        compute and a graphics context counts once on each GPU (`process_memory_on_gpu`)."""
        usage: dict[int, float] = {}
        for handle in self._handles:
            for pid, found in process_memory_on_gpu(self._nvml, handle).items():
                mib = -1.0 if found is None else found
                if usage.get(pid, 0.0) >= 0 and mib >= 0:
                    usage[pid] = usage.get(pid, 0.0) + mib
                else:
                    usage.setdefault(pid, mib)
        return usage

    def used_mib(self) -> list[float]:
        """Memory in use on each GPU (all processes, ours or not)."""
        return [self._nvml.nvmlDeviceGetMemoryInfo(h).used / MIB for h in self._handles]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


class Worker:
    """A running worker process and its status file."""

    def __init__(self, role: str, process: subprocess.Popen, status: Path, log: Path):
        self.role, self.process, self.status, self.log = role, process, status, log

    def state(self) -> dict:
        try:
            return json.loads(self.status.read_text())
        except (OSError, ValueError):
            exited = self.process.poll()
            if exited is not None:
                return {"state": "failed", "error": f"exit {exited}: {tail(self.log, 3)}"}
            return {"state": "starting"}


EnvHook = Callable[[dict[str, str], str], dict[str, str]]


class Workers:
    """Starts workers with given envs, waits for them, stops them; leaves nothing behind."""

    def __init__(
        self, root: Path, sizes: Mapping[str, Any], env_hook: EnvHook | None = None
    ) -> None:
        self.root, self.sizes, self.env_hook = root, sizes, env_hook
        self.mark = uuid.uuid4().hex
        self.running: list[Worker] = []
        self.started = 0

    def start(
        self,
        kind: str,
        role: str,
        overrides: Mapping[str, str] | None,
        until_stopped: bool = False,
        envs: int = 1,
    ) -> Worker:
        """Starts `--worker kind` with os.environ plus `overrides`, or, for None, with no
        managed variable at all (JAX's and CUDA's defaults); `until_stopped`: its workload
        runs until `stop`, not for the size's seconds; `envs`: an actor's batch of
        observations per call."""
        from magi_lp.placement.resources import MANAGED_VARIABLES

        env = marked_env(mark=self.mark)
        if overrides is None:
            for name in MANAGED_VARIABLES:
                env.pop(name, None)
        else:
            env.update(overrides)
        if self.env_hook is not None:
            env = self.env_hook(env, role)
        self.started += 1
        slug = f"{self.started:02d}_{role.replace(' ', '_')}"
        status, log = self.root / f"{slug}.json", self.root / f"{slug}.log"
        sizes = self.sizes
        command = [
            sys.executable, "-m", "benchmarks.gpu_check", "--worker", kind,
            "--status", str(status),
            "--seconds", str(3600.0 if until_stopped else sizes[f"{kind}_seconds"]),
            "--image", str(sizes["render_size" if kind == "render" else "image"]),
            "--batch", str(sizes["batch"]), "--envs", str(envs),
        ] + (["--tiny-net"] if sizes.get("tiny_net") else [])  # fmt: skip
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        worker = Worker(role, process, status, log)
        self.running.append(worker)
        return worker

    def wait_ready(self, workers: Sequence[Worker], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [w.state()["state"] for w in workers]
            if all(s != "starting" for s in states):
                return
            time.sleep(0.2)

    def wait_done(self, worker: Worker, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and worker.process.poll() is None:
            time.sleep(0.2)
        return self.stop(worker)

    def stop(self, worker: Worker) -> dict:
        """SIGTERM (the worker reports what it measured so far), SIGKILL after 30 s."""
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        if worker in self.running:
            self.running.remove(worker)
        return worker.state()

    def stop_all(self) -> None:
        for worker in list(self.running):
            self.stop(worker)
        kill_marked(self.mark)


def sample_peaks(
    nvml: NvmlProcesses, workers: Sequence[Worker], samples: int, every_s: float
) -> dict[int, float]:
    """Peak MiB per worker pid over a few samples (0.0: not listed by NVML)."""
    peaks = {w.process.pid: 0.0 for w in workers}
    for i in range(samples):
        usage = nvml.by_pid()
        for pid in peaks:
            if pid in usage:
                peaks[pid] = max(peaks[pid], usage[pid]) if usage[pid] >= 0 else -1.0
        if i + 1 < samples:
            time.sleep(every_s)
    return peaks
