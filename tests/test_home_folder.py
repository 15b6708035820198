"""Nothing of a run goes to the home folder: TensorFlow's Keras, imported by every Launchpad
node, makes `~/.keras` unless KERAS_HOME points elsewhere, and the venv's set-up points it
inside the venv (scripts/setup_venv.sh)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.integration  # imports TensorFlow in a fresh interpreter (~5 s)
def test_importing_tensorflow_writes_nothing_in_home(tmp_path):
    pytest.importorskip("tensorflow", reason="TensorFlow is the Launchpad stack's (.venv)")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env["HOME"] = str(tmp_path)
    subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, check=True)
    assert not list(tmp_path.iterdir()), f"written in HOME: {list(tmp_path.rglob('*'))}"


def test_plotting_writes_nothing_in_home(tmp_path):
    """matplotlib (the curves of a run, the benchmark figures) makes ~/.cache/matplotlib and
    ~/.config/matplotlib unless MPLCONFIGDIR points elsewhere; the venv's set-up points it
    inside the venv, as KERAS_HOME."""
    pytest.importorskip("matplotlib", reason="matplotlib is the Launchpad stack's (.venv)")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path / "home")
    plot = (
        "import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; "
        "plt.plot([0, 1]); plt.savefig(sys.argv[1])"
    )
    png = tmp_path / "curve.png"
    subprocess.run([sys.executable, "-c", plot, str(png)], env=env, check=True, timeout=120)
    assert png.stat().st_size > 0
    written = list((tmp_path / "home").rglob("*"))
    assert not written, f"written in HOME: {written}"
