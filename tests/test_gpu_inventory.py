"""GPU inventory: NVML reading (real on this machine, faked for GPUs) and "auto" picks."""

import glob

import pytest

from magi_lp.errors import ConfigError
from magi_lp.placement.gpu_inventory import (
    GpuInventory,
    gpu_memory_by_pid,
    pick_identical,
    process_memory_on_gpu,
    query_inventory,
    rank_by_load,
)
from tests.fake_nvidia import RTX3060, RTX3080, GiB, gpu

# --- query_inventory --------------------------------------------------------------------


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="this machine has a GPU")
def test_query_inventory_without_gpu_is_empty_with_reason():
    inventory = query_inventory()  # the real NVML path: no driver library here
    assert len(inventory) == 0
    assert "NVML" in inventory.reason
    assert inventory.describe().startswith("none (")


class _NvmlError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml that query_inventory uses."""

    NVMLError = _NvmlError

    def __init__(self, devices, init_error=None, broken=(), no_util=()):
        self.devices = devices
        self.init_error = init_error
        self.broken = broken
        self.no_util = no_util
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802 - pynvml's names
        if self.init_error:
            raise _NvmlError(self.init_error)

    def nvmlShutdown(self):  # noqa: N802 - pynvml's names
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802 - pynvml's names
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802 - pynvml's names
        if index in self.broken:
            raise _NvmlError("GPU is lost")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802 - pynvml's names
        d = self.devices[handle]
        return type("Mem", (), {"total": d["total"], "used": d["used"]})()

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802 - pynvml's names
        if handle in self.no_util:
            raise _NvmlError("Not Supported")
        return type("Util", (), {"gpu": self.devices[handle]["util"]})()

    def nvmlDeviceGetPciInfo(self, handle):  # noqa: N802 - pynvml's names
        return type("Pci", (), {"busId": self.devices[handle]["bus"]})()

    def nvmlDeviceGetName(self, handle):  # noqa: N802 - pynvml's names
        return self.devices[handle]["name"]


def _device(name, bus, used=1 * GiB, util=10):
    return {"name": name, "bus": bus, "total": 12 * GiB, "used": used, "util": util}


def test_query_inventory_reads_every_gpu_and_shuts_nvml_down():
    nvml = FakeNvml(
        [_device(RTX3060.encode(), b"00000000:01:00.0"), _device(RTX3080, "00000000:02:00.0")],
        no_util=(1,),
    )
    inventory = query_inventory(nvml)
    assert inventory.ids() == (0, 1)
    assert inventory[0].name == RTX3060  # bytes from old nvidia-ml-py are decoded
    assert inventory[0].pci_bus_id == "00000000:01:00.0"
    assert inventory[0].memory_used_fraction == pytest.approx(1 / 12)
    assert inventory[0].utilization_percent == 10.0
    assert inventory[1].utilization_percent == 0.0  # unsupported counter, not a failure
    assert inventory.reason == ""
    assert nvml.shutdowns == 1


def test_query_inventory_reports_why_it_is_empty_or_incomplete():
    no_driver = FakeNvml([], init_error="Driver Not Loaded")
    assert "Driver Not Loaded" in query_inventory(no_driver).reason
    assert len(query_inventory(no_driver)) == 0

    none = FakeNvml([])
    assert query_inventory(none).reason == "NVML found no GPU"
    assert none.shutdowns == 1

    partial = query_inventory(FakeNvml([_device(RTX3060, "a"), _device(RTX3060, "b")], broken=(0,)))
    assert partial.ids() == (1,)
    assert "GPU 0 left out: GPU is lost" in partial.reason


# --- GpuInventory -----------------------------------------------------------------------


def test_inventory_helpers():
    inventory = GpuInventory((gpu(1, RTX3080), gpu(0, RTX3060), gpu(2, RTX3080)))
    assert inventory.ids() == (0, 1, 2)  # sorted by index
    assert inventory.models() == {RTX3060: (0,), RTX3080: (1, 2)}
    assert inventory.describe() == f"0:{RTX3060}, 1:{RTX3080}, 2:{RTX3080}"
    assert inventory.get(7) is None
    with pytest.raises(KeyError, match="no GPU 7"):
        inventory[7]
    with pytest.raises(ValueError, match="duplicate"):
        GpuInventory((gpu(0, RTX3060), gpu(0, RTX3080)))


# --- picking ----------------------------------------------------------------------------


def test_rank_by_load_orders_by_memory_then_utilisation_then_id():
    inventory = GpuInventory(
        (gpu(0, RTX3060, used_gib=3), gpu(1, RTX3060, used_gib=1, util=50), gpu(2, RTX3060, 1))
    )
    assert [g.index for g in rank_by_load(inventory)] == [2, 1, 0]
    # Planned load counts as used memory.
    assert rank_by_load(inventory, {2: 0.5})[0].index == 1


def test_count_one_picks_the_least_loaded_gpu_across_models():
    mixed = GpuInventory((gpu(0, RTX3060, used_gib=4), gpu(1, RTX3080, used_gib=2)))
    assert pick_identical(mixed, 1) == (1,)
    # Equal memory: utilisation decides.
    even = GpuInventory((gpu(0, RTX3060, util=90), gpu(1, RTX3080, util=5)))
    assert pick_identical(even, 1) == (1,)


def test_count_two_on_mixed_pair_is_refused_naming_models():
    mixed = GpuInventory((gpu(0, RTX3060), gpu(1, RTX3080)))
    with pytest.raises(ConfigError) as err:
        pick_identical(mixed, 2)
    msg = str(err.value)
    assert "no 2 identical GPUs" in msg
    assert f"1 x {RTX3060} (ids [0])" in msg and f"1 x {RTX3080} (ids [1])" in msg


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        ({0: 6, 1: 5, 2: 1, 3: 2}, (2, 3)),  # the 3080 pair is less loaded
        ({0: 1, 1: 0, 2: 0, 3: 8}, (0, 1)),  # one busy 3080 makes the 3060 pair win
    ],
)
def test_count_two_picks_the_less_loaded_identical_pair(used, expected):
    inventory = GpuInventory(
        (
            gpu(0, RTX3060, used_gib=used[0]),
            gpu(1, RTX3060, used_gib=used[1]),
            gpu(2, RTX3080, used_gib=used[2]),
            gpu(3, RTX3080, used_gib=used[3]),
        )
    )
    assert pick_identical(inventory, 2) == expected


def test_pick_takes_least_loaded_members_within_a_model():
    inventory = GpuInventory(tuple(gpu(i, RTX3080, used_gib=u) for i, u in enumerate([5, 0, 3, 1])))
    assert pick_identical(inventory, 2) == (1, 3)
    assert pick_identical(inventory, 2, extra_load={1: 0.9}) == (2, 3)


def test_pick_from_empty_or_zero_is_refused():
    with pytest.raises(ConfigError, match="no 1 identical GPUs"):
        pick_identical(GpuInventory((), "NVML found no GPU"), 1)
    with pytest.raises(ConfigError, match="at least 1"):
        pick_identical(GpuInventory((gpu(0, RTX3060),)), 0)


def test_query_inventory_reads_the_driver_and_its_cuda_version(tmp_path):
    import importlib.util

    from tests.fake_nvidia import write_fake_pynvml

    folder = write_fake_pynvml(tmp_path, gpus=[(RTX3080, 12)], driver="535.104.05", cuda=12020)
    spec = importlib.util.spec_from_file_location("fake_pynvml", folder / "pynvml.py")
    nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvml)
    inventory = query_inventory(nvml)
    assert (inventory.driver_version, inventory.cuda_driver_version) == ("535.104.05", 12020)
    assert inventory.describe() == f"0:{RTX3080}"
    # An NVML without those calls (older nvidia-ml-py, the fake above) leaves them unknown.
    old = query_inventory(FakeNvml([_device(RTX3080, "a")]))
    assert (old.driver_version, old.cuda_driver_version) == ("", 0)


class _Process:
    def __init__(self, pid, mib):
        self.pid = pid
        self.usedGpuMemory = None if mib is None else int(mib * 2**20)  # pynvml's name


class FakeNvmlProcesses(FakeNvml):
    """FakeNvml with NVML's two process lists per GPU: {index: (compute, graphics)}."""

    def __init__(self, devices, lists):
        super().__init__(devices)
        self.lists = lists

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802 - pynvml's names
        return [_Process(pid, mib) for pid, mib in self.lists[handle][0]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):  # noqa: N802 - pynvml's names
        if self.lists[handle][1] is None:
            raise _NvmlError("Not Supported")
        return [_Process(pid, mib) for pid, mib in self.lists[handle][1]]


def test_a_process_with_compute_and_graphics_contexts_counts_once_per_gpu():
    # pid 7: an actor stepping JAX and rendering through EGL on GPU 0 (nvidia-smi's C+G: one
    # figure, in both of NVML's lists), and JAX on GPU 1; pid 8: an evaluator rendering only;
    # pid 9: a process whose amount the driver hides; GPU 1 has no graphics list.
    devices = [_device(RTX3060, "00000000:01:00.0"), _device(RTX3080, "00000000:02:00.0")]
    lists = {
        0: ([(7, 1387.5), (9, None)], [(7, 1387.5), (8, 77.0)]),
        1: ([(7, 500.0)], None),
    }
    nvml = FakeNvmlProcesses(devices, lists)
    assert gpu_memory_by_pid(nvml) == {7: 1887.5, 8: 77.0, 9: 0.0}
    assert process_memory_on_gpu(nvml, 0) == {7: 1387.5, 8: 77.0, 9: None}
    assert nvml.shutdowns == 1
