"""prepare_node_process: the per-node settings environment variables cannot make."""

import logging
import os
import sys
import types
from pathlib import Path

import pytest

from magi_lp.placement.jax_build import detect_jax_build
from magi_lp.placement.resources import ResourceSpec, spec_to_env
from magi_lp.runtime import node_devices
from tests.e2e_utils import run_python

REPO_ROOT = Path(__file__).resolve().parents[1]


class _FakeTfConfig:
    def __init__(self, error=None):
        self.calls = []
        self.error = error

    def set_visible_devices(self, devices, device_type):
        if self.error:
            raise self.error
        self.calls.append((devices, device_type))


def _fake_tf(monkeypatch, error=None):
    config = _FakeTfConfig(error)
    monkeypatch.setitem(sys.modules, "tensorflow", types.SimpleNamespace(config=config))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # these tests are about TF only
    return config


def test_prepare_node_process_hides_gpus_from_tf_when_told(monkeypatch):
    config = _fake_tf(monkeypatch)
    monkeypatch.setenv("MAGI_LP_TF_GPU", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert node_devices.prepare_node_process() is True
    assert config.calls == [([], "GPU")]


@pytest.mark.parametrize(
    ("tf_gpu", "visible"), [("1", "0"), ("0", ""), (None, "0")], ids=["tf_gpu", "cpu", "unset"]
)
def test_prepare_node_process_leaves_tf_alone_otherwise(monkeypatch, tf_gpu, visible):
    config = _fake_tf(monkeypatch)
    if tf_gpu is None:
        monkeypatch.delenv("MAGI_LP_TF_GPU", raising=False)
    else:
        monkeypatch.setenv("MAGI_LP_TF_GPU", tf_gpu)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert node_devices.prepare_node_process() is False
    assert config.calls == []


def test_prepare_node_process_tolerates_initialised_tf(monkeypatch, caplog):
    _fake_tf(
        monkeypatch, RuntimeError("Visible devices cannot be modified after being initialized")
    )
    monkeypatch.setenv("MAGI_LP_TF_GPU", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with caplog.at_level(logging.WARNING, logger="magi_lp.runtime.node_devices"):
        assert node_devices.prepare_node_process() is False
    assert "already initialised" in caplog.text


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_prepare_node_process_with_real_tf_in_node_envs():
    """A CPU node must not pay for importing TF; a GPU node gets TF's GPU list emptied.

    The GPU node's JAX is kept on the CPU here (this machine has no CUDA JAX); what JAX does
    with JAX_PLATFORMS=cuda is the next test's subject.
    """
    code = (
        "import sys; from magi_lp.runtime.node_devices import prepare_node_process; "
        "hid = prepare_node_process(); imported = 'tensorflow' in sys.modules; "
        "gpus = __import__('tensorflow').config.get_visible_devices('GPU') if hid else None; "
        "print(hid, imported, gpus)"
    )
    cpu_env = {**os.environ, **spec_to_env(ResourceSpec(device="cpu"), ())}
    gpu_env = {**os.environ, **spec_to_env(ResourceSpec(device="gpu"), (0,))}
    gpu_env["JAX_PLATFORMS"] = "cpu"
    results = []
    for env in (cpu_env, gpu_env):
        out = run_python(code, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        results.append(out.stdout.strip().splitlines()[-1])
    assert results == ["False False None", "True True []"]


@pytest.mark.integration  # a Python process of its own that imports a framework
@pytest.mark.skipif(detect_jax_build().serves_cuda, reason="this Python has CUDA JAX")
def test_gpu_node_without_cuda_jax_fails_at_once_saying_why():
    """The plan's GPU env on this machine (no CUDA plugin): the real node set-up, real JAX."""
    gpu_env = {**os.environ, **spec_to_env(ResourceSpec(device="gpu"), (0,))}
    gpu_env["MAGI_LP_TF_GPU"] = "1"  # keep TF out of it: the check is about JAX
    code = "from magi_lp.runtime.node_devices import prepare_node_process; prepare_node_process()"
    out = run_python(code, env=gpu_env)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("magi_lp.runtime.node_devices.CudaBackendError: this node cannot start")
    assert "JAX's CUDA plugin is not installed in this Python" in last
    assert "make setup JAX=cuda12" in last
    assert "JAX said: Unable to initialize backend 'cuda'" in last


class _FakeJax(types.ModuleType):
    def __init__(self, error=None):
        super().__init__("jax")
        self.error = error

    def devices(self):
        if self.error:
            raise self.error
        return ["cuda:0"]

    def default_backend(self):
        return "gpu"


def test_check_jax_backend_is_a_no_op_without_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", _FakeJax(RuntimeError("must not be called")))
    for platforms in ("cpu", "", None):
        env = {} if platforms is None else {"JAX_PLATFORMS": platforms}
        assert node_devices.check_jax_backend(env) is None


def test_check_jax_backend_passes_when_cuda_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", _FakeJax())
    assert node_devices.check_jax_backend({"JAX_PLATFORMS": "cuda,cpu"}) == "gpu"


def test_check_jax_backend_names_an_old_driver(monkeypatch):
    """With a CUDA plugin and an NVML that reports a CUDA 11 driver (faked: no GPU here)."""
    from magi_lp.placement import gpu_inventory, jax_build

    cuda12 = jax_build.JaxBuild(
        "0.4.30", (jax_build.CudaPlugin("jax_plugins.xla_cuda12", 12, "0.4.30"),)
    )
    gpu = gpu_inventory.GpuInfo(0, "0:1", "Tesla T4", 16 * 1024**3, 0, 0.0)
    old = gpu_inventory.GpuInventory((gpu,), "", "470.82.01", 11040)
    monkeypatch.setattr(jax_build, "detect_jax_build", lambda: cuda12)
    monkeypatch.setattr(gpu_inventory, "query_inventory", lambda: old)
    empty = RuntimeError("Unable to initialize backend 'cuda': ")
    monkeypatch.setitem(sys.modules, "jax", _FakeJax(empty))
    with pytest.raises(node_devices.CudaBackendError) as err:
        node_devices.check_jax_backend({"JAX_PLATFORMS": "cuda,cpu", "CUDA_VISIBLE_DEVICES": "0"})
    msg = str(err.value)
    assert "driver 470.82.01 supports CUDA 11.4, older than the CUDA 12" in msg
    assert msg.endswith("JAX said: Unable to initialize backend 'cuda':")
    assert err.value.__cause__ is empty
