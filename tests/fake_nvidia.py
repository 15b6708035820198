"""Stand-ins for what this machine lacks: an NVIDIA driver, its GPUs and JAX's CUDA plugin.

Subprocess tests put a folder made here first on PYTHONPATH (a fake `pynvml` module, a fake
`jax_plugins/xla_cuda12` package) or first on PATH (a fake `nvidia-smi`), so the real code
under test (set-up chooser, placement plan, node set-up, GPU check) reads a driver and GPUs
that are not there. Nothing here is imported by the code under test.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from magi_lp.placement.gpu_inventory import GpuInfo, GpuInventory
from magi_lp.placement.jax_build import CudaPlugin, JaxBuild

GiB = 1024**3
RTX3060 = "NVIDIA GeForce RTX 3060"
RTX3080 = "NVIDIA GeForce RTX 3080"
H100 = "NVIDIA H100 80GB HBM3"
NO_GPU = GpuInventory((), "NVML is unavailable: NVML Shared Library Not Found")
CUDA12 = JaxBuild("0.4.30", (CudaPlugin("jax_plugins.xla_cuda12", 12, "0.4.30"),))
"""What `make setup` installs on a CUDA 12 machine (JAX with its CUDA 12 plugin)."""
CPU_ONLY = JaxBuild("0.4.30")


def gpu(
    index: int, name: str = RTX3080, used_gib: float = 0.0, util: float = 0.0, total_gib: float = 12
) -> GpuInfo:
    """One GPU of an injected inventory (the placement logic's view of an NVML device)."""
    return GpuInfo(
        index=index,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        name=name,
        memory_total_bytes=int(total_gib * GiB),
        memory_used_bytes=int(used_gib * GiB),
        utilization_percent=util,
    )


_FAKE_PYNVML = '''"""Fake pynvml (nvidia-ml-py) for tests: the machine is in fake_nvml.json."""
import json as _json
import os as _os

with open(_os.path.join(_os.path.dirname(__file__), "fake_nvml.json")) as _f:
    _M = _json.load(_f)


class NVMLError(Exception):
    pass


def _check():
    if _M["init_error"]:
        raise NVMLError(_M["init_error"])


def nvmlInit():
    _check()


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    _check()
    return _M["driver"]


def nvmlSystemGetCudaDriverVersion():
    _check()
    return _M["cuda"]


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlDeviceGetCount():
    _check()
    return len(_M["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    return index


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def nvmlDeviceGetMemoryInfo(handle):
    g = _M["gpus"][handle]
    return _Obj(total=g["total"], used=g["used"], free=g["total"] - g["used"])


def nvmlDeviceGetUtilizationRates(handle):
    return _Obj(gpu=0, memory=0)


def nvmlDeviceGetPciInfo(handle):
    return _Obj(busId=f"00000000:{handle + 1:02X}:00.0")


def nvmlDeviceGetName(handle):
    return _M["gpus"][handle]["name"]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [_Obj(pid=p, usedGpuMemory=m) for p, m in _M["processes"].get(str(handle), [])]


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return []
'''


def write_fake_pynvml(
    folder: Path,
    *,
    gpus: Sequence[tuple[str, float]] = (),
    driver: str = "560.35.03",
    cuda: int = 12060,
    init_error: str = "",
) -> Path:
    """Writes `pynvml.py` into `folder`: a driver `driver` (CUDA `cuda`) with `gpus`
    [(name, total GiB)], or, with `init_error`, an NVML that fails to start like the real
    one does without a driver ("NVML Shared Library Not Found")."""
    folder.mkdir(parents=True, exist_ok=True)
    machine = {
        "init_error": init_error,
        "driver": driver,
        "cuda": cuda,
        "gpus": [{"name": n, "total": int(t * GiB), "used": 0} for n, t in gpus],
        "processes": {},
    }
    (folder / "fake_nvml.json").write_text(json.dumps(machine))
    (folder / "pynvml.py").write_text(_FAKE_PYNVML)
    return folder


def write_fake_cuda_plugin(folder: Path, *, with_nvcc: bool = False) -> Path:
    """Writes an empty `jax_plugins/xla_cuda12` package into `folder` (what makes
    `detect_jax_build` see a CUDA 12 build), and with `with_nvcc` the folder of the pinned
    nvcc wheel (`nvidia/cuda_nvcc/bin/ptxas`)."""
    plugin = folder / "jax_plugins" / "xla_cuda12"
    plugin.mkdir(parents=True, exist_ok=True)
    (plugin / "__init__.py").write_text("")
    if with_nvcc:
        ptxas = folder / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
        ptxas.parent.mkdir(parents=True, exist_ok=True)
        ptxas.write_text("#!/bin/sh\nexit 0\n")
        ptxas.chmod(0o755)
    return folder


def write_fake_nvidia_smi(folder: Path, *, driver: str = "", fail: str = "") -> Path:
    """Writes an executable `nvidia-smi` into `folder` that answers
    `--query-gpu=driver_version --format=csv,noheader` with `driver` (one line per GPU), or
    fails like nvidia-smi without a loaded driver when `fail` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    if fail:
        body = f"echo {json.dumps(fail)}\nexit 9\n"
    else:
        body = f'case "$*" in *driver_version*) echo {driver};; *) echo "NVIDIA-SMI";; esac\n'
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def env_with(
    base: dict[str, str] | None = None,
    *,
    pythonpath: Sequence[Path | str] = (),
    path: Sequence[Path | str] = (),
) -> dict[str, str]:
    """`base` (default os.environ) with folders put first on PYTHONPATH and PATH."""
    env = dict(os.environ if base is None else base)
    if pythonpath:
        rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), *rest])
    if path:
        env["PATH"] = os.pathsep.join([*(str(p) for p in path), env.get("PATH", "")])
    return env


DRQ_LP_MAIN = "projects/drq_v2/lp_main.py"
"""`make run`'s entry point, and its config."""
DRQ_CONFIG = "configs/reacher_hard_distributed.py"


def lp_main_on_fake_gpus(
    tmp_path: Path,
    args: Sequence[str],
    *,
    plugin: bool = True,
    gpus: int = 1,
    config: str = DRQ_CONFIG,
    timeout: float = 120,
) -> tuple[subprocess.CompletedProcess, Path]:
    """DrQ-v2's `lp_main.py` with `config` and `args` on `gpus` fake 80 GB H100s (NVML), and
    with `plugin` a fake CUDA plugin for JAX; returns the result and the run's workdir."""
    from tests.e2e_utils import REPO

    fakes = write_fake_pynvml(tmp_path / "nvml", gpus=[(H100, 80)] * gpus)
    folders = [fakes]
    if plugin:
        folders.append(write_fake_cuda_plugin(tmp_path / "plugin"))
    workdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, DRQ_LP_MAIN, "--config", config, "--workdir", str(workdir), *args],
        cwd=REPO,
        env=env_with(pythonpath=[*folders, REPO]),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, workdir
