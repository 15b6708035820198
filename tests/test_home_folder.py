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
