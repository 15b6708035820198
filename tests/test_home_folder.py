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
    written = _written_in_home(
        tmp_path, ["-c", plot, str(png)], unset=("MPLCONFIGDIR", "XDG_CACHE_HOME")
    )
    assert png.stat().st_size > 0
    assert not written, f"written in HOME: {written}"


def _written_in_home(tmp_path, args: list[str], unset: tuple[str, ...]) -> list:
    """What this venv's Python, run with `args`, HOME in a temp folder and `unset` removed
    from its environment, wrote in that HOME."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["HOME"] = str(home)
    subprocess.run([sys.executable, *args], env=env, check=True, timeout=300)
    return list(home.rglob("*"))
