"""prepare_node_process: the per-node settings environment variables cannot make."""

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from magi_lp.placement.resources import ResourceSpec, spec_to_env
from magi_lp.runtime import node_setup

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
    return config


def test_prepare_node_process_hides_gpus_from_tf_when_told(monkeypatch):
    config = _fake_tf(monkeypatch)
    monkeypatch.setenv("MAGI_LP_TF_GPU", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert node_setup.prepare_node_process() is True
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
    assert node_setup.prepare_node_process() is False
    assert config.calls == []


def test_prepare_node_process_tolerates_initialised_tf(monkeypatch, caplog):
    _fake_tf(
        monkeypatch, RuntimeError("Visible devices cannot be modified after being initialized")
    )
    monkeypatch.setenv("MAGI_LP_TF_GPU", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with caplog.at_level(logging.WARNING, logger="magi_lp.runtime.node_setup"):
        assert node_setup.prepare_node_process() is False
    assert "already initialised" in caplog.text


def test_prepare_node_process_with_real_tf_in_node_envs():
    """A CPU node must not pay for importing TF; a GPU node gets TF's GPU list emptied."""
    code = (
        "import sys; from magi_lp.runtime.node_setup import prepare_node_process; "
        "hid = prepare_node_process(); imported = 'tensorflow' in sys.modules; "
        "gpus = __import__('tensorflow').config.get_visible_devices('GPU') if hid else None; "
        "print(hid, imported, gpus)"
    )
    cpu_env = {**os.environ, **spec_to_env(ResourceSpec(device="cpu"), ())}
    gpu_env = {**os.environ, **spec_to_env(ResourceSpec(device="gpu"), (0,))}
    results = []
    for env in (cpu_env, gpu_env):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO_ROOT,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        results.append(out.stdout.strip().splitlines()[-1])
    assert results == ["False False None", "True True []"]
