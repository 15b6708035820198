"""Nothing of a run goes to the home folder: TensorFlow's Keras, imported by every Launchpad
node, makes `~/.keras` unless KERAS_HOME points elsewhere, matplotlib its caches, Mesa its
shader cache, the NVIDIA driver its compute and shader caches; the venv's set-up points each
inside the venv (scripts/write_home_pth.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.integration  # imports TensorFlow in a fresh interpreter (~5 s)
def test_importing_tensorflow_writes_nothing_in_home(tmp_path):
    pytest.importorskip("tensorflow", reason="TensorFlow is the Launchpad stack's (.venv)")
    written = _written_in_home(tmp_path, ["-c", "import tensorflow"], unset=("KERAS_HOME",))
    assert not written, f"written in HOME: {written}"


def test_plotting_writes_nothing_in_home(tmp_path):
    """matplotlib (the curves of a run, the benchmark figures) makes ~/.cache/matplotlib and
    ~/.config/matplotlib unless MPLCONFIGDIR points elsewhere; the venv's set-up points it
    inside the venv, as KERAS_HOME."""
    pytest.importorskip("matplotlib", reason="matplotlib is the Launchpad stack's (.venv)")
    plot = (
        "import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; "
        "plt.plot([0, 1]); plt.savefig(sys.argv[1])"
    )
    png = tmp_path / "curve.png"
    written = _written_in_home(tmp_path, ["-c", plot, str(png)], unset=("MPLCONFIGDIR",))
    assert png.stat().st_size > 0
    assert not written, f"written in HOME: {written}"


@pytest.mark.integration  # renders a frame in a fresh interpreter (~5 s)
def test_rendering_writes_nothing_in_home(tmp_path):
    """Mesa's EGL (how MuJoCo renders without a GPU) keeps its shader cache in
    $XDG_CACHE_HOME/mesa_shader_cache, else under the home folder of the password database,
    whatever $HOME says; the venv's set-up points MESA_SHADER_CACHE_DIR inside the venv."""
    render = (
        "from dm_control import suite; env = suite.load('cartpole', 'balance'); env.reset(); "
        "assert env.physics.render(84, 84, camera_id=0).shape == (84, 84, 3)"
    )
    gl = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    written = _written_in_home(tmp_path, ["-c", render], unset=("MESA_SHADER_CACHE_DIR",), extra=gl)
    assert not written, f"written in HOME: {written}"


CACHES = ("KERAS_HOME", "MPLCONFIGDIR", "MESA_SHADER_CACHE_DIR", "CUDA_CACHE_PATH",
          "__GL_SHADER_DISK_CACHE_PATH")  # fmt: skip


def test_every_cache_a_library_would_make_in_home_points_inside_the_venv():
    """The venv's Python starts with each of them inside the venv, and a user's own value
    wins (the NVIDIA ones act only on a GPU machine: test_gpu_compute_writes_nothing_in_home)."""
    show = [sys.executable, "-c", "import os, json, sys; "
            "print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))", *CACHES]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in CACHES}
    found = json.loads(subprocess.run(show, env=env, check=True,
                                      capture_output=True, text=True).stdout)  # fmt: skip
    for name in CACHES:
        assert found[name] and found[name].startswith(sys.prefix + os.sep), (name, found)
    env["CUDA_CACHE_PATH"] = "/somewhere/else"
    mine = json.loads(subprocess.run(show, env=env, check=True,
                                     capture_output=True, text=True).stdout)  # fmt: skip
    assert mine["CUDA_CACHE_PATH"] == "/somewhere/else"


@pytest.mark.integration  # compiles on the GPU in a fresh interpreter
def test_gpu_compute_writes_nothing_in_home(tmp_path):
    """The NVIDIA driver keeps the kernels it compiles from PTX in ~/.nv/ComputeCache unless
    CUDA_CACHE_PATH says otherwise (seen on an H200 with a jitted JAX function)."""
    jax = pytest.importorskip("jax")
    if not any(device.platform == "gpu" for device in jax.devices()):
        pytest.skip("no GPU here: the driver's caches are a GPU machine's")
    compute = (
        "import jax, jax.numpy as jnp; "
        "print(jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((64, 64))).sum())"
    )
    written = _written_in_home(tmp_path, ["-c", compute], unset=("CUDA_CACHE_PATH",))
    assert not written, f"written in HOME: {written}"


def _written_in_home(
    tmp_path, args: list[str], unset: tuple[str, ...], extra: dict[str, str] | None = None
) -> list:
    """What this venv's Python, run with `args`, HOME in a temp folder (and the XDG folders
    under it, which some libraries read instead of HOME), `unset` removed from its environment
    and `extra` added, wrote in that HOME."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["HOME"] = str(home)
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    env["XDG_DATA_HOME"] = str(home / ".local" / "share")
    env.update(extra or {})
    subprocess.run([sys.executable, *args], env=env, check=True, timeout=300)
    return sorted(str(path.relative_to(home)) for path in home.rglob("*"))
