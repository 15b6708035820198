"""The GPUs on this machine, as NVML reports them, and "auto" GPU selection.

Ids are NVML indices, which follow PCI bus order; `spec_to_env` sets
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA numbers the GPUs the same way (its default,
"fastest first", would reorder a machine with mixed models). NVML ignores
CUDA_VISIBLE_DEVICES, so the inventory is the whole machine whatever the launching shell
exported.

Planning never needs a GPU: `query_inventory()` returns an empty inventory with the reason
when NVML or the GPUs are missing, and tests build inventories by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML saw it when the inventory was taken."""

    index: int
    pci_bus_id: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: float

    @property
    def memory_used_fraction(self) -> float:
        """Share of the GPU's memory already in use by other processes (0 if unknown)."""
        if self.memory_total_bytes <= 0:
            return 0.0
        return self.memory_used_bytes / self.memory_total_bytes

    @property
    def label(self) -> str:
        """ "id:model", the way plans and errors name a GPU."""
        return f"{self.index}:{self.name}"


@dataclasses.dataclass(frozen=True)
class GpuInventory:
    """The GPUs a plan may use.

    Attributes:
      gpus: the GPUs, by ascending index.
      reason: why the inventory is empty or incomplete ("" when NVML listed every GPU).
      driver_version: the NVIDIA driver's version ("560.35.03"), "" when unknown.
      cuda_driver_version: the newest CUDA the driver supports (12060 = 12.6), 0 when unknown.
    """

    gpus: tuple[GpuInfo, ...] = ()
    reason: str = ""
    driver_version: str = ""
    cuda_driver_version: int = 0

    def __post_init__(self) -> None:
        gpus = tuple(sorted(self.gpus, key=lambda g: g.index))
        if len({g.index for g in gpus}) != len(gpus):
            raise ValueError(f"GpuInventory: duplicate GPU indices in {gpus}")
        object.__setattr__(self, "gpus", gpus)

    def __len__(self) -> int:
        return len(self.gpus)

    def __iter__(self) -> Iterator[GpuInfo]:
        return iter(self.gpus)

    def ids(self) -> tuple[int, ...]:
        """The GPU ids present, ascending."""
        return tuple(g.index for g in self.gpus)

    def get(self, index: int) -> GpuInfo | None:
        """The GPU with NVML index `index`, or None when there is none."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def __getitem__(self, index: int) -> GpuInfo:
        gpu = self.get(index)
        if gpu is None:
            raise KeyError(f"no GPU {index}; GPUs present: {self.describe()}")
        return gpu

    def models(self) -> dict[str, tuple[int, ...]]:
        """Model name -> ids of the GPUs of that model."""
        out: dict[str, list[int]] = {}
        for gpu in self.gpus:
            out.setdefault(gpu.name, []).append(gpu.index)
        return {name: tuple(ids) for name, ids in out.items()}

    def describe(self) -> str:
        """One line for messages: "0:NVIDIA RTX 3060, 1:NVIDIA RTX 3080" or why there is none."""
        if not self.gpus:
            return f"none ({self.reason})" if self.reason else "none"
        return ", ".join(g.label for g in self.gpus)


def query_inventory(nvml: Any = None) -> GpuInventory:
    """Reads the GPUs through NVML (nvidia-ml-py).

    Args:
      nvml: the `pynvml` module, or a stand-in with the same functions (for tests).

    Returns:
      The GPUs, or an empty inventory whose `reason` says why (nvidia-ml-py missing, NVML
      library / driver missing, no devices). A GPU NVML fails to describe is left out and
      named in `reason`. Never raises for a missing GPU: planning decides whether that is
      an error.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # here, not at the top: planning must import without it
        except ImportError as err:
            return GpuInventory((), f"nvidia-ml-py is not installed ({err})")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return GpuInventory((), f"NVML is unavailable: {err} (no NVIDIA driver here?)")
    try:
        driver = _driver_versions(nvml)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as err:
            return GpuInventory((), f"NVML could not count GPUs: {err}", *driver)
        if count == 0:
            return GpuInventory((), "NVML found no GPU", *driver)
        gpus = []
        skipped = []
        for index in range(count):
            try:
                gpus.append(_read_gpu(nvml, index))
            except nvml.NVMLError as err:
                skipped.append(f"GPU {index} left out: {err}")
        reason = "; ".join(skipped)
        if not gpus:
            reason = f"NVML found {count} GPU(s) but could not read any: {reason}"
        return GpuInventory(tuple(gpus), reason, *driver)
    finally:
        # Shutting down a library we are done with: a failure leaves nothing to recover.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _text(value: Any) -> str:
    # Older nvidia-ml-py versions return bytes for names and bus ids.
    return value.decode() if isinstance(value, bytes) else str(value)


def _driver_versions(nvml: Any) -> tuple[str, int]:
    """(driver version, CUDA version it supports); ("", 0) for what NVML cannot tell."""
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except (nvml.NVMLError, AttributeError):
        driver = ""
    cuda = 0
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        try:
            cuda = int(getattr(nvml, name)())
            break
        except (nvml.NVMLError, AttributeError):
            continue
    return driver, cuda


def _read_gpu(nvml: Any, index: int) -> GpuInfo:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        utilization = 0.0  # not supported on some boards; memory still ranks them
    return GpuInfo(
        index=index,
        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total_bytes=int(memory.total),
        memory_used_bytes=int(memory.used),
        utilization_percent=utilization,
    )


def _load(gpu: GpuInfo, extra_load: Mapping[int, float] | None) -> tuple[float, float]:
    extra = extra_load.get(gpu.index, 0.0) if extra_load else 0.0
    return (gpu.memory_used_fraction + extra, gpu.utilization_percent)


def rank_by_load(
    inventory: GpuInventory, extra_load: Mapping[int, float] | None = None
) -> tuple[GpuInfo, ...]:
    """The GPUs, least loaded first: by used memory fraction, then utilisation, then id.

    Args:
      inventory: the GPUs.
      extra_load: memory fraction already planned per GPU id (counted as used), so that
        successive "auto" groups spread over the GPUs instead of piling onto one.
    """
    return tuple(sorted(inventory.gpus, key=lambda g: (*_load(g, extra_load), g.index)))


def pick_identical(
    inventory: GpuInventory, count: int, extra_load: Mapping[int, float] | None = None
) -> tuple[int, ...]:
    """The least-loaded set of `count` GPUs of one model (what pmap needs).

    Within each model the `count` least-loaded GPUs form the candidate set; across models
    the set whose busiest GPU is least busy wins (then the next busiest, ...), because
    pmap steps all its GPUs together and runs at the pace of the slowest.

    Returns:
      The chosen ids, ascending.

    Raises:
      ConfigError: count < 1, or no model has `count` GPUs (names the models present).
    """
    if count < 1:
        raise ConfigError(refusal("the GPU count", "an integer >= 1", count, "ask for at least 1"))
    best: tuple[Any, ...] | None = None
    chosen: tuple[int, ...] = ()
    for ids in inventory.models().values():
        if len(ids) < count:
            continue
        members = [inventory[i] for i in ids]
        picked = sorted(members, key=lambda g: (*_load(g, extra_load), g.index))[:count]
        loads = sorted((_load(g, extra_load) for g in picked), reverse=True)
        score = (tuple(loads), tuple(sorted(g.index for g in picked)))
        if best is None or score < best:
            best = score
            chosen = score[1]
    if best is None:
        present = (
            ", ".join(
                f"{len(ids)} x {name} (ids {list(ids)})" for name, ids in inventory.models().items()
            )
            or inventory.describe()
        )
        raise ConfigError(
            fact_refusal(
                f"no {count} identical GPUs on this machine",
                f"the GPUs present are {present}",
                "ask for fewer GPUs, or list ids of one model",
            )
        )
    return chosen


def process_memory_on_gpu(nvml: Any, handle: Any) -> dict[int, float | None]:
    """pid -> MiB of each process on one GPU, from NVML's compute and graphics lists; None
    where the driver hides the amount.

    A process with both a compute and a graphics context (nvidia-smi's "C+G": an actor that
    steps JAX on the GPU and renders through EGL there) is in both lists with its one figure,
    so it counts once: summed, the H200's actors read twice their memory (2,775 MiB where
    nvidia-smi's single figure is half that). A list the board does not support is skipped.
    """
    found: dict[int, float | None] = {}
    for query in (
        nvml.nvmlDeviceGetComputeRunningProcesses,
        nvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        try:
            processes = query(handle)
        except Exception:  # NVMLError (Not Supported), or the board is gone
            continue
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            mib = None if used is None else used / 2**20
            known = found.get(process.pid)
            found[process.pid] = mib if known is None else max(known, mib or 0.0)
    return found


def gpu_memory_by_pid(nvml: Any = None) -> dict[int, float]:
    """GPU memory each process holds, in MiB summed over GPUs (empty without NVML).

    Reads compute and graphics processes of every GPU (each process once per GPU:
    `process_memory_on_gpu`); for the launcher's status view.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # lazily: only a machine with a GPU pays for it
        except ImportError:
            return {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return {}
    used: dict[int, float] = {}
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for pid, mib in process_memory_on_gpu(nvml, handle).items():
                used[pid] = used.get(pid, 0.0) + (mib or 0.0)  # None: hidden by the driver
    except nvml.NVMLError:
        pass
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return used
